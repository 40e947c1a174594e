package gguf

import (
	"bytes"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/format"
	"github.com/moex-project/moex/internal/half"
)

// randomRows are rows×cols values of several kinds of block: normal
// values, all-positive ones, all-negative ones, zeros, a lone spike,
// values spanning orders of magnitude.
func randomRows(rng *rand.Rand, rows, cols int) []float32 {
	v := make([]float32, rows*cols)
	for i := range v {
		switch (i / 32) % 6 {
		case 0:
			v[i] = float32(rng.NormFloat64())
		case 1:
			v[i] = float32(rng.Float64() * 3)
		case 2:
			v[i] = -float32(0.01 + rng.Float64())
		case 3:
			v[i] = 0
		case 4:
			if i%32 == 7 {
				v[i] = 40
			} else {
				v[i] = float32(rng.NormFloat64() * 0.01)
			}
		case 5:
			v[i] = float32(math.Ldexp(rng.Float64()-0.5, rng.IntN(20)-10))
		}
	}
	return v
}

// maxErr is, per value of block b (values v, block size bs, type t), the
// largest error the type's plain-rounding encoding may make, worked out
// from the values alone.
func maxErr(t Type, v []float32) []float64 {
	out := make([]float64, len(v))
	amax := func(x []float32) float64 {
		var m float64
		for _, e := range x {
			m = math.Max(m, math.Abs(float64(e)))
		}
		return m
	}
	const slack = 1.01 // f16 rounding of the factors
	switch t {
	case F32:
		// exact
	case F16, BF16:
		for i, x := range v {
			out[i] = math.Abs(float64(x)) * 0.004
		}
	case Q8_0:
		for b := 0; b < len(v); b += 32 {
			for i := range 32 {
				out[b+i] = amax(v[b:b+32]) / 127 / 2 * slack
			}
		}
	case Q4_0: // the scale |m|/8; the far end of the range clamps by one step
		for b := 0; b < len(v); b += 32 {
			for i := range 32 {
				out[b+i] = amax(v[b:b+32]) / 8 * slack
			}
		}
	case Q4_K: // half a step, plus the min's rounding (dmin) and the scale's
		for b := 0; b < len(v); b += 256 {
			var rmax, mmax float64
			for g := 0; g < 256; g += 32 {
				lo, hi := 0.0, math.Inf(-1)
				for _, x := range v[b+g : b+g+32] {
					lo, hi = math.Min(lo, float64(x)), math.Max(hi, float64(x))
				}
				rmax, mmax = math.Max(rmax, (hi-lo)/15), math.Max(mmax, -lo)
			}
			for g := 0; g < 256; g += 32 {
				lo, hi := 0.0, math.Inf(-1)
				for _, x := range v[b+g : b+g+32] {
					lo, hi = math.Min(lo, float64(x)), math.Max(hi, float64(x))
				}
				step := (hi-lo)/15 + rmax/63
				for i := range 32 {
					out[b+g+i] = (step/2 + mmax/63) * slack
				}
			}
		}
	case Q6_K: // half a step; the scale's rounding to a multiple of d clamps the far end
		for b := 0; b < len(v); b += 256 {
			smax := amax(v[b:b+256]) / 31
			for g := 0; g < 256; g += 16 {
				for i := range 16 {
					out[b+g+i] = (amax(v[b+g:b+g+16])/31/2 + 16*smax/127) * slack
				}
			}
		}
	case MXFP4: // half the gap of e2m1's grid where the value falls
		for b := 0; b < len(v); b += 32 {
			m := amax(v[b : b+32])
			if m == 0 {
				continue
			}
			s := math.Ldexp(1, int(math.Ceil(math.Log2(m/6))))
			for i, x := range v[b : b+32] {
				gap := 0.5
				if a := math.Abs(float64(x)) / s; a > 4 {
					gap = 2
				} else if a > 2 {
					gap = 1
				}
				out[b+i] = s * gap / 2 * (1 + 1e-6)
			}
		}
	}
	return out
}

// TestWriteEncodeRoundTrip writes a file of every metadata type and a
// tensor of every type Encode writes, reads it back with Parse and
// Model.Matrix, and holds each value to its type's rounding.
func TestWriteEncodeRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	kvs := []KV{{"general.architecture", "qwen3moe"}, {"a.u8", uint8(7)}, {"a.i8", int8(-7)}, {"a.u16", uint16(700)},
		{"a.i16", int16(-700)}, {"a.u32", uint32(70000)}, {"a.i32", int32(-70000)}, {"a.u64", uint64(1) << 40},
		{"a.i64", int64(-1) << 40}, {"a.f32", float32(0.5)}, {"a.f64", 0.25}, {"a.bool", true},
		{"a.strs", []string{"x", "", "ÿz"}}, {"a.i32s", []int32{1, -2}}, {"a.u32s", []uint32{3}}, {"a.f32s", []float32{1.5}},
		{"a.u8s", []uint8{9, 8}}, {"a.i64s", []int64{-5}}}
	const rows, cols = 6, 512
	types := []Type{F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K, MXFP4}
	vals := map[Type][]float32{}
	var tensors []TensorOut
	for _, ty := range types {
		v := randomRows(rng, rows, cols)
		vals[ty] = v
		data, err := Encode(ty, v, rows, cols)
		require.NoError(t, err, ty)
		tensors = append(tensors, TensorOut{Name: "w." + ty.String(), Dims: []uint64{cols, rows}, Type: ty,
			Data: func() ([]byte, error) { return data, nil }})
	}
	tensors = append(tensors, TensorOut{Name: "odd", Dims: []uint64{3}, Type: F32, // a size not a multiple of 32
		Data: func() ([]byte, error) { return Encode(F32, []float32{1, 2, 3}, 1, 3) }})
	path := filepath.Join(t.TempDir(), "w.gguf")
	f, err := os.Create(path)
	require.NoError(t, err)
	require.NoError(t, Write(f, kvs, tensors))
	require.NoError(t, f.Close())

	m, err := OpenModel(path)
	require.NoError(t, err)
	defer m.Close()
	h := m.Header()
	require.Equal(t, uint32(3), h.Version)
	for i, kv := range kvs {
		require.Equal(t, kv.Key, h.Keys[i])
	}
	md := h.Metadata
	require.Equal(t, "qwen3moe", md["general.architecture"].Str)
	for key, want := range map[string]int64{"a.u8": 7, "a.i8": -7, "a.u16": 700, "a.i16": -700, "a.u32": 70000, "a.i32": -70000,
		"a.u64": 1 << 40, "a.i64": -1 << 40} {
		got, ok := md[key].AsInt()
		require.True(t, ok, key)
		require.Equal(t, want, got, key)
	}
	require.Equal(t, []ValueType{Uint8, Int8, Uint16, Int16, Uint32, Int32, Uint64, Int64},
		[]ValueType{md["a.u8"].Type, md["a.i8"].Type, md["a.u16"].Type, md["a.i16"].Type, md["a.u32"].Type, md["a.i32"].Type,
			md["a.u64"].Type, md["a.i64"].Type})
	require.Equal(t, Float32, md["a.f32"].Type)
	require.Equal(t, 0.5, md["a.f32"].Float)
	require.Equal(t, Float64, md["a.f64"].Type)
	require.Equal(t, 0.25, md["a.f64"].Float)
	require.True(t, md["a.bool"].Bool)
	strs := md["a.strs"]
	require.Equal(t, String, strs.Elem)
	require.Len(t, strs.Array, 3)
	require.Equal(t, "ÿz", strs.Array[2].Str)
	require.Equal(t, int64(-2), md["a.i32s"].Array[1].Int)
	require.Equal(t, uint64(3), md["a.u32s"].Array[0].Uint)
	require.Equal(t, 1.5, md["a.f32s"].Array[0].Float)
	require.Equal(t, uint64(8), md["a.u8s"].Array[1].Uint)
	require.Equal(t, int64(-5), md["a.i64s"].Array[0].Int)

	for _, ty := range types {
		name := "w." + ty.String()
		info := h.Tensors[name]
		require.Equal(t, ty, info.Type)
		require.Equal(t, []uint64{cols, rows}, info.Dims)
		require.Zero(t, (info.Offset-h.DataOffset)%32, name)
		mat, err := m.Matrix(name, rows, cols)
		require.NoError(t, err, name)
		v, bound := vals[ty], maxErr(ty, vals[ty])
		got := make([]float32, cols)
		var sq, n float64
		for r := range rows {
			mat.RowF32(r, got)
			for j, g := range got {
				i := r*cols + j
				e := math.Abs(float64(g) - float64(v[i]))
				require.LessOrEqual(t, e, bound[i], "%v value %d: %v for %v", ty, i, g, v[i])
				if bound[i] > 0 {
					sq, n = sq+(e/bound[i])*(e/bound[i]), n+1
				}
			}
		}
		if ty != F32 { // the rounding is to nearest, not to one side: well within the bound on average
			require.Less(t, math.Sqrt(sq/n), 0.8, ty)
		}
		if ty == F16 || ty == BF16 {
			for i, x := range v[:cols] {
				want := half.F16ToF32(half.F32ToF16(x))
				if ty == BF16 {
					want = half.BF16ToF32(half.F32ToBF16(x))
				}
				require.Equal(t, want, mat.At(0, i))
			}
		}
	}
	odd, err := m.Matrix("odd", 3)
	require.NoError(t, err)
	require.Equal(t, float32(3), odd.At(0, 2))
}

// TestEncodeByHand checks blocks whose bytes are worked out by hand from
// ggml-common.h's structs.
func TestEncodeByHand(t *testing.T) {
	// Q8_0: max 127 gives d = 1, codes the values.
	v := make([]float32, 32)
	for i := range v {
		v[i] = float32(i*8 - 127)
	}
	v[31] = 127
	b, err := Encode(Q8_0, v, 1, 32)
	require.NoError(t, err)
	require.Equal(t, []byte{0x00, 0x3c}, b[:2]) // f16 1.0
	require.Equal(t, byte(0x81), b[2])          // −127
	require.Equal(t, byte(127), b[33])
	// Q4_0: the largest magnitude −8 gives d = 1; value x is code x + 8.
	for i := range v {
		v[i] = float32(i%16 - 8)
	}
	b, err = Encode(Q4_0, v, 1, 32)
	require.NoError(t, err)
	require.Equal(t, []byte{0x00, 0x3c}, b[:2])
	for j := range 16 {
		require.Equal(t, byte(j|j<<4), b[2+j], "byte %d", j) // value j low, value j+16 (the same) high
	}
	// MXFP4: largest 6 gives the scale 2⁰ (e8m0 127); 1.5 is code 3, −6 code 15.
	for i := range v {
		v[i] = 0
	}
	v[0], v[16], v[1] = 1.5, -6, 6
	b, err = Encode(MXFP4, v, 1, 32)
	require.NoError(t, err)
	require.Equal(t, byte(127), b[0])
	require.Equal(t, byte(3|15<<4), b[1])
	require.Equal(t, byte(7), b[2])
	// Q6_K: groups of 16 all equal to 31 give scale 1 each; d = 1/127, sc
	// 127; code 31 + 32 = 63 = 0b11_1111: every low nibble 15, every bit
	// pair 3.
	v = make([]float32, 256)
	for i := range v {
		v[i] = 31
	}
	b, err = Encode(Q6_K, v, 1, 256)
	require.NoError(t, err)
	require.Equal(t, bytes.Repeat([]byte{0xff}, 192), b[:192])
	require.Equal(t, bytes.Repeat([]byte{127}, 16), b[192:208])
	require.Equal(t, half.F32ToF16(float32(31.0/31/127)), uint16(b[208])|uint16(b[209])<<8)
	// Q4_K: group g holds 0…15 (step 1) + g: range 15, min 0 for all, so
	// d = 1/63 (f16), sc 63 for every group, dmin 0.
	for i := range v {
		v[i] = float32(i % 16)
	}
	b, err = Encode(Q4_K, v, 1, 256)
	require.NoError(t, err)
	require.Equal(t, half.F32ToF16(float32(1.0/63)), uint16(b[0])|uint16(b[1])<<8)
	require.Equal(t, []byte{0, 0}, b[2:4])
	// Bytes 0…3: scales 0…3 (63) in the low 6 bits, the top two bits of
	// scales 4…7 (63 >> 4 = 3) above them; bytes 4…7: mins 0…3 and the
	// top bits of mins 4…7 (all 0); bytes 8…11: scales 4…7's low nibbles
	// (15) and mins 4…7's (0).
	require.Equal(t, []byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 15, 15, 15, 15}, b[4:16])
	for i := range 4 {
		for l := range 32 {
			require.Equal(t, byte(l%16|(l%16)<<4), b[16+32*i+l])
		}
	}
}

// TestEncodeWriteErrors: what cannot be written is an error naming it.
func TestEncodeWriteErrors(t *testing.T) {
	_, err := Encode(Q5_K, make([]float32, 256), 1, 256)
	require.ErrorIs(t, err, format.ErrUnsupported)
	require.ErrorContains(t, err, "Q5_K")
	_, err = Encode(Q4_K, make([]float32, 64), 1, 64)
	require.ErrorContains(t, err, "rows of 64 values are not whole blocks of 256")
	_, err = Encode(Q8_0, make([]float32, 10), 1, 32)
	require.ErrorContains(t, err, "10 values for a matrix [1, 32]")
	_, err = Encode(Q8_0, append(make([]float32, 31), float32(math.NaN())), 1, 32)
	require.ErrorContains(t, err, "value 31 is NaN")

	data := func() ([]byte, error) { return make([]byte, 4), nil }
	var buf bytes.Buffer
	require.ErrorContains(t, Write(&buf, nil, []TensorOut{{Name: "a", Dims: []uint64{1}, Type: F32, Data: data},
		{Name: "a", Dims: []uint64{1}, Type: F32, Data: data}}), `tensor name "a"`)
	require.ErrorContains(t, Write(&buf, nil, []TensorOut{{Name: "a", Dims: []uint64{2}, Type: F32, Data: data}}),
		`tensor "a": 4 bytes of data for 8`)
	require.ErrorContains(t, Write(&buf, nil, []TensorOut{{Name: "a", Dims: []uint64{16}, Type: Q8_0, Data: data}}),
		"rows of 16 values are not whole Q8_0 blocks of 32")
	require.ErrorContains(t, Write(&buf, []KV{{"k", []bool{true}}}, nil), `key "k": no GGUF type for a []bool`)
	require.ErrorContains(t, Write(&buf, []KV{{"k", 1}, {"k", 2}}, nil), `key "k"`)
}
