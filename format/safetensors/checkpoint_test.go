package safetensors_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/format/safetensors"
	"github.com/moex-project/moex/internal/stwrite"
)

// TestUnalignedTensorData: tensors at offsets misaligned for their dtype
// are read correctly (copied once).
func TestUnalignedTensorData(t *testing.T) {
	vals := []float32{1.5, -2, 3.25, 4}
	var data []byte
	data = append(data, 7) // one byte of something else first
	for _, v := range vals {
		b, err := stwrite.Encode("F32", []float32{v})
		require.NoError(t, err)
		data = append(data, b...)
	}
	hdr := `{"pad":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"w":{"dtype":"F32","shape":[2,2],"data_offsets":[1,17]}}`
	raw := append(rawFile(hdr, 0), data...)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "model.safetensors"), raw, 0o644))
	ck, err := safetensors.Open(dir, nil)
	require.NoError(t, err)
	defer ck.Close()
	w, err := ck.Matrix("w", 2, 2)
	require.NoError(t, err)
	require.Equal(t, []float32{1.5, -2, 3.25, 4}, []float32{w.At(0, 0), w.At(0, 1), w.At(1, 0), w.At(1, 1)})
}
