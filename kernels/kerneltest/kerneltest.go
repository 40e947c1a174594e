// Package kerneltest is the conformance suite of the expert FFN kernels:
// every implementation (generic, asm, cudaemu, cuda) runs the same tests
// against a float64 reference, with guard-padded outputs, aligned and
// unaligned sizes, column sub-ranges, every weight dtype and NaN inputs.
package kerneltest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/kernels"
)

// GateUpFunc has the contract of kernels.GateUp.
type GateUpFunc func(h, x []float32, idx []int32, gate, up kernels.Matrix, n0, n1 int)

// DownFunc has the contract of kernels.Down.
type DownFunc func(out, h []float32, down kernels.Matrix, scale []float32, n0, n1 int)

// guard fills the padding around outputs; any write outside the contract
// changes it.
const guard = float32(-12345.678)

// Shape is one case of the suite: m rows, a projection [n, k].
type Shape struct{ M, N, K int }

// Shapes covers M = 0, 1, 7, 64 and 1000, N and K that are multiples of no
// tile, and the DeepSeek-V2-Lite expert shape.
var Shapes = []Shape{
	{0, 8, 16}, {1, 1, 1}, {1, 4, 8}, {1, 5, 17}, {7, 9, 33}, {7, 16, 64}, {3, 3, 15},
	{64, 20, 130}, {13, 37, 257}, {1000, 6, 40}, {4, 64, 2048}, {2, 24, 1408},
}

// DTypes are the weight dtypes of the suite.
var DTypes = []kernels.DType{kernels.F32, kernels.BF16, kernels.F16, kernels.F8E4M3}

// FP8Block is the scale block of the suite's FP8 matrices: rows in blocks
// that split a 16-row panel, columns in blocks whose edges fall inside the
// shapes' k ranges.
var FP8Block = [2]int{8, 24}

// E4M3 is an FP8 e4m3fn byte's value from the format's definition
// (moetest.E4M3): NaN for 0x7F and 0xFF.
func E4M3(b uint8) float64 { return moetest.E4M3(b) }

// FP8Weights returns a random FP8 [rows, cols] matrix with scales in
// blocks of block, every byte but the NaN ones drawn, and its dequantized
// values (byte × scale) in float64.
func FP8Weights(rng *rand.Rand, rows, cols int, block [2]int) (kernels.Matrix, [][]float64) {
	br, bc := block[0], block[1]
	gr, gc := (rows+br-1)/br, (cols+bc-1)/bc
	scales := make([]float32, gr*gc)
	for i := range scales {
		scales[i] = float32(math.Ldexp(1+rng.Float64(), -7-rng.IntN(4))) // 2^-10 … 2^-6
	}
	data := make([]uint8, rows*cols)
	vals := make([][]float64, rows)
	for r := range vals {
		vals[r] = make([]float64, cols)
		for c := range vals[r] {
			b := uint8(rng.IntN(256))
			for b&0x7F == 0x7F {
				b = uint8(rng.IntN(256))
			}
			data[r*cols+c] = b
			vals[r][c] = E4M3(b) * float64(scales[r/br*gc+c/bc])
		}
	}
	m, err := kernels.NewFP8(rows, cols, data, scales, br, bc)
	if err != nil {
		panic(err)
	}
	return m, vals
}

// Weights returns a random [rows, cols] matrix of dtype and its exact
// float64 values (an FP8 matrix's dequantized values, its scales in blocks
// of FP8Block).
func Weights(rng *rand.Rand, dtype kernels.DType, rows, cols int) (kernels.Matrix, [][]float64) {
	if dtype == kernels.F8E4M3 {
		return FP8Weights(rng, rows, cols, FP8Block)
	}
	vals := make([][]float64, rows)
	f32 := make([]float32, rows*cols)
	u16 := make([]uint16, rows*cols)
	for r := range vals {
		vals[r] = make([]float64, cols)
		for c := range vals[r] {
			v := float32(rng.Float64()*2 - 1)
			switch dtype {
			case kernels.BF16:
				u16[r*cols+c] = half.F32ToBF16(v)
				v = half.BF16ToF32(u16[r*cols+c])
			case kernels.F16:
				u16[r*cols+c] = half.F32ToF16(v)
				v = half.F16ToF32(u16[r*cols+c])
			}
			f32[r*cols+c] = v
			vals[r][c] = float64(v)
		}
	}
	var m kernels.Matrix
	var err error
	if dtype == kernels.F32 {
		m, err = kernels.NewF32(rows, cols, f32)
	} else {
		m, err = kernels.NewHalf(dtype, rows, cols, u16)
	}
	if err != nil {
		panic(err)
	}
	return m, vals
}

func padded(n int) ([]float32, []float32) {
	buf := make([]float32, n+32)
	for i := range buf {
		buf[i] = guard
	}
	return buf, buf[16 : 16+n]
}

func checkGuards(t *testing.T, buf []float32, n int) {
	t.Helper()
	for i := 0; i < 16; i++ {
		require.Equal(t, guard, buf[i], "guard before the output overwritten")
		require.Equal(t, guard, buf[16+n+i], "guard after the output overwritten")
	}
}

func silu(g float64) float64 { return g / (1 + math.Exp(-g)) }

func relClose(t *testing.T, want float64, got float32, scale float64, msg string, args ...any) {
	t.Helper()
	if math.IsNaN(want) {
		require.True(t, math.IsNaN(float64(got)), append([]any{msg}, args...)...)
		return
	}
	require.InDelta(t, want, float64(got), 1e-5*scale+1e-30, append([]any{msg}, args...)...)
}

// TestGateUp runs the GateUp contract over every shape and dtype, on full
// and partial column ranges and through a scattered row index.
func TestGateUp(t *testing.T, gateUp GateUpFunc) {
	for _, dt := range DTypes {
		for _, s := range Shapes {
			for _, part := range []bool{false, true} {
				t.Run(fmt.Sprintf("%v/M=%d,N=%d,K=%d,part=%v", dt, s.M, s.N, s.K, part), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(s.M*7+s.N*13+s.K), uint64(dt)))
					gate, g64 := Weights(rng, dt, s.N, s.K)
					up, u64 := Weights(rng, dt, s.N, s.K)
					tokens := s.M + 3
					x := make([]float32, tokens*s.K)
					for i := range x {
						x[i] = float32(rng.Float64()*2 - 1)
					}
					xCopy := append([]float32{}, x...)
					idx := make([]int32, s.M)
					for r := range idx {
						idx[r] = int32(rng.IntN(tokens)) // rows gathered in any order, repeats allowed
					}
					n0, n1 := 0, s.N
					if part && s.N > 2 {
						n0, n1 = 1, s.N-1
					}
					buf, h := padded(s.M * s.N)
					gateUp(h, x, idx, gate, up, n0, n1)
					checkGuards(t, buf, s.M*s.N)
					require.Equal(t, xCopy, x, "input modified")
					for r := 0; r < s.M; r++ {
						xr := xCopy[int(idx[r])*s.K:][:s.K]
						for n := 0; n < s.N; n++ {
							got := h[r*s.N+n]
							if n < n0 || n >= n1 {
								require.Equal(t, guard, got, "column %d outside [%d, %d) written", n, n0, n1)
								continue
							}
							var gs, us, mag float64
							for k, v := range xr {
								gs += float64(v) * g64[n][k]
								us += float64(v) * u64[n][k]
								mag += math.Abs(float64(v)) * (math.Abs(g64[n][k]) + math.Abs(u64[n][k]))
							}
							want := silu(gs) * us
							relClose(t, want, got, mag*(1+math.Abs(us)+math.Abs(gs)), "row %d col %d", r, n)
						}
					}
				})
			}
		}
	}
}

// TestDown runs the Down contract over every shape and dtype, with and
// without routing weights.
func TestDown(t *testing.T, down DownFunc) {
	for _, dt := range DTypes {
		for _, s := range Shapes {
			for _, withScale := range []bool{false, true} {
				t.Run(fmt.Sprintf("%v/M=%d,N=%d,K=%d,scale=%v", dt, s.M, s.N, s.K, withScale), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(s.M*5+s.N*11+s.K), uint64(dt)+9))
					w, w64 := Weights(rng, dt, s.N, s.K)
					h := make([]float32, s.M*s.K)
					for i := range h {
						h[i] = float32(rng.Float64()*2 - 1)
					}
					hCopy := append([]float32{}, h...)
					var scale []float32
					if withScale {
						scale = make([]float32, s.M)
						for i := range scale {
							scale[i] = float32(rng.Float64())
						}
					}
					n0, n1 := 0, s.N
					if withScale && s.N > 3 {
						n0, n1 = 2, s.N-1
					}
					buf, out := padded(s.M * s.N)
					down(out, h, w, scale, n0, n1)
					checkGuards(t, buf, s.M*s.N)
					require.Equal(t, hCopy, h, "input modified")
					for r := 0; r < s.M; r++ {
						for n := 0; n < s.N; n++ {
							got := out[r*s.N+n]
							if n < n0 || n >= n1 {
								require.Equal(t, guard, got, "column %d outside [%d, %d) written", n, n0, n1)
								continue
							}
							var sum, mag float64
							for k := 0; k < s.K; k++ {
								sum += float64(h[r*s.K+k]) * w64[n][k]
								mag += math.Abs(float64(h[r*s.K+k]) * w64[n][k])
							}
							if scale != nil {
								sum *= float64(scale[r])
								mag *= float64(scale[r])
							}
							relClose(t, sum, got, mag, "row %d col %d", r, n)
						}
					}
				})
			}
		}
	}
}

// TestNaN: a NaN in one activation row makes that row's outputs NaN and
// leaves every other row finite.
func TestNaN(t *testing.T, gateUp GateUpFunc, down DownFunc) {
	rng := rand.New(rand.NewPCG(1, 2))
	const M, N, K = 5, 6, 40
	for _, dt := range DTypes {
		gate, _ := Weights(rng, dt, N, K)
		up, _ := Weights(rng, dt, N, K)
		w, _ := Weights(rng, dt, N, K)
		x := make([]float32, M*K)
		for i := range x {
			x[i] = float32(rng.Float64())
		}
		for _, at := range []int{0, 17, K - 1} { // in the vector body and in the tail
			xs := append([]float32(nil), x...)
			xs[2*K+at] = float32(math.NaN())
			h := make([]float32, M*N)
			gateUp(h, xs, []int32{0, 1, 2, 3, 4}, gate, up, 0, N)
			for r := 0; r < M; r++ {
				for n := 0; n < N; n++ {
					require.Equal(t, r == 2, math.IsNaN(float64(h[r*N+n])), "%v gate/up row %d col %d, NaN at k=%d", dt, r, n, at)
				}
			}
			hk := make([]float32, M*K)
			copy(hk, xs)
			out := make([]float32, M*N)
			down(out, hk, w, nil, 0, N)
			for r := 0; r < M; r++ {
				for n := 0; n < N; n++ {
					require.Equal(t, r == 2, math.IsNaN(float64(out[r*N+n])), "%v down row %d col %d, NaN at k=%d", dt, r, n, at)
				}
			}
		}
	}
}

// E2M1 is an OCP FP4 (e2m1) nibble's value from the format's definition
// (moetest.E2M1).
func E2M1(n uint8) float64 { return moetest.E2M1(n) }

// MXFP4Weights returns a random MXFP4 [rows, cols] matrix (cols a multiple
// of 32, scales' exponents around 2^-4) and its values e2m1 × 2^(e−127).
func MXFP4Weights(rng *rand.Rand, rows, cols int) (kernels.Matrix, [][]float64) {
	blocks := make([]uint8, rows*cols/2)
	scales := make([]uint8, rows*cols/32)
	for i := range blocks {
		blocks[i] = uint8(rng.IntN(256))
	}
	for i := range scales {
		scales[i] = uint8(127 - 6 + rng.IntN(5))
	}
	vals := make([][]float64, rows)
	for r := range vals {
		vals[r] = make([]float64, cols)
		for c := range vals[r] {
			n := blocks[(r*cols+c)/2] >> (4 * (c % 2)) & 15
			vals[r][c] = E2M1(n) * math.Ldexp(1, int(scales[r*cols/32+c/32])-127)
		}
	}
	m, err := kernels.NewMXFP4(rows, cols, blocks, scales)
	if err != nil {
		panic(err)
	}
	return m, vals
}

// INT4Weights returns a random symmetric int4 [rows, cols] matrix in
// groups of group along a row and its values (field − 8) × scale.
func INT4Weights(rng *rand.Rand, rows, cols, group int) (kernels.Matrix, [][]float64) {
	packed := make([]uint8, rows*cols/2)
	scales := make([]float32, rows*cols/group)
	for i := range packed {
		packed[i] = uint8(rng.IntN(256))
	}
	for i := range scales {
		scales[i] = float32(rng.Float64() * 0.05)
	}
	vals := make([][]float64, rows)
	for r := range vals {
		vals[r] = make([]float64, cols)
		for c := range vals[r] {
			field := int(packed[(r*cols+c)/2] >> (4 * (c % 2)) & 15)
			vals[r][c] = float64(field-8) * float64(scales[r*cols/group+c/group])
		}
	}
	m, err := kernels.NewINT4(rows, cols, group, packed, scales)
	if err != nil {
		panic(err)
	}
	return m, vals
}

// UINT4Weights returns a random unsigned 4-bit [rows, cols] matrix in
// groups of group along a row, with offsets when offsets is set, and its
// values nibble × scale (+ offset) in float64. The scales carry full fp32
// mantissas, so that nibble × scale + offset rounds.
func UINT4Weights(rng *rand.Rand, rows, cols, group int, offsets bool) (kernels.Matrix, [][]float64) {
	packed := make([]uint8, rows*cols/2)
	for i := range packed {
		packed[i] = uint8(rng.IntN(256))
	}
	scales, offs := groupParams(rng, rows*cols/group, offsets)
	vals := make([][]float64, rows)
	for r := range vals {
		vals[r] = make([]float64, cols)
		for c := range vals[r] {
			n := packed[(r*cols+c)/2] >> (4 * (c % 2)) & 15
			vals[r][c] = codeValue(float64(n), scales, offs, r*cols/group+c/group)
		}
	}
	m, err := kernels.NewUINT4(rows, cols, group, packed, scales, offs)
	if err != nil {
		panic(err)
	}
	return m, vals
}

// INT8Weights is UINT4Weights for signed 8-bit codes.
func INT8Weights(rng *rand.Rand, rows, cols, group int, offsets bool) (kernels.Matrix, [][]float64) {
	return INT8CodeWeights(rng, rows, cols, group, -128, 256, offsets)
}

// INT8CodeWeights is INT8Weights with codes uniform in [lo, lo+n): of 5
// or 6 bits (GGUF's Q5_0, Q5_1 and Q6_K codes), which kernels.Pack holds
// in that many.
func INT8CodeWeights(rng *rand.Rand, rows, cols, group, lo, n int, offsets bool) (kernels.Matrix, [][]float64) {
	codes := make([]int8, rows*cols)
	for i := range codes {
		codes[i] = int8(lo + rng.IntN(n))
	}
	scales, offs := groupParams(rng, rows*cols/group, offsets)
	vals := make([][]float64, rows)
	for r := range vals {
		vals[r] = make([]float64, cols)
		for c := range vals[r] {
			vals[r][c] = codeValue(float64(codes[r*cols+c]), scales, offs, r*cols/group+c/group)
		}
	}
	m, err := kernels.NewINT8(rows, cols, group, codes, scales, offs)
	if err != nil {
		panic(err)
	}
	return m, vals
}

// KQuantWeights returns a random [rows, cols] matrix in groups of group
// whose scales (and offsets) are factored as GGUF's K-quants factor them
// (kernels.WithSuperScales: d·sc and −dmin·m, super-blocks of up to 8
// groups): UINT4 codes (Q4_K's, with offsets) when dt is kernels.UINT4,
// else INT8 codes uniform in [lo, lo+n) (Q5_K's with offsets, Q6_K's
// without); and its values in float64.
func KQuantWeights(rng *rand.Rand, dt kernels.DType, rows, cols, group, lo, n int, offsets bool) (kernels.Matrix, [][]float64) {
	gc := cols / group
	per := 1
	for per < 8 && gc%(2*per) == 0 {
		per *= 2
	}
	groups := rows * gc
	d, sc := make([]float32, groups/per), make([]int8, groups)
	var dmin []float32
	var mins []int8
	for i := range d {
		d[i] = float32(rng.Float64()*0.001 + 1e-4)
	}
	for i := range sc {
		sc[i] = int8(rng.IntN(128) - 64)
	}
	scales, offs := make([]float32, groups), []float32(nil)
	sb := func(i int) int { return i/gc*(gc/per) + i%gc/per }
	for i := range scales {
		scales[i] = d[sb(i)] * float32(sc[i])
	}
	if offsets {
		dmin, mins, offs = make([]float32, groups/per), make([]int8, groups), make([]float32, groups)
		for i := range dmin {
			dmin[i] = float32(rng.Float64()*0.002 + 1e-4)
		}
		for i := range mins {
			mins[i] = int8(rng.IntN(64))
			offs[i] = -(dmin[sb(i)] * float32(mins[i]))
		}
	}
	codes := make([]int, rows*cols)
	for i := range codes {
		if dt == kernels.UINT4 {
			codes[i] = rng.IntN(16)
		} else {
			codes[i] = lo + rng.IntN(n)
		}
	}
	vals := make([][]float64, rows)
	for r := range vals {
		vals[r] = make([]float64, cols)
		for c := range vals[r] {
			vals[r][c] = codeValue(float64(codes[r*cols+c]), scales, offs, r*gc+c/group)
		}
	}
	var m kernels.Matrix
	var err error
	if dt == kernels.UINT4 {
		packed := make([]uint8, rows*cols/2)
		for i, c := range codes {
			packed[i/2] |= uint8(c) << (4 * (i % 2))
		}
		m, err = kernels.NewUINT4(rows, cols, group, packed, scales, offs)
	} else {
		i8 := make([]int8, len(codes))
		for i, c := range codes {
			i8[i] = int8(c)
		}
		m, err = kernels.NewINT8(rows, cols, group, i8, scales, offs)
	}
	if err == nil {
		m, err = kernels.WithSuperScales(m, per, d, dmin, sc, mins)
	}
	if err != nil {
		panic(err)
	}
	return m, vals
}

// groupParams returns n random scales (positive and negative, up to
// 0.01) and, when offsets is set, n offsets (up to ±0.05); nil otherwise.
func groupParams(rng *rand.Rand, n int, offsets bool) (scales, offs []float32) {
	scales = make([]float32, n)
	for i := range scales {
		scales[i] = float32((rng.Float64()*2 - 1) * 0.01)
	}
	if offsets {
		offs = make([]float32, n)
		for i := range offs {
			offs[i] = float32((rng.Float64()*2 - 1) * 0.05)
		}
	}
	return scales, offs
}

// codeValue is code × scales[g] + offs[g] (offs nil: zero), exactly.
func codeValue(code float64, scales, offs []float32, g int) float64 {
	v := code * float64(scales[g])
	if offs != nil {
		v += float64(offs[g])
	}
	return v
}
