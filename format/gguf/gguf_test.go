package gguf

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/format"
	"github.com/moex-project/moex/internal/moetest"
)

// ggufSample is a file of every metadata value type (a nested array too)
// and tensors of several ggml types, as moetest.WriteGGUF writes it.
func kv(key string, value any) moetest.GGUFKV { return moetest.GGUFKV{Key: key, Value: value} }

func ggufSample(t testing.TB, alignment uint64) []byte {
	kvs := []moetest.GGUFKV{
		kv("general.architecture", "deepseek2"), kv("a.u8", uint8(200)), kv("a.i8", int8(-5)), kv("a.u16", uint16(60000)),
		kv("a.i16", int16(-30000)), kv("a.u32", uint32(4000000000)), kv("a.i32", int32(-2000000000)), kv("a.f32", float32(0.5)),
		kv("a.bool", true), kv("a.u64", uint64(1)<<63), kv("a.i64", int64(-1)<<62), kv("a.f64", math.Pi),
		kv("tokenizer.ggml.tokens", moetest.GGUFArray{Elem: 8, Values: []any{"a", "bc", ""}}),
		kv("a.nested", moetest.GGUFArray{Elem: 9, Values: []any{moetest.GGUFArray{Elem: 5, Values: []any{int32(1), int32(-2)}}}}),
	}
	tensors := []moetest.GGUFTensor{
		{Name: "blk.0.ffn_gate_inp.weight", Dims: []uint64{4, 2}, Type: 0, Data: moetest.F32Bytes([]float32{1, 2, 3, 4, 5, 6, 7, 8})},
		{Name: "blk.0.ffn_up_exps.weight", Dims: []uint64{64, 3, 2}, Type: 8, Data: bytes.Repeat([]byte{7}, 2*3*2*34)},
		{Name: "blk.0.ffn_down_exps.weight", Dims: []uint64{256, 1, 2}, Type: 12, Data: bytes.Repeat([]byte{9}, 2*144)},
		{Name: "output_norm.weight", Dims: []uint64{3}, Type: 30, Data: []byte{1, 2, 3, 4, 5, 6}},
	}
	var b bytes.Buffer
	require.NoError(t, moetest.WriteGGUF(&b, kvs, tensors, alignment))
	return b.Bytes()
}

// TestParse reads every value type back, and finds every tensor's
// bytes where the writer put them.
func TestParse(t *testing.T) {
	for _, align := range []uint64{32, 64} {
		data := ggufSample(t, align)
		g, err := Parse(data, uint64(len(data)))
		require.NoError(t, err)
		require.Equal(t, uint32(3), g.Version)
		require.Equal(t, align, g.Alignment)
		require.Zero(t, g.DataOffset%align)
		md := g.Metadata
		require.Equal(t, "deepseek2", md["general.architecture"].Str)
		require.Equal(t, uint64(200), md["a.u8"].Uint)
		require.Equal(t, int64(-5), md["a.i8"].Int)
		require.Equal(t, uint64(60000), md["a.u16"].Uint)
		require.Equal(t, int64(-30000), md["a.i16"].Int)
		require.Equal(t, uint64(4000000000), md["a.u32"].Uint)
		require.Equal(t, int64(-2000000000), md["a.i32"].Int)
		require.Equal(t, 0.5, md["a.f32"].Float)
		require.True(t, md["a.bool"].Bool)
		require.Equal(t, uint64(1)<<63, md["a.u64"].Uint)
		_, ok := md["a.u64"].AsInt()
		require.False(t, ok, "2^63 is no int64")
		require.Equal(t, int64(-1)<<62, md["a.i64"].Int)
		require.Equal(t, math.Pi, md["a.f64"].Float)
		toks := md["tokenizer.ggml.tokens"]
		require.Equal(t, String, toks.Elem)
		require.Equal(t, []string{"a", "bc", ""}, []string{toks.Array[0].Str, toks.Array[1].Str, toks.Array[2].Str})
		require.Equal(t, int64(-2), md["a.nested"].Array[0].Array[1].Int)
		require.Equal(t, "a.u8", g.Keys[1])

		require.Equal(t, []string{"blk.0.ffn_gate_inp.weight", "blk.0.ffn_up_exps.weight", "blk.0.ffn_down_exps.weight",
			"output_norm.weight"}, g.Names)
		up := g.Tensors["blk.0.ffn_up_exps.weight"]
		require.Equal(t, Q8_0, up.Type)
		require.Equal(t, []uint64{64, 3, 2}, up.Dims)
		require.Equal(t, uint64(384), up.Elements())
		require.Equal(t, uint64(2*3*2*34), up.Size)
		require.Equal(t, bytes.Repeat([]byte{7}, int(up.Size)), data[up.Offset:up.Offset+up.Size])
		gate := g.Tensors["blk.0.ffn_gate_inp.weight"]
		require.Equal(t, moetest.F32Bytes([]float32{1, 2, 3, 4, 5, 6, 7, 8}), data[gate.Offset:gate.Offset+gate.Size])
		down := g.Tensors["blk.0.ffn_down_exps.weight"]
		require.Equal(t, "Q4_K", down.Type.String())
		require.Equal(t, uint64(2*144), down.Size)
		norm := g.Tensors["output_norm.weight"]
		require.Equal(t, []byte{1, 2, 3, 4, 5, 6}, data[norm.Offset:norm.Offset+norm.Size])
		for _, name := range g.Names {
			require.Zero(t, g.Tensors[name].Offset%align, name)
		}
	}
}

// bytesOf is n uint8 array values.
func bytesOf(n int) []any {
	v := make([]any, n)
	for i := range v {
		v[i] = uint8(i)
	}
	return v
}

// TestParseByHand: a file laid out byte by byte from the
// specification, not by the test writer.
func TestParseByHand(t *testing.T) {
	var b bytes.Buffer
	le := func(v any) { require.NoError(t, binary.Write(&b, binary.LittleEndian, v)) }
	b.WriteString("GGUF")
	le(uint32(2))                        // version 2: the same layout as 3
	le(uint64(1))                        // one tensor
	le(uint64(1))                        // one key/value
	le(uint64(len("general.name")))      // key
	b.WriteString("general.name")        //
	le(uint32(8))                        // a string
	le(uint64(3))                        //
	b.WriteString("moe")                 //
	le(uint64(1))                        // tensor name "w"
	b.WriteString("w")                   //
	le(uint32(2))                        // two dimensions
	le(uint64(2))                        // ne0
	le(uint64(1))                        // ne1
	le(uint32(1))                        // F16
	le(uint64(0))                        // offset
	b.Write(make([]byte, 32-b.Len()%32)) // padding to 32
	start := b.Len()                     //
	le([]uint16{0x3c00, 0xc000})         // 1.0, -2.0 in f16
	data := b.Bytes()
	g, err := Parse(data, uint64(len(data)))
	require.NoError(t, err)
	require.Equal(t, uint32(2), g.Version)
	require.Equal(t, "moe", g.Metadata["general.name"].Str)
	w := g.Tensors["w"]
	require.Equal(t, uint64(start), w.Offset)
	require.Equal(t, uint64(4), w.Size)
	require.Equal(t, F16, w.Type)
}

// TestParseBad: each malformed file is an ErrMalformed error naming its
// problem; no prefix of a good file parses or panics.
func TestParseBad(t *testing.T) {
	good := ggufSample(t, 32)
	g, err := Parse(good, uint64(len(good)))
	require.NoError(t, err)
	for n := range g.DataOffset {
		_, err := Parse(good[:n], n)
		require.ErrorIs(t, err, ErrMalformed, "prefix of %d bytes", n)
	}
	last := g.Tensors["output_norm.weight"]
	_, err = Parse(good[:last.Offset+last.Size-1], last.Offset+last.Size-1)
	require.ErrorContains(t, err, `tensor "output_norm.weight": 6 bytes at offset`)

	file := func(version uint32, kvs []moetest.GGUFKV, tensors []moetest.GGUFTensor) []byte {
		var b bytes.Buffer
		require.NoError(t, moetest.WriteGGUF(&b, kvs, tensors, 32))
		data := b.Bytes()
		binary.LittleEndian.PutUint32(data[4:], version)
		return data
	}
	f32 := func(name string, dims ...uint64) moetest.GGUFTensor {
		n := uint64(1)
		for _, d := range dims {
			n *= d
		}
		return moetest.GGUFTensor{Name: name, Dims: dims, Type: 0, Data: make([]byte, 4*n)}
	}
	patch := func(data []byte, old, new []byte) []byte {
		i := bytes.Index(data, old)
		require.GreaterOrEqual(t, i, 0)
		out := bytes.Clone(data)
		copy(out[i:], new)
		return out
	}
	u64 := func(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }
	u32 := func(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }
	name := func(s string) []byte { return append(u64(uint64(len(s))), s...) }
	withW := file(3, nil, []moetest.GGUFTensor{f32("w", 8, 2)})
	dims := func(d ...uint64) []byte { // w's info: name, dimension count, dimensions
		b := append(name("w"), u32(uint32(len(d)))...)
		for _, x := range d {
			b = append(b, u64(x)...)
		}
		return b
	}
	tail := func(typ uint32, off uint64) []byte { // w's info to its end: type and offset
		return append(append(dims(8, 2), u32(typ)...), u64(off)...)
	}
	at := func(data []byte, off int, new []byte) []byte {
		out := bytes.Clone(data)
		copy(out[off:], new)
		return out
	}

	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"magic", append([]byte("GGML"), good[4:]...), `not a GGUF file: it begins "GGML"`},
		{"version 1", file(1, nil, nil), "GGUF version 1 (32-bit counts) is not read"},
		{"big-endian", file(0x03000000, nil, nil), "big-endian GGUF file (version 3 byte-swapped)"},
		{"version 9", file(9, nil, nil), "GGUF version 9"},
		{"version 0", file(0, nil, nil), "GGUF version 0: versions 2 and 3"},
		{"values in all", file(3, []moetest.GGUFKV{kv("k.big", moetest.GGUFArray{Elem: 0, Values: bytesOf(1<<22 + 1)})}, nil),
			`metadata "k.big": more than 4194304 values`},
		{"key count", at(file(3, nil, nil), 16, u64(1<<40)), "1099511627776 metadata key/values in a file of 32 bytes"},
		{"tensor count", at(file(3, nil, nil), 8, u64(1<<40)), "1099511627776 tensor infos in a file of 32 bytes"},
		{"duplicate key", file(3, []moetest.GGUFKV{kv("k.a", uint8(1)), kv("k.a", uint8(2))}, nil), `metadata key "k.a" appears twice`},
		{"key not ASCII", file(3, []moetest.GGUFKV{kv("k.é", uint8(1))}, nil), `metadata key 0 "k.é": byte 2 is 0xc3`},
		{"empty key", file(3, []moetest.GGUFKV{kv("", uint8(1))}, nil), "an empty key"},
		{"bool 2", patch(file(3, []moetest.GGUFKV{kv("k.b", true)}, nil), []byte{7, 0, 0, 0, 1}, []byte{7, 0, 0, 0, 2}), `metadata "k.b": a bool of 2`},
		{"value type", patch(file(3, []moetest.GGUFKV{kv("k.t", uint8(1))}, nil), append(name("k.t"), u32(0)...), append(name("k.t"), u32(13)...)), `metadata "k.t": value type 13`},
		{"array elem type", patch(file(3, []moetest.GGUFKV{kv("k.arr", moetest.GGUFArray{Elem: 0, Values: []any{uint8(1)}})}, nil),
			append(u32(9), u32(0)...), append(u32(9), u32(77)...)), `"k.arr": an array of value type 77`},
		{"array length", patch(file(3, []moetest.GGUFKV{kv("k.arr", moetest.GGUFArray{Elem: 8, Values: []any{"x"}})}, nil),
			append(u32(8), u64(1)...), append(u32(8), u64(1<<50)...)), `"k.arr": 1125899906842624 string values in the`},
		{"string length", patch(file(3, []moetest.GGUFKV{kv("k.s", "abc")}, nil), name("abc"), append(u64(1<<62), "abc"...)),
			"the value of k.s: 4611686018427387904 bytes needed"},
		{"alignment 3", file(3, []moetest.GGUFKV{kv("general.alignment", uint32(3))}, nil), "general.alignment is uint32 3: it must be a positive power of two"},
		{"alignment string", file(3, []moetest.GGUFKV{kv("general.alignment", "32")}, nil), "general.alignment is string 32"},
		{"duplicate tensor", file(3, nil, []moetest.GGUFTensor{f32("w", 2), f32("w", 2)}), `tensor "w" appears twice`},
		{"name too long", file(3, nil, []moetest.GGUFTensor{f32(strings.Repeat("n", 64), 2)}), "is 64 bytes long: at most 63"},
		{"five dims", file(3, nil, []moetest.GGUFTensor{f32("w", 1, 1, 1, 1, 2)}), `tensor "w" has 5 dimensions: 1 to 4`},
		{"zero dim", patch(withW, dims(8, 2), dims(0, 2)), `tensor "w": dimension 0 is 0`},
		{"overflow", patch(withW, dims(8, 2), dims(1<<62, 2)), `tensor "w": dimensions [4611686018427387904 2] overflow a 64-bit count`},
		{"type 4", patch(withW, tail(0, 0), tail(4, 0)), `tensor "w": ggml type id 4 is not a type`},
		{"partial block", file(3, nil, []moetest.GGUFTensor{{Name: "q", Dims: []uint64{48}, Type: 8, Data: make([]byte, 34)}}),
			`tensor "q": its rows of 48 values are not whole Q8_0 blocks of 32`},
		{"offset misaligned", patch(withW, tail(0, 0), tail(0, 8)), `tensor "w": offset 8 is not a multiple of the alignment 32`},
		{"past the end", patch(withW, tail(0, 0), tail(0, 1<<20)), `tensor "w": 64 bytes at offset 1048576 run past`},
	}
	for _, c := range cases {
		_, err := Parse(c.data, uint64(len(c.data)))
		require.ErrorIs(t, err, ErrMalformed, c.name)
		require.ErrorContains(t, err, c.want, c.name)
	}
	_, err = Parse(withW, uint64(len(withW)))
	require.NoError(t, err, "the file the patches start from is good")
}

// FuzzParse: no input panics, and a file that parses has every
// tensor within it, at a multiple of its alignment.
func FuzzParse(f *testing.F) {
	f.Add(ggufSample(f, 32))
	f.Add(ggufSample(f, 64))
	f.Add([]byte("GGUF\x03\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		g, err := Parse(data, uint64(len(data)))
		if err != nil {
			require.ErrorIs(t, err, ErrMalformed)
			return
		}
		for _, name := range g.Names {
			tn := g.Tensors[name]
			require.LessOrEqual(t, tn.Offset+tn.Size, uint64(len(data)), name)
			require.GreaterOrEqual(t, tn.Offset, g.DataOffset, name)
			require.Zero(t, (tn.Offset-g.DataOffset)%g.Alignment, name)
		}
	})
}

// TestOpen maps a written file and reads its tensors' bytes; a missing
// tensor, a closed file, a short or malformed file, a directory: errors
// naming them.
func TestOpen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.gguf")
	data := ggufSample(t, 64)
	require.NoError(t, os.WriteFile(path, data, 0o644))
	f, err := Open(path)
	require.NoError(t, err)
	b, err := f.TensorData("blk.0.ffn_gate_inp.weight")
	require.NoError(t, err)
	require.Equal(t, moetest.F32Bytes([]float32{1, 2, 3, 4, 5, 6, 7, 8}), b)
	_, err = f.TensorData("blk.9.ffn_up_exps.weight")
	require.ErrorIs(t, err, format.ErrMissingTensor)
	require.ErrorContains(t, err, `no tensor "blk.9.ffn_up_exps.weight"`)
	require.NoError(t, f.Close())
	require.NoError(t, f.Close())
	_, err = f.TensorData("blk.0.ffn_gate_inp.weight")
	require.ErrorIs(t, err, format.ErrClosed)

	short := filepath.Join(dir, "short.gguf")
	require.NoError(t, os.WriteFile(short, []byte("GGUF"), 0o644))
	_, err = Open(short)
	require.ErrorIs(t, err, ErrMalformed)
	require.ErrorContains(t, err, "short.gguf: 4 bytes: too short")
	bad := filepath.Join(dir, "bad.gguf")
	require.NoError(t, os.WriteFile(bad, append([]byte("GGUF\x01\x00\x00\x00"), make([]byte, 32)...), 0o644))
	_, err = Open(bad)
	require.ErrorIs(t, err, ErrMalformed)
	require.ErrorContains(t, err, "bad.gguf: gguf: GGUF version 1")
	_, err = Open(dir)
	require.ErrorContains(t, err, "not a regular file")
}
