package kernels_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/kernels/kerneltest"
)

// q4Cases are the 4- and 8-bit matrices of the tests: MXFP4, INT4 in
// groups of 32 (Kimi's) and of 128, UINT4 in groups of 32 with and without
// offsets (ggml's Q4_K, Q4_1), INT8 in groups of 32 (Q8_0) and of 16 with
// offsets, and INT8 codes of 5 and 6 bits (ggml's Q5_0, Q5_1, Q6_K:
// packed in that many bits).
var q4Cases = []struct {
	name string
	make func(rng *rand.Rand, rows, cols int) (kernels.Matrix, [][]float64)
}{
	{"mxfp4", kerneltest.MXFP4Weights},
	{"int4 g32", func(rng *rand.Rand, r, c int) (kernels.Matrix, [][]float64) {
		return kerneltest.INT4Weights(rng, r, c, 32)
	}},
	{"int4 g128", func(rng *rand.Rand, r, c int) (kernels.Matrix, [][]float64) {
		return kerneltest.INT4Weights(rng, r, c, 128)
	}},
	{"uint4 g32", func(rng *rand.Rand, r, c int) (kernels.Matrix, [][]float64) {
		return kerneltest.UINT4Weights(rng, r, c, 32, false)
	}},
	{"uint4 g32 offsets", func(rng *rand.Rand, r, c int) (kernels.Matrix, [][]float64) {
		return kerneltest.UINT4Weights(rng, r, c, 32, true)
	}},
	{"int8 g32", func(rng *rand.Rand, r, c int) (kernels.Matrix, [][]float64) {
		return kerneltest.INT8Weights(rng, r, c, 32, false)
	}},
	{"int8 g16 offsets", func(rng *rand.Rand, r, c int) (kernels.Matrix, [][]float64) {
		return kerneltest.INT8Weights(rng, r, c, 16, true)
	}},
	{"int8 5-bit signed g32", func(rng *rand.Rand, r, c int) (kernels.Matrix, [][]float64) {
		return kerneltest.INT8CodeWeights(rng, r, c, 32, -16, 32, false)
	}},
	{"int8 5-bit unsigned g32 offsets", func(rng *rand.Rand, r, c int) (kernels.Matrix, [][]float64) {
		return kerneltest.INT8CodeWeights(rng, r, c, 32, 0, 32, true)
	}},
	{"int8 6-bit signed g16", func(rng *rand.Rand, r, c int) (kernels.Matrix, [][]float64) {
		return kerneltest.INT8CodeWeights(rng, r, c, 16, -32, 64, false)
	}},
	{"int8 5-bit signed g4 (bytes: groups shorter than a unit)", func(rng *rand.Rand, r, c int) (kernels.Matrix, [][]float64) {
		return kerneltest.INT8CodeWeights(rng, r, c, 4, -16, 32, false)
	}},
	// Scales held as the K-quants' factors only (Q4_K, Q5_K, Q6_K, and
	// 8-bit codes with them).
	{"uint4 K g32 offsets", func(rng *rand.Rand, r, c int) (kernels.Matrix, [][]float64) {
		return kerneltest.KQuantWeights(rng, kernels.UINT4, r, c, 32, 0, 16, true)
	}},
	{"int8 K 5-bit unsigned g32 offsets", func(rng *rand.Rand, r, c int) (kernels.Matrix, [][]float64) {
		return kerneltest.KQuantWeights(rng, kernels.INT8, r, c, 32, 0, 32, true)
	}},
	{"int8 K 6-bit signed g16", func(rng *rand.Rand, r, c int) (kernels.Matrix, [][]float64) {
		return kerneltest.KQuantWeights(rng, kernels.INT8, r, c, 16, -32, 64, false)
	}},
	{"int8 K g32 offsets", func(rng *rand.Rand, r, c int) (kernels.Matrix, [][]float64) {
		return kerneltest.KQuantWeights(rng, kernels.INT8, r, c, 32, -128, 256, true)
	}},
}

var q4Shapes = []struct{ M, N, K int }{{1, 37, 256}, {3, 64, 384}, {7, 20, 128}, {64, 48, 512}, {13, 16, 2048}, {2, 1, 128}}

// TestQ4MatchesReference: on every implementation, plain and packed, the
// 4-bit weights against a float64 reference on their values from the
// formats' definitions (within 1e-5 of the products' magnitude); and the
// packed SIMD kernels give the bits of the fp32 kernels on the dequantized
// weights, a row's bits not depending on the rows beside it.
func TestQ4MatchesReference(t *testing.T) {
	forEachImpl(t, func(t *testing.T) {
		for _, qc := range q4Cases {
			for _, s := range q4Shapes {
				t.Run(fmt.Sprintf("%s/M=%d,N=%d,K=%d", qc.name, s.M, s.N, s.K), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(s.M*s.N), uint64(s.K)))
					gate, g64 := qc.make(rng, s.N, s.K)
					up, u64 := qc.make(rng, s.N, s.K)
					x := make([]float32, s.M*s.K)
					for i := range x {
						x[i] = float32(rng.Float64()*2 - 1)
					}
					idx := make([]int32, s.M)
					for i := range idx {
						idx[i] = int32(i)
					}
					for _, packed := range []bool{false, true} {
						g, u := gate, up
						if packed {
							g, u = kernels.Pack(g), kernels.Pack(u)
						}
						h := make([]float32, s.M*s.N)
						kernels.GateUp(h, x, idx, g, u, 0, s.N)
						o := make([]float32, s.M*s.N)
						kernels.Down(o, x, g, nil, 0, s.N)
						for r := 0; r < s.M; r++ {
							for n := 0; n < s.N; n++ {
								var gs, us, mag float64
								for k := 0; k < s.K; k++ {
									xv := float64(x[r*s.K+k])
									gs += xv * g64[n][k]
									us += xv * u64[n][k]
									mag += math.Abs(xv) * (math.Abs(g64[n][k]) + math.Abs(u64[n][k]))
								}
								want := gs / (1 + math.Exp(-gs)) * us
								require.InDelta(t, want, h[r*s.N+n], 1e-5*mag*(1+math.Abs(us)+math.Abs(gs))+1e-30, "gate/up packed=%v row %d col %d", packed, r, n)
								require.InDelta(t, gs, o[r*s.N+n], 1e-5*mag+1e-30, "down packed=%v row %d col %d", packed, r, n)
							}
						}
					}
					pg, pu := kernels.Pack(gate), kernels.Pack(up)
					fg, fu := kernels.Pack(dequantized(t, gate)), kernels.Pack(dequantized(t, up))
					h4, h32 := make([]float32, s.M*s.N), make([]float32, s.M*s.N)
					kernels.GateUp(h4, x, idx, pg, pu, 0, s.N)
					kernels.GateUp(h32, x, idx, fg, fu, 0, s.N)
					require.Equal(t, bitsOf(h32), bitsOf(h4), "gate/up against fp32 on the dequantized weights")
					o4, o32 := make([]float32, s.M*s.N), make([]float32, s.M*s.N)
					kernels.Down(o4, x, pg, nil, 0, s.N)
					kernels.Down(o32, x, fg, nil, 0, s.N)
					require.Equal(t, bitsOf(o32), bitsOf(o4), "down against fp32 on the dequantized weights")
					one := make([]float32, s.N)
					kernels.GateUp(one, x, idx[s.M-1:], pg, pu, 0, s.N)
					require.Equal(t, bitsOf(h4[(s.M-1)*s.N:]), bitsOf(one), "one row alone")
				})
			}
		}
	})
}

// TestQ4Values: every nibble's value against the definitions.
func TestQ4Values(t *testing.T) {
	blocks := make([]uint8, 16)
	for i := range blocks {
		blocks[i] = uint8(2*i%16) | uint8((2*i+1)%16)<<4
	}
	m, err := kernels.NewMXFP4(1, 32, blocks, []uint8{127})
	require.NoError(t, err)
	iq, err := kernels.NewINT4(1, 32, 32, blocks, []float32{1})
	require.NoError(t, err)
	for j := 0; j < 32; j++ {
		require.Equal(t, kerneltest.E2M1(uint8(j%16)), float64(m.At(0, j)), "mxfp4 nibble %d", j%16)
		require.Equal(t, float64(j%16-8), float64(iq.At(0, j)), "int4 field %d", j%16)
		require.Equal(t, m.At(0, j), kernels.Pack(m).At(0, j))
		require.Equal(t, iq.At(0, j), kernels.Pack(iq).At(0, j))
	}
}

// TestCodeValues: every UINT4 nibble and INT8 code against the definition
// code × scale + offset, rounded once (the scale 1 + 2^-23 makes a 4-bit
// product inexact: one rounding, not two).
func TestCodeValues(t *testing.T) {
	nib := make([]uint8, 16)
	for i := range nib {
		nib[i] = uint8(2*i%16) | uint8((2*i+1)%16)<<4
	}
	const s, o = 1 + 0x1p-23, 0x1p-30
	u, err := kernels.NewUINT4(1, 32, 32, nib, []float32{s}, []float32{o})
	require.NoError(t, err)
	codes := make([]int8, 256)
	for i := range codes {
		codes[i] = int8(i - 128)
	}
	q, err := kernels.NewINT8(1, 256, 16, codes, make16(s), make16(-o))
	require.NoError(t, err)
	q0, err := kernels.NewINT8(1, 256, 256, codes, []float32{s}, nil)
	require.NoError(t, err)
	for j := 0; j < 32; j++ {
		n := float64(j % 16)
		require.Equal(t, float32(n*s+o), u.At(0, j), "uint4 nibble %d", j%16)
		require.Equal(t, u.At(0, j), kernels.Pack(u).At(0, j))
	}
	for j := range codes {
		c := float64(j - 128)
		require.Equal(t, float32(c*s-o), q.At(0, j), "int8 code %d", j-128)
		require.Equal(t, float32(c*s), q0.At(0, j), "int8 code %d without offsets", j-128)
		require.Equal(t, q.At(0, j), kernels.Pack(q).At(0, j))
	}
	require.Nil(t, q0.Offsets())
	require.Len(t, q.Offsets(), 16)
}

func make16(v float32) []float32 {
	out := make([]float32, 16)
	for i := range out {
		out[i] = v
	}
	return out
}

// TestQ4BadInput: each an error naming the problem.
func TestQ4BadInput(t *testing.T) {
	b := make([]uint8, 2*16)
	_, err := kernels.NewMXFP4(2, 30, b, []uint8{127, 127})
	require.ErrorContains(t, err, "mxfp4 matrix [2, 30]: columns must be a multiple of 32")
	_, err = kernels.NewMXFP4(2, 32, b, []uint8{127})
	require.ErrorContains(t, err, "needs [2, 1] scales, have 1")
	_, err = kernels.NewMXFP4(2, 32, b, []uint8{127, 0xFF})
	require.ErrorContains(t, err, "mxfp4 scale [1, 0] is the E8M0 NaN 0xff")
	_, err = kernels.NewMXFP4(2, 32, b[:20], []uint8{127, 127})
	require.ErrorContains(t, err, "4-bit matrix [2, 32] needs 32 bytes, have 20")
	_, err = kernels.NewINT4(2, 32, 12, b, []float32{1, 1})
	require.ErrorContains(t, err, "group size 12 must be even and divide the columns")
	_, err = kernels.NewINT4(2, 32, 16, b, []float32{1, 1, 1})
	require.ErrorContains(t, err, "in groups of 16 needs [2, 2] scales, have 3")
	_, err = kernels.NewINT4(2, 32, 16, b, []float32{1, 1, float32(math.Inf(-1)), 1})
	require.ErrorContains(t, err, "int4 scale [1, 0] is -Inf")
	_, err = kernels.NewUINT4(2, 32, 16, b, []float32{1, 1, 1, 1}, []float32{0, 0, float32(math.NaN()), 0})
	require.ErrorContains(t, err, "uint4 offset [1, 0] is NaN")
	_, err = kernels.NewUINT4(2, 32, 16, b, []float32{1, 1, 1, 1}, []float32{0})
	require.ErrorContains(t, err, "uint4 matrix [2, 32] in groups of 16 needs [2, 2] scales and offsets, have 4 and 1")
	_, err = kernels.NewUINT4(2, 32, 3, b, nil, nil)
	require.ErrorContains(t, err, "group size 3 must be even")
	codes := make([]int8, 64)
	_, err = kernels.NewINT8(2, 32, 5, codes, nil, nil)
	require.ErrorContains(t, err, "int8 matrix [2, 32]: group size 5 must divide the columns")
	_, err = kernels.NewINT8(2, 32, 32, codes[:40], []float32{1, 1}, nil)
	require.ErrorContains(t, err, "matrix [2, 32] needs 64 values, have 40")
	_, err = kernels.NewINT8(2, 32, 32, codes, []float32{1, float32(math.Inf(1))}, nil)
	require.ErrorContains(t, err, "int8 scale [1, 0] is +Inf")
}

// FuzzQ4: any nibbles and scales give, through the packed SIMD kernels,
// the bits of the fp32 kernels on the dequantized weights.
func FuzzQ4(f *testing.F) {
	f.Add([]byte{0x01, 0x23, 0x45, 0x67, 0x89, 0xAB, 0xCD, 0xEF}, uint8(127), float32(0.01), false)
	f.Add([]byte{0xFF, 0x00, 0x88}, uint8(3), float32(3e-30), true)
	f.Fuzz(func(t *testing.T, raw []byte, e uint8, scale float32, isInt bool) {
		const N, K = 19, 64
		if len(raw) == 0 || e == 0xFF || !(scale >= 0) || math.IsInf(float64(scale), 0) {
			return
		}
		data := make([]uint8, N*K/2)
		for i := range data {
			data[i] = raw[i%len(raw)] ^ uint8(i/len(raw))
		}
		var m kernels.Matrix
		var err error
		if isInt {
			sc := make([]float32, N*2)
			for i := range sc {
				sc[i] = scale * float32(1+i%3)
			}
			m, err = kernels.NewINT4(N, K, 32, data, sc)
		} else {
			sc := make([]uint8, N*2)
			for i := range sc {
				sc[i] = e - uint8(i%2)*min(e, 1)
			}
			m, err = kernels.NewMXFP4(N, K, data, sc)
		}
		if err != nil {
			return
		}
		x := make([]float32, 2*K)
		for i := range x {
			x[i] = float32(i%7) - 3
		}
		o4, o32 := make([]float32, 2*N), make([]float32, 2*N)
		kernels.Down(o4, x, kernels.Pack(m), nil, 0, N)
		kernels.Down(o32, x, kernels.Pack(dequantized(t, m)), nil, 0, N)
		require.Equal(t, bitsOf(o32), bitsOf(o4))
	})
}

// TestQuantize: each format's quantization keeps every value within half a
// step of its block's grid, and a block already on the grid exactly.
func TestQuantize(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const R, C = 3, 64
	v := make([]float32, R*C)
	for i := range v {
		v[i] = float32(rng.Float64()*2 - 1)
	}
	for _, dt := range []kernels.DType{kernels.F8E4M3, kernels.MXFP4, kernels.INT4, kernels.UINT4, kernels.INT8} {
		m, err := kernels.Quantize(dt, v, R, C)
		require.NoError(t, err)
		require.Equal(t, dt, m.DType)
		if dt == kernels.INT4 || dt == kernels.INT8 { // fp16 scales, as GGUF's Q4_0 and Q8_0 (normal ones here)
			scales, _ := m.CodeScales()
			for _, sc := range scales {
				require.Equal(t, sc, half.F16ToF32(half.F32ToF16(sc)), "%v scale", dt)
			}
		}
		for i, x := range v {
			amax, lo, hi := 0.0, math.Inf(1), math.Inf(-1)
			for _, y := range v[i/32*32:][:32] {
				amax = math.Max(amax, math.Abs(float64(y)))
				lo, hi = math.Min(lo, float64(y)), math.Max(hi, float64(y))
			}
			// The coarsest relative step: e2m1 between 4 and 6 (a quarter of
			// the largest), int4 1/7 of the largest, e4m3 1/16 of a value,
			// int8 1/127 of the largest, uint4 1/15 of the block's range;
			// int4's and int8's scales rounded to fp16 move a code's value
			// by at most 2^−11 of the largest more.
			tol := map[kernels.DType]float64{kernels.F8E4M3: math.Abs(float64(x))/16 + 1e-9, kernels.MXFP4: amax / 3, kernels.INT4: amax/14 + amax/2048,
				kernels.INT8: amax/254 + amax/2048, kernels.UINT4: (hi - lo) / 30}[dt]
			require.InDelta(t, x, m.At(i/C, i%C), tol*1.0001, "%v element %d", dt, i)
		}
	}
	grid := make([]float32, 32)
	for i := range grid {
		grid[i] = float32(kerneltest.E2M1(uint8(i%16))) / 4
	}
	m, err := kernels.Quantize(kernels.MXFP4, grid, 1, 32)
	require.NoError(t, err)
	for j, x := range grid {
		require.Equal(t, x, m.At(0, j))
	}
	_, err = kernels.Quantize(kernels.INT4, v[:30], 1, 30)
	require.ErrorContains(t, err, "needs columns in multiples of 32")
	// Blocks whose scale is past fp16's normal range (too large: it would
	// be infinite; too small: zero or subnormal) keep the fp32 scale.
	for _, a := range []float32{1e9, 1e-7} {
		for _, dt := range []kernels.DType{kernels.INT4, kernels.INT8} {
			b := make([]float32, 32)
			for j := range b {
				b[j] = a * float32(j-13) / 18
			}
			m, err := kernels.Quantize(dt, b, 1, 32)
			require.NoError(t, err)
			scales, _ := m.CodeScales()
			amax := 0.0
			for _, x := range b {
				amax = math.Max(amax, math.Abs(float64(x)))
			}
			want := float32(amax / 7)
			if dt == kernels.INT8 {
				want = float32(amax / 127)
			}
			require.Equal(t, want, scales[0], "%v scale of a block of %g", dt, a)
			require.InDelta(t, b[31], m.At(0, 31), float64(want)/2*1.0001, "%v", dt)
		}
	}
}

// FuzzCodes: any UINT4 or INT8 codes, scales and offsets give, through
// the packed SIMD kernels, the bits of the fp32 kernels on the dequantized
// weights (one rounding each, computed by fmaF32 there and by an FMA here).
func FuzzCodes(f *testing.F) {
	f.Add([]byte{0x01, 0x23, 0x45, 0x67, 0x89, 0xAB, 0xCD, 0xEF}, float32(0.01), float32(-0.3), false, true)
	f.Add([]byte{0xFF, 0x00, 0x80, 0x7F}, float32(1+0x1p-23), float32(0x1p-30), true, true)
	f.Add([]byte{0x10}, float32(3e-30), float32(0), true, false)
	f.Fuzz(func(t *testing.T, raw []byte, scale, offset float32, isInt8, withOffsets bool) {
		const N, K, G = 19, 64, 16
		if len(raw) == 0 || math.IsNaN(float64(scale)) || math.IsInf(float64(scale), 0) ||
			math.IsNaN(float64(offset)) || math.IsInf(float64(offset), 0) {
			return
		}
		sc := make([]float32, N*K/G)
		for i := range sc {
			sc[i] = scale * float32(1+i%3)
		}
		var off []float32
		if withOffsets {
			off = make([]float32, N*K/G)
			for i := range off {
				off[i] = offset * float32(i%5-2)
			}
		}
		var m kernels.Matrix
		var err error
		if isInt8 {
			codes := make([]int8, N*K)
			for i := range codes {
				codes[i] = int8(raw[i%len(raw)] ^ uint8(i/len(raw)))
			}
			m, err = kernels.NewINT8(N, K, G, codes, sc, off)
		} else {
			data := make([]uint8, N*K/2)
			for i := range data {
				data[i] = raw[i%len(raw)] ^ uint8(i/len(raw))
			}
			m, err = kernels.NewUINT4(N, K, G, data, sc, off)
		}
		if err != nil {
			return
		}
		x := make([]float32, 2*K)
		for i := range x {
			x[i] = float32(i%7) - 3
		}
		o, o32 := make([]float32, 2*N), make([]float32, 2*N)
		kernels.Down(o, x, kernels.Pack(m), nil, 0, N)
		kernels.Down(o32, x, kernels.Pack(dequantized(t, m)), nil, 0, N)
		require.Equal(t, bitsOf(o32), bitsOf(o))
	})
}
