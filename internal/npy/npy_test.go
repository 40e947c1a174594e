package npy

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"codeberg.org/sbinet/npyio"
	"github.com/stretchr/testify/require"
)

func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name  string
		shape []int
	}{
		{"matrix", []int{3, 4}},
		{"empty rows keep their width", []int{0, 7}},
		{"vector", []int{5}},
		{"3-d", []int{2, 3, 2}},
		{"scalar", []int{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := 1
			for _, d := range tt.shape {
				n *= d
			}
			f := make([]float32, n)
			i := make([]int32, n)
			for k := range f {
				f[k] = float32(k) * 0.5
				i[k] = int32(k) - 3
			}
			fp := filepath.Join(dir, tt.name+"f.npy")
			ip := filepath.Join(dir, tt.name+"i.npy")
			require.NoError(t, WriteFloat32(fp, tt.shape, f))
			require.NoError(t, WriteInt32(ip, tt.shape, i))
			gf, err := ReadFloat32(fp)
			require.NoError(t, err)
			require.Equal(t, tt.shape, append([]int{}, gf.Shape...))
			require.Equal(t, f, gf.Data)
			gi, err := ReadInt32(ip)
			require.NoError(t, err)
			require.Equal(t, i, gi.Data)

			raw, err := os.ReadFile(fp)
			require.NoError(t, err)
			require.Zero(t, (int(raw[8])|int(raw[9])<<8+10)%64, "header must be padded to 64 bytes")
		})
	}
}

// TestReadsNpyioFiles reads what another writer produced.
func TestReadsNpyioFiles(t *testing.T) {
	p := filepath.Join(t.TempDir(), "a.npy")
	var buf bytes.Buffer
	require.NoError(t, npyio.Write(&buf, []float32{1, 2, 3}))
	require.NoError(t, os.WriteFile(p, buf.Bytes(), 0o644))
	a, err := ReadFloat32(p)
	require.NoError(t, err)
	require.Equal(t, []int{3}, a.Shape)
	require.Equal(t, []float32{1, 2, 3}, a.Data)
}

func TestFortranOrder(t *testing.T) {
	// [[1,2,3],[4,5,6]] stored column by column.
	var buf bytes.Buffer
	require.NoError(t, Encode(&buf, "<f4", []int{2, 3}, []float32{1, 4, 2, 5, 3, 6}))
	raw := buf.Bytes()
	i := bytes.Index(raw, []byte("False, "))
	require.Positive(t, i)
	// numpy's own spelling, same length: shift the rest of the dict left one byte and pad.
	copy(raw[i:], "True, ")
	j := bytes.IndexByte(raw, '\n')
	copy(raw[i+6:j], raw[i+7:j])
	raw[j-1] = ' '
	p := filepath.Join(t.TempDir(), "f.npy")
	require.NoError(t, os.WriteFile(p, raw, 0o644))
	a, err := ReadFloat32(p)
	require.NoError(t, err)
	require.Equal(t, []float32{1, 2, 3, 4, 5, 6}, a.Data)
}

func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	f64 := filepath.Join(dir, "f64.npy")
	var buf bytes.Buffer
	require.NoError(t, npyio.Write(&buf, []float64{1, 2}))
	require.NoError(t, os.WriteFile(f64, buf.Bytes(), 0o644))
	_, err := ReadFloat32(f64)
	require.ErrorContains(t, err, "dtype <f8, want float32")

	junk := filepath.Join(dir, "junk.npy")
	require.NoError(t, os.WriteFile(junk, []byte("hello"), 0o644))
	_, err = ReadFloat32(junk)
	require.ErrorContains(t, err, "not a .npy file")

	_, err = ReadInt32(filepath.Join(dir, "missing.npy"))
	require.Error(t, err)

	require.ErrorContains(t, WriteFloat32(filepath.Join(dir, "x.npy"), []int{2, 2}, []float32{1}), "needs 4 values")
}
