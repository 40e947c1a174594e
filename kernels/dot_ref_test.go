package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/half"
)

// fma32 is a·b + c rounded once to float32, exactly as the FMA instruction
// does: the product is exact in float64, and a sum that lands on a float32
// rounding midpoint is resolved with the sum's exact error.
func fma32(a, b, c float32) float32 {
	p := float64(a) * float64(b)
	cf := float64(c)
	s := p + cf
	r := float32(s)
	if math.IsInf(s, 0) || math.IsNaN(s) || float64(r) == s {
		return r
	}
	other := math.Nextafter32(r, float32(math.Copysign(math.Inf(1), s-float64(r))))
	if s-float64(r) != float64(other)-s { // not a midpoint: one rounding is right
		return r
	}
	bb := s - p
	err := (p - (s - bb)) + (cf - bb) // exact: p + cf = s + err
	switch {
	case err > 0:
		return max(r, other)
	case err < 0:
		return min(r, other)
	}
	return r
}

// laneDot emulates the assembly kernels' order: lane j accumulates
// k ≡ j (mod lanes) with FMA over the vector part, the lanes are added by
// halving, then the tail adds one rounded product at a time.
func laneDot(a, b []float32, lanes int) float32 {
	K := len(a)
	kMain := K - K%lanes
	acc := make([]float32, lanes)
	for k := 0; k < kMain; k++ {
		acc[k%lanes] = fma32(a[k], b[k], acc[k%lanes])
	}
	for w := lanes / 2; w >= 1; w /= 2 {
		for j := 0; j < w; j++ {
			acc[j] += acc[j+w]
		}
	}
	s := acc[0]
	for k := kMain; k < K; k++ {
		s += float32(a[k] * b[k])
	}
	return s
}

func TestFMA32(t *testing.T) {
	// (1+2^-12)² = 1 + 2^-11 + 2^-24 is exact in float64 and a float32
	// midpoint; a tiny addend, lost in a float64 sum, decides the rounding.
	a := float32(1 + 0x1p-12)
	require.Equal(t, float32(1+0x1p-11+0x1p-23), fma32(a, a, 0x1p-80))
	require.Equal(t, float32(1+0x1p-11), fma32(a, a, -0x1p-80))
	require.Equal(t, float32(1+0x1p-11), fma32(a, a, 0)) // a true tie: to even
	require.Equal(t, float32(7), fma32(2, 3, 1))
	require.True(t, math.IsNaN(float64(fma32(float32(math.Inf(1)), 0, 1))))
}

// TestKernelsMatchLaneOrder checks every assembly kernel bit for bit
// against the emulation of its order, for every row count and dtype.
func TestKernelsMatchLaneOrder(t *testing.T) {
	if len(simds) == 0 {
		t.Skip("no SIMD implementation on this machine")
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, s := range simds {
		for dt := F32; dt <= F16; dt++ {
			for mr := 1; mr <= s.maxMR; mr++ {
				for _, K := range []int{s.lanes, 3 * s.lanes, 2048} {
					t.Run(fmt.Sprintf("%s/%v/mr=%d/K=%d", s.name, dt, mr, K), func(t *testing.T) {
						var a [maxKernelRows]*float32
						rows := make([][]float32, mr)
						for m := range rows {
							rows[m] = randRow(rng, K)
							a[m] = &rows[m][0]
						}
						var b [4]*byte
						wide := make([][]float32, 4)
						for n := range b {
							w, m := randWeights(rng, dt, K)
							wide[n] = w
							b[n] = m.rowPtr(0)
						}
						if mr <= s.maxMR8 {
							var b8 [8]*byte
							for n := range b8 {
								b8[n] = b[n%4]
							}
							var out8 [8 * maxKernelRows]float32
							s.kern8[dt][mr](&a, &b8, &b8, K, &out8)
							for m := 0; m < mr; m++ {
								for n := 0; n < 8; n++ {
									want := laneDot(rows[m], wide[n%4], s.lanes)
									require.Equal(t, math.Float32bits(want), math.Float32bits(out8[8*m+n]), "%d×8 row %d col %d", mr, m, n)
								}
							}
						}
						var out [4 * maxKernelRows]float32
						var lane laneAcc
						s.kern[dt][mr](&a, &b, K, &lane, 2, &out)
						for m := 0; m < mr; m++ {
							for n := 0; n < 4; n++ {
								want := laneDot(rows[m], wide[n], s.lanes)
								require.Equal(t, math.Float32bits(want), math.Float32bits(out[4*m+n]), "row %d col %d: %v vs %v", m, n, out[4*m+n], want)
							}
						}
						// The same k range in blocks of one, two and three
						// vectors, the lanes carried in lane between them.
						var blocked [4 * maxKernelRows]float32
						for kb, step := 0, 1; kb < K; kb, step = kb+step*s.lanes, step%3+1 {
							kl := min(step*s.lanes, K-kb)
							flags := 0
							if kb > 0 {
								flags |= 1
							}
							if kb+kl == K {
								flags |= 2
							}
							var ap [maxKernelRows]*float32
							for m := range rows {
								ap[m] = &rows[m][kb]
							}
							var bp [4]*byte
							for n := range bp {
								bp[n] = (*byte)(unsafe.Add(unsafe.Pointer(b[n]), kb*dt.Size()))
							}
							s.kern[dt][mr](&ap, &bp, kl, &lane, flags, &blocked)
						}
						require.Equal(t, out, blocked, "blocked k range")
					})
				}
			}
		}
	}
}

// TestDriverMatchesLaneOrder checks the Go drivers, tails and the one-row
// eight-stream kernels included, with the machine's blocking and with
// blocks small enough that every k range and column range is split.
func TestDriverMatchesLaneOrder(t *testing.T) {
	for _, blocking := range [][2]int{{stripK, stripCalls}, {1, 1}, {40, 3}} {
		t.Run(fmt.Sprintf("k=%d/calls=%d", blocking[0], blocking[1]), func(t *testing.T) {
			defer func(k, c int) { stripK, stripCalls = k, c }(stripK, stripCalls)
			stripK, stripCalls = blocking[0], blocking[1]
			testDriverMatchesLaneOrder(t)
		})
	}
}

func testDriverMatchesLaneOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, s := range simds {
		for _, K := range []int{5, 37, 130} {
			for _, M := range []int{1, 2, 3, 7, 8, 13} {
				const N = 13
				h := make([]float32, M*K)
				for i := range h {
					h[i] = float32(rng.Float64()*2 - 1)
				}
				idx := make([]int32, M)
				for i := range idx {
					idx[i] = int32(M - 1 - i) // gathered in reverse
				}
				for dt := F32; dt <= F16; dt++ {
					w, rowsW := randMatrix(rng, dt, N, K)
					u, rowsU := randMatrix(rng, dt, N, K)
					out := make([]float32, M*N)
					downSIMD(s, out, h, nil, w, nil, nil, 0, N)
					gu := make([]float32, M*N)
					gateUpSIMD(s, gu, h, idx, w, u, nil, 0, N)
					for m := 0; m < M; m++ {
						xm := h[int(idx[m])*K:][:K]
						for n := 0; n < N; n++ {
							want := laneDot(h[m*K:(m+1)*K], rowsW[n], s.lanes)
							require.Equal(t, math.Float32bits(want), math.Float32bits(out[m*N+n]), "%s %v K=%d M=%d down row %d col %d", s.name, dt, K, M, m, n)
							want = SwiGLU(laneDot(xm, rowsW[n], s.lanes), laneDot(xm, rowsU[n], s.lanes))
							require.Equal(t, math.Float32bits(want), math.Float32bits(gu[m*N+n]), "%s %v K=%d M=%d gate/up row %d col %d", s.name, dt, K, M, m, n)
						}
					}
				}
			}
		}
	}
}

// randMatrix returns a random [rows, cols] matrix of dtype and its rows widened.
func randMatrix(rng *rand.Rand, dt DType, rows, cols int) (Matrix, [][]float32) {
	wide := make([][]float32, rows)
	flat := make([]float32, 0, rows*cols)
	for n := range wide {
		wide[n], _ = randWeights(rng, dt, cols)
		flat = append(flat, wide[n]...)
	}
	return matrixOf(dt, rows, cols, flat), wide
}

func randRow(rng *rand.Rand, k int) []float32 {
	r := make([]float32, k)
	for i := range r {
		r[i] = float32(rng.Float64()*2 - 1)
	}
	return r
}

// randWeights returns a random weight row of dtype, widened, and as a matrix.
func randWeights(rng *rand.Rand, dt DType, k int) ([]float32, Matrix) {
	w := randRow(rng, k)
	m := matrixOf(dt, 1, k, w)
	for i := range w {
		w[i] = m.At(0, i)
	}
	return w, m
}

func matrixOf(dt DType, rows, cols int, v []float32) Matrix {
	if dt == F32 {
		m, _ := NewF32(rows, cols, append([]float32(nil), v...))
		return m
	}
	u := make([]uint16, len(v))
	for i, f := range v {
		if dt == BF16 {
			u[i] = half.F32ToBF16(f)
		} else {
			u[i] = half.F32ToF16(f)
		}
	}
	m, _ := NewHalf(dt, rows, cols, u)
	return m
}

func TestStripRows(t *testing.T) {
	for _, s := range []*simd{{maxMR: 3}, {maxMR: 6}} {
		for M := 1; M <= 40; M++ {
			var sizes []int
			for m0, mr := 0, 0; m0 < M; m0 += mr {
				mr = s.stripRows(M, m0)
				require.Positive(t, mr)
				require.LessOrEqual(t, mr, s.maxMR)
				sizes = append(sizes, mr)
			}
			require.Len(t, sizes, (M+s.maxMR-1)/s.maxMR, "M=%d: %v", M, sizes)
			require.LessOrEqual(t, slices.Max(sizes)-slices.Min(sizes), 1, "M=%d: %v", M, sizes)
		}
	}
	require.Equal(t, 2, (&simd{maxMR: 3}).stripRows(16, 12))
}
