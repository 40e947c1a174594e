package kernels_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/kernels"
)

// TestScoreRowsWeighRows: the in-place attention kernels give the bits of
// the widening way on every implementation that has them: ScoreRows those
// of Down over the keys widened to fp32 (SpanRowsF32), WeighRows those of
// GEMMRows over the values packed (PackRows), also when its chain is
// continued over a range split in two. Every dtype and head dimension,
// 1 to 9 query rows, runs of keys of every length mod 4; the rows past
// rows do not change the others; bad shapes are errors.
func TestScoreRowsWeighRows(t *testing.T) {
	const rowsCache, cols = 45, 2*576 + 24
	ms := threeDTypes(t, rowsCache, cols, 11, 1)
	ran := false
	forEachImpl(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(3, 4))
		for _, m := range ms {
			for _, d := range []int{64, 128, 256, 512, 576} {
				if !kernels.InPlaceAttention(m.DType, d, d) {
					require.Error(t, m.ScoreRows(make([]float32, 16), 4, make([]float32, 4*d), d, 1, 0, 4, 0), "no kernel: an error")
					continue
				}
				ran = true
				for _, c := range []struct{ rows, r0, n, c0 int }{{1, 0, 45, 0}, {8, 3, 37, 17}, {4, 1, 1, 256}, {9, 40, 5, 8}, {5, 2, 18, 100}, {2, 0, 3, 1}, {3, 44, 1, 0}} {
					if c.c0+d > cols {
						continue
					}
					name := fmt.Sprintf("%v d %d rows %d from %d+%d column %d", m.DType, d, c.rows, c.r0, c.n, c.c0)
					rows8 := (c.rows + 7) &^ 7
					q := make([]float32, rows8*d)
					for i := range q {
						q[i] = float32(rng.NormFloat64())
					}
					// Down over the keys widened to fp32.
					keys := make([]float32, c.n*d)
					m.SpanRowsF32(c.r0, c.n, c.c0, d, keys)
					km, err := kernels.NewF32(c.n, d, keys)
					require.NoError(t, err)
					want := make([]float32, c.rows*c.n)
					kernels.Down(want, q[:c.rows*d], km, nil, 0, c.n)
					ldo := c.n + 3
					got := make([]float32, rows8*ldo)
					require.NoError(t, m.ScoreRows(got, ldo, q, d, c.rows, c.r0, c.n, c.c0), name)
					for i := range c.rows {
						for j := range c.n {
							require.Equal(t, math.Float32bits(want[i*c.n+j]), math.Float32bits(got[i*ldo+j]), "%s: score [%d, %d]", name, i, j)
						}
					}

					// GEMMRows over the values packed, the chain in one
					// call and in two.
					ldp := c.n + 1
					p := make([]float32, rows8*ldp)
					for i := range p {
						p[i] = float32(rng.Float64())
					}
					pk := kernels.NewPackedF32(d, c.n, kernels.Matrix{})
					require.NoError(t, pk.PackRows(m, c.r0, c.n, c.c0, 0))
					dense := make([]float32, c.rows*c.n)
					for i := range c.rows {
						copy(dense[i*c.n:], p[i*ldp:][:c.n])
					}
					wantV := make([]float32, c.rows*d)
					kernels.GEMMRows(wantV, dense, nil, pk, nil, 0, d)
					part := make([]float32, rows8*d)
					require.NoError(t, m.WeighRows(part, d, p, ldp, c.rows, c.r0, c.n, c.c0, false), name)
					split := make([]float32, rows8*d)
					h := c.n / 2
					require.NoError(t, m.WeighRows(split, d, p, ldp, c.rows, c.r0, h, c.c0, false), name)
					require.NoError(t, m.WeighRows(split, d, p[h:], ldp, c.rows, c.r0+h, c.n-h, c.c0, false), name)
					// Added to an output in one rounding.
					o := make([]float32, rows8*d)
					for i := range o {
						o[i] = float32(rng.NormFloat64())
					}
					o0 := append([]float32(nil), o...)
					require.NoError(t, m.WeighRows(o, d, p, ldp, c.rows, c.r0, c.n, c.c0, true), name)
					for i := range c.rows {
						for x := range d {
							require.Equal(t, math.Float32bits(wantV[i*d+x]), math.Float32bits(part[i*d+x]), "%s: weighed [%d, %d]", name, i, x)
							require.Equal(t, math.Float32bits(wantV[i*d+x]), math.Float32bits(split[i*d+x]), "%s: weighed in two [%d, %d]", name, i, x)
							require.Equal(t, math.Float32bits(o0[i*d+x]+wantV[i*d+x]), math.Float32bits(o[i*d+x]), "%s: added [%d, %d]", name, i, x)
						}
					}
				}
				// Shapes out of range.
				q := make([]float32, 4*d)
				require.ErrorContains(t, m.ScoreRows(make([]float32, 16), 4, q, d, 1, rowsCache-2, 4, 0), "against rows 43+4")
				require.ErrorContains(t, m.ScoreRows(make([]float32, 16), 4, q[:d], d, 1, 0, 4, 0), "ScoreRows of 1 rows")
				require.ErrorContains(t, m.ScoreRows(make([]float32, 15), 4, q, d, 1, 0, 4, 0), "out 15 values")
				require.ErrorContains(t, m.WeighRows(make([]float32, 4*d), d, make([]float32, 16), 4, 1, 0, 4, cols-d+1, false), fmt.Sprintf("columns %d+", cols-d+1))
				require.ErrorContains(t, m.WeighRows(make([]float32, 4*d-1), d, make([]float32, 16), 4, 1, 0, 4, 0, false), fmt.Sprintf("part %d of %d", 4*d-1, d))
				require.ErrorContains(t, m.WeighRows(make([]float32, 4*d), d, make([]float32, 15), 4, 1, 0, 4, 0, true), "p 15 values")
			}
		}
		require.False(t, kernels.InPlaceAttention(kernels.F32, 96, 128), "a head dimension without a kernel")
		require.False(t, kernels.InPlaceAttention(kernels.MXFP4, 128, 128), "a quantized cache")
	})
	if !ran {
		t.Log("no implementation here has the in-place attention kernels")
	}
}

// TestMaxMin: the largest and smallest values and finiteness of runs of
// every length from 1 to 70, against a loop, on every implementation,
// with a NaN or an infinity anywhere.
func TestMaxMin(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	forEachImpl(t, func(t *testing.T) {
		for n := 1; n <= 70; n++ {
			x := make([]float32, n)
			for i := range x {
				x[i] = float32(rng.NormFloat64() * 100)
			}
			hi, lo := x[0], x[0]
			for _, v := range x {
				if v > hi {
					hi = v
				}
				if v < lo {
					lo = v
				}
			}
			gh, gl, ok := kernels.MaxMin(x)
			require.True(t, ok, "n %d", n)
			require.Equal(t, hi, gh, "n %d", n)
			require.Equal(t, lo, gl, "n %d", n)
			for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
				i := rng.IntN(n)
				v := x[i]
				x[i] = bad
				_, _, ok := kernels.MaxMin(x)
				require.False(t, ok, "n %d: %v at %d", n, bad, i)
				x[i] = v
			}
		}
	})
}

// TestNonFiniteLong: NonFinite finds the first NaN or infinity in runs
// long enough for its SIMD pass (1024 at a time), wherever it lies, and
// reports none in a finite run, on every implementation.
func TestNonFiniteLong(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	forEachImpl(t, func(t *testing.T) {
		for _, n := range []int{1023, 1024, 1025, 3000, 4096} {
			x := make([]float32, n)
			for i := range x {
				x[i] = float32(rng.NormFloat64() * 1e30)
			}
			require.Equal(t, -1, kernels.NonFinite(x), "n %d", n)
			for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(-1))} {
				i, j := rng.IntN(n), rng.IntN(n)
				i, j = min(i, j), max(i, j)
				x[i], x[j] = bad, bad
				require.Equal(t, i, kernels.NonFinite(x), "n %d: %v at %d and %d", n, bad, i, j)
				x[i], x[j] = 1, 1
			}
		}
	})
}
