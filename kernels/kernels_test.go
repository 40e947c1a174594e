package kernels_test

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/kernels/kerneltest"
)

// forEachImpl runs f once per implementation this machine can run.
func forEachImpl(t *testing.T, f func(t *testing.T)) {
	for _, name := range kernels.Implementations() {
		t.Run(name, func(t *testing.T) {
			restore, err := kernels.Use(name)
			require.NoError(t, err)
			defer restore()
			f(t)
		})
	}
}

func TestAllImplementations(t *testing.T) {
	t.Logf("implementations: %v (default %s)", kernels.Implementations(), kernels.Implementation())
	forEachImpl(t, func(t *testing.T) {
		t.Run("GateUp", func(t *testing.T) { kerneltest.TestGateUp(t, kernels.GateUp) })
		t.Run("Down", func(t *testing.T) { kerneltest.TestDown(t, kernels.Down) })
		t.Run("NaN", func(t *testing.T) { kerneltest.TestNaN(t, kernels.GateUp, kernels.Down) })
		t.Run("GroupedFFN", func(t *testing.T) {
			kerneltest.TestGroupedFFN(t, func(x []float32, groups []kernels.FFNGroup) error {
				return kernels.GroupedFFN(context.Background(), 0, x, groups, nil)
			}, kerneltest.GroupedOptions{})
		})
		// The same contracts on weights packed for the outer-product kernels.
		gateUp := func(h, x []float32, idx []int32, gate, up kernels.Matrix, n0, n1 int) {
			kernels.GateUp(h, x, idx, kernels.Pack(gate), kernels.Pack(up), n0, n1)
		}
		down := func(out, h []float32, w kernels.Matrix, scale []float32, n0, n1 int) {
			kernels.Down(out, h, kernels.Pack(w), scale, n0, n1)
		}
		t.Run("PackedGateUp", func(t *testing.T) { kerneltest.TestGateUp(t, gateUp) })
		t.Run("PackedDown", func(t *testing.T) { kerneltest.TestDown(t, down) })
		t.Run("PackedNaN", func(t *testing.T) { kerneltest.TestNaN(t, gateUp, down) })
		t.Run("PackedGroupedFFN", func(t *testing.T) {
			kerneltest.TestGroupedFFN(t, func(x []float32, groups []kernels.FFNGroup) error {
				packed := make([]kernels.FFNGroup, len(groups))
				for i, g := range groups {
					g.Gate, g.Up, g.Down = kernels.Pack(g.Gate), kernels.Pack(g.Up), kernels.Pack(g.Down)
					packed[i] = g
				}
				return kernels.GroupedFFN(context.Background(), 0, x, packed, nil)
			}, kerneltest.GroupedOptions{})
		})
	})
}

// TestMixedPacking: gate and up packed differently still give GateUp's
// result (on the generic path).
func TestMixedPacking(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	gate, _ := kerneltest.Weights(rng, kernels.BF16, 20, 33)
	up, _ := kerneltest.Weights(rng, kernels.BF16, 20, 33)
	x := make([]float32, 3*33)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	idx := []int32{2, 0, 1}
	want := make([]float32, 3*20)
	restore, err := kernels.Use("generic")
	require.NoError(t, err)
	kernels.GateUp(want, x, idx, gate, up, 0, 20)
	restore()
	got := make([]float32, 3*20)
	kernels.GateUp(got, x, idx, gate, kernels.Pack(up), 0, 20)
	require.Equal(t, want, got)
}

func TestUseUnknown(t *testing.T) {
	_, err := kernels.Use("neon9000")
	require.ErrorContains(t, err, `implementation "neon9000" is not available on this machine`)
	restore, err := kernels.Use("generic")
	require.NoError(t, err)
	require.Equal(t, "generic", kernels.Implementation())
	restore()
}

// FuzzSIMDAgainstGeneric compares every SIMD implementation with the
// generic one on fuzzed shapes and data.
func FuzzSIMDAgainstGeneric(f *testing.F) {
	f.Add(uint64(1), uint8(3), uint8(5), uint8(40), uint8(1))
	f.Add(uint64(2), uint8(1), uint8(1), uint8(1), uint8(0))
	f.Add(uint64(3), uint8(17), uint8(9), uint8(255), uint8(2))
	f.Fuzz(func(t *testing.T, seed uint64, m, n, k, dt uint8) {
		M, N, K := int(m%32), int(n%32)+1, int(k)+1
		dtype := kernels.DType(dt%3) + kernels.F32
		rng := rand.New(rand.NewPCG(seed, 1))
		gate, _ := kerneltest.Weights(rng, dtype, N, K)
		up, _ := kerneltest.Weights(rng, dtype, N, K)
		x := make([]float32, M*K)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		idx := make([]int32, M)
		for i := range idx {
			idx[i] = int32(i)
		}
		run := func(name string, packed bool) ([]float32, []float32) {
			restore, err := kernels.Use(name)
			require.NoError(t, err)
			defer restore()
			g, u := gate, up
			if packed {
				g, u = kernels.Pack(gate), kernels.Pack(up)
			}
			h := make([]float32, M*N)
			kernels.GateUp(h, x, idx, g, u, 0, N)
			out := make([]float32, M*N)
			kernels.Down(out, x, g, nil, 0, N)
			return h, out
		}
		gh, gout := run("generic", false)
		// Tolerances scale with Σ|x·w|, the size of the rounding errors.
		mag := func(w kernels.Matrix, r, c int) float64 {
			var s float64
			for k := 0; k < K; k++ {
				s += math.Abs(float64(x[r*K+k] * w.At(c, k)))
			}
			return s
		}
		for _, name := range kernels.Implementations()[1:] {
			for _, packed := range []bool{false, true} {
				h, out := run(name, packed)
				for i := range h {
					r, c := i/N, i%N
					mg, mu := mag(gate, r, c), mag(up, r, c)
					require.InDelta(t, gh[i], h[i], 1e-5*(mg+mu)*(1+mg+mu), "%s packed=%v gate/up %d", name, packed, i)
					require.InDelta(t, gout[i], out[i], 1e-5*mg+1e-30, "%s packed=%v down %d", name, packed, i)
				}
			}
		}
	})
}

// TestSpanRowsF32: runs of columns of several rows, widened, are the
// matrix's values (At), on every implementation: bf16 and fp16 runs of
// whole 16s (the SIMD widening) and of other lengths, and fp32.
func TestSpanRowsF32(t *testing.T) {
	ms := threeDTypes(t, 9, 80, 3, 100)
	forEachImpl(t, func(t *testing.T) {
		for _, m := range ms {
			for _, c := range []struct{ r0, n, c0, w int }{{0, 9, 0, 80}, {2, 5, 16, 32}, {1, 3, 48, 32}, {0, 4, 3, 20}, {8, 1, 64, 16}, {4, 2, 7, 1}} {
				dst := make([]float32, c.n*c.w+1)
				dst[c.n*c.w] = 42 // past the end: untouched
				m.SpanRowsF32(c.r0, c.n, c.c0, c.w, dst)
				for r := range c.n {
					for x := range c.w {
						require.Equal(t, m.At(c.r0+r, c.c0+x), dst[r*c.w+x], "%v rows %d+%d columns %d+%d: [%d, %d]", m.DType, c.r0, c.n, c.c0, c.w, r, x)
					}
				}
				require.Equal(t, float32(42), dst[c.n*c.w])
			}
		}
	})
}

// TestPackRows: rows of a row-major matrix's column run, packed as k steps
// of an fp32 panel matrix, are the source's values (At), on every
// implementation and in every source dtype, panels whole or not; ranges
// outside either matrix are errors.
func TestPackRows(t *testing.T) {
	ms := threeDTypes(t, 12, 70, 5, 1)
	f32 := ms[0]
	forEachImpl(t, func(t *testing.T) {
		for _, src := range ms {
			for _, n := range []int{32, 21} { // whole panels, and a partial one
				p := kernels.NewPackedF32(n, 10, kernels.Matrix{})
				require.NoError(t, p.PackRows(src, 5, 7, 38, 3)) // k steps 3…9 from rows 5…11, columns 38…
				require.NoError(t, p.PackRows(src, 0, 3, 38, 0)) // k steps 0…2 from rows 0…2
				for x := range n {
					for k := range 10 {
						r := k - 3 + 5
						if k < 3 {
							r = k
						}
						require.Equal(t, src.At(r, 38+x), p.At(x, k), "%v n %d [%d, %d]", src.DType, n, x, k)
					}
				}
			}
		}
	})
	p := kernels.NewPackedF32(32, 10, kernels.Matrix{})
	require.ErrorContains(t, p.PackRows(f32, 5, 8, 0, 0), "kernels: PackRows of rows 5+8")
	require.ErrorContains(t, p.PackRows(f32, 0, 4, 0, 8), "into k steps 8+")
	require.ErrorContains(t, p.PackRows(f32, 0, 4, 50, 0), "columns 50+32")
	require.Error(t, f32.PackRows(f32, 0, 1, 0, 0), "a row-major destination")
}

// threeDTypes is one random matrix [rows, cols] (normal values times
// scale, from seed) in f32, bf16 and f16, the last two rounded from the
// first.
func threeDTypes(t *testing.T, rows, cols int, seed uint64, scale float64) []kernels.Matrix {
	rng := rand.New(rand.NewPCG(seed, seed+1))
	vals := make([]float32, rows*cols)
	for i := range vals {
		vals[i] = float32(rng.NormFloat64() * scale)
	}
	bf16s, f16s := make([]uint16, len(vals)), make([]uint16, len(vals))
	for i, v := range vals {
		bf16s[i], f16s[i] = half.F32ToBF16(v), half.F32ToF16(v)
	}
	f32, err := kernels.NewF32(rows, cols, vals)
	require.NoError(t, err)
	bf16, err := kernels.NewHalf(kernels.BF16, rows, cols, bf16s)
	require.NoError(t, err)
	f16, err := kernels.NewHalf(kernels.F16, rows, cols, f16s)
	require.NoError(t, err)
	return []kernels.Matrix{f32, bf16, f16}
}
