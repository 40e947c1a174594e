package kernels

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/half"
)

// bdotReference is the bf16-dot mode written again from its definition
// (see BF16Dot): row x (fp32) against row n of the bf16 matrix m.
func bdotReference(x []float32, m Matrix, n int) float32 {
	bf := func(v float32) float32 { return half.BF16ToF32(half.F32ToBF16(v)) }
	flush := func(v float32) float32 {
		if math.Abs(float64(v)) < 0x1p-126 {
			return float32(math.Copysign(0, float64(v)))
		}
		return v
	}
	var acc float32
	for j := 0; j < len(x); j += 2 {
		acc = flush(acc)
		acc = flush(fma32(flush(bf(x[j+1])), flush(m.At(n, j+1)), acc))
		acc = flush(fma32(flush(bf(x[j])), flush(m.At(n, j)), acc))
	}
	return acc
}

// TestBF16Dot: on every implementation, PackBF16Dot keeps the weights'
// values; GateUp and Down in the mode give the reference's bits (the
// definition written again), subnormal activations and weights included,
// a row's bits not depending on the rows beside it; and the mode's error
// against float64 arithmetic on the weights stays within what rounding
// the activations to bf16 makes (2^-8 of the products' magnitude).
func TestBF16Dot(t *testing.T) {
	for _, impl := range Implementations() {
		t.Run(impl, func(t *testing.T) {
			restore, err := Use(impl)
			require.NoError(t, err)
			defer restore()
			for _, s := range []struct{ M, N, K int }{{1, 37, 256}, {3, 64, 384}, {7, 20, 130}, {13, 16, 2048}, {9, 50, 96}, {64, 40, 64}} {
				rng := rand.New(rand.NewPCG(uint64(s.M), uint64(s.K)))
				w := make([]uint16, s.N*s.K)
				for i := range w {
					w[i] = half.F32ToBF16(float32(rng.NormFloat64() * 0.05))
					if rng.IntN(50) == 0 {
						w[i] = uint16(rng.IntN(1<<16)) &^ 0x7F80 // a subnormal (or zero)
					}
				}
				m, err := NewHalf(BF16, s.N, s.K, w)
				require.NoError(t, err)
				x := make([]float32, s.M*s.K)
				for i := range x {
					x[i] = float32(rng.NormFloat64())
					if rng.IntN(50) == 0 {
						x[i] = float32(rng.NormFloat64() * 0x1p-130) // subnormal in bf16
					}
				}
				idx := make([]int32, s.M)
				for i := range idx {
					idx[i] = int32(i)
				}
				for _, src := range []Matrix{m, Pack(m)} {
					d, err := PackBF16Dot(src)
					require.NoError(t, err)
					require.Equal(t, BF16Dot, d.Numerics())
					for n := 0; n < s.N; n += 5 {
						for k := 0; k < s.K; k += 3 {
							require.Equal(t, m.At(n, k), d.At(n, k))
						}
					}
					o := make([]float32, s.M*s.N)
					Down(o, x, d, nil, 0, s.N)
					h := make([]float32, s.M*s.N)
					GateUp(h, x, idx, d, d, 0, s.N)
					for n := 0; n < s.N; n++ {
						for r := 0; r < s.M; r++ {
							xr := x[r*s.K:][:s.K]
							want := bdotReference(xr, m, n)
							require.Equal(t, math.Float32bits(want), math.Float32bits(o[r*s.N+n]), "M=%d K=%d row %d col %d", s.M, s.K, r, n)
							require.Equal(t, math.Float32bits(SwiGLU(want, want)), math.Float32bits(h[r*s.N+n]))
							var exact, mag float64
							for k, v := range xr {
								exact += float64(v) * float64(m.At(n, k))
								mag += math.Abs(float64(v) * float64(m.At(n, k)))
							}
							require.InDelta(t, exact, float64(want), 0x1p-8*mag+1e-30)
						}
					}
					// Through the grouped GEMM (its rows prepared once a call): the same bits.
					g := make([]float32, s.M*s.N)
					require.NoError(t, GroupedGEMM(context.Background(), 2, x, []GEMMGroup{{B: d, Rows: idx, Out: g}}))
					require.Equal(t, o, g, "grouped")
					one := make([]float32, s.N)
					Down(one, x[(s.M-1)*s.K:], d, nil, 0, s.N)
					require.Equal(t, o[(s.M-1)*s.N:], one, "one row alone")
				}
			}
		})
	}
}

// TestBF16DotRefused: the mode is taken only for bf16 weights.
func TestBF16DotRefused(t *testing.T) {
	f, err := NewF32(2, 32, make([]float32, 64))
	require.NoError(t, err)
	_, err = PackBF16Dot(f)
	require.ErrorContains(t, err, "bf16dot numerics need BF16 weights, have F32")
	b, err := NewHalf(BF16, 1, 3, make([]uint16, 3))
	require.NoError(t, err)
	_, err = PackBF16Dot(b)
	require.ErrorContains(t, err, "need an even column count, have 3")
	if p, ok := BF16DotPeak(1, 1e7); ok {
		require.Greater(t, p, 1.0)
	}
}
