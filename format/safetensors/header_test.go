package safetensors_test

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/format/safetensors"
)

// rawFile builds safetensors bytes from a header string and a data length.
func rawFile(header string, data int) []byte {
	b := make([]byte, 8, 8+len(header)+data)
	binary.LittleEndian.PutUint64(b, uint64(len(header)))
	b = append(b, header...)
	return append(b, make([]byte, data)...)
}

func TestParseHeader(t *testing.T) {
	good := `{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"b":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]}}`
	h, err := safetensors.ParseHeader(rawFile(good, 32), int64(len(rawFile(good, 32))))
	require.NoError(t, err)
	require.Len(t, h.Tensors, 2)
	require.Equal(t, "pt", h.Metadata["format"])
	require.Equal(t, int64(8+len(good)), h.DataBase)

	tests := []struct {
		name   string
		header string
		data   int
		err    string
	}{
		{"offsets past the end", `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, 4, `tensor "a": data_offsets [0, 8] out of bounds of the 4-byte data section`},
		{"reversed offsets", `{"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}}`, 4, `tensor "a": data_offsets [4, 0] out of bounds`},
		{"negative offset", `{"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}}`, 4, `out of bounds`},
		{"shape does not match bytes", `{"w":{"dtype":"BF16","shape":[3,3],"data_offsets":[0,16]}}`, 16, `tensor "w": shape [3 3] of BF16 needs 18 bytes, data_offsets [0, 16] hold 16`},
		{"overlap", `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, 12, `tensors "a" and "b" overlap`},
		{"duplicate name", `{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, 8, `header names "a" twice`},
		{"unknown dtype", `{"a":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}}`, 4, `tensor "a": unknown dtype "F33"`},
		{"negative dim", `{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}`, 4, `negative dimension`},
		{"huge shape", `{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}}`, 4, `is too large`},
		{"missing field", `{"a":{"dtype":"F32","shape":[1]}}`, 4, `entry needs dtype, shape and data_offsets`},
		{"three offsets", `{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}`, 8, `data_offsets has 3 values`},
		{"not an object", `[1,2]`, 0, `header is not a JSON object`},
		{"trailing data", `{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}} {}`, 4, `data after its JSON object`},
		{"truncated JSON", `{"a":{"dtype":"F32"`, 0, `tensor "a": bad entry`},
		{"bad metadata", `{"__metadata__":{"x":1}}`, 0, `__metadata__ is not a string map`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := rawFile(tt.header, tt.data)
			_, err := safetensors.ParseHeader(b, int64(len(b)))
			require.ErrorContains(t, err, tt.err)
		})
	}

	_, err = safetensors.ParseHeader([]byte{1, 2, 3}, 3)
	require.ErrorContains(t, err, "too short")
	b := rawFile(good, 32)
	binary.LittleEndian.PutUint64(b, 1<<40)
	_, err = safetensors.ParseHeader(b, int64(len(b)))
	require.ErrorContains(t, err, "exceeds")
	binary.LittleEndian.PutUint64(b, uint64(len(b)))
	_, err = safetensors.ParseHeader(b, int64(len(b)))
	require.ErrorContains(t, err, "runs past the end")
}

// FuzzParseHeader: any bytes give a header or an error, never a panic, and a
// header that parses describes tensors inside the file that do not overlap.
func FuzzParseHeader(f *testing.F) {
	f.Add(rawFile(`{"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}`, 24))
	f.Add(rawFile(`{"__metadata__":{"k":"v"},"a":{"dtype":"BF16","shape":[],"data_offsets":[0,2]},"b":{"dtype":"I8","shape":[0],"data_offsets":[2,2]}}`, 2))
	f.Add(rawFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}}`, 6))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := safetensors.ParseHeader(data, int64(len(data)))
		if err != nil {
			return
		}
		dataLen := int64(len(data)) - h.DataBase
		require.GreaterOrEqual(t, dataLen, int64(0))
		for name, ti := range h.Tensors {
			require.True(t, 0 <= ti.Begin && ti.Begin <= ti.End && ti.End <= dataLen, "tensor %q out of bounds", name)
		}
	})
}
