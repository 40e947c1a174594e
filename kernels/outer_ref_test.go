package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// chainDot emulates the outer-product kernels' order: one FMA chain over
// ascending k, from zero.
func chainDot(a, b []float32) float32 {
	var c float32
	for k := range a {
		c = fma32(a[k], b[k], c)
	}
	return c
}

func TestPackLayout(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for dt := F32; dt <= F16; dt++ {
		for _, shape := range [][2]int{{1, 1}, {13, 5}, {16, 3}, {37, 9}, {0, 4}, {3, 0}} {
			m, rows := randMatrix(rng, dt, shape[0], shape[1])
			p := Pack(m)
			require.True(t, p.Packed())
			require.False(t, m.Packed())
			require.Equal(t, p, Pack(p), "packing twice")
			require.Equal(t, [2]int{m.Rows, m.Cols}, [2]int{p.Rows, p.Cols})
			got := make([]float32, m.Cols)
			for r := range rows {
				p.RowF32(r, got)
				require.Equal(t, rows[r], got, "%v %v row %d", dt, shape, r)
				for k := range rows[r] {
					require.Equal(t, rows[r][k], p.At(r, k))
				}
			}
			// The padding rows of the last panel are zero.
			for r := m.Rows; r < p.panels()*PanelWidth; r++ {
				for k := 0; k < m.Cols; k++ {
					require.Zero(t, p.At(r, k), "%v %v padding row %d", dt, shape, r)
				}
			}
		}
	}
}

// TestOuterMatchesChainOrder checks every outer-product kernel through the
// drivers against the exact emulation of its order: rows gathered in any
// order, every strip size, every panel count, column ranges that cut
// panels, the machine's k blocking and blocks small enough to split every k.
func TestOuterMatchesChainOrder(t *testing.T) {
	for _, kBytes := range []int{outerKBytes, 1, 24} {
		t.Run(fmt.Sprintf("kbytes=%d", kBytes), func(t *testing.T) {
			defer func(b int) { outerKBytes = b }(outerKBytes)
			outerKBytes = kBytes
			testOuterMatchesChainOrder(t)
		})
	}
}

func testOuterMatchesChainOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, s := range simds {
		for _, K := range []int{1, 5, 37, 130} {
			for _, M := range []int{1, 2, 3, 4, 5, 6, 7, 8, 13} {
				for _, cols := range [][3]int{{13, 0, 13}, {20, 0, 20}, {40, 0, 40}, {70, 0, 70}, {70, 3, 61}, {100, 17, 90}} {
					N, n0, n1 := cols[0], cols[1], cols[2]
					h := randRow(rng, M*K)
					idx := make([]int32, M)
					for i := range idx {
						idx[i] = int32(M - 1 - i) // gathered in reverse
					}
					scale := randRow(rng, M)
					for dt := F32; dt <= F16; dt++ {
						w, rowsW := randMatrix(rng, dt, N, K)
						u, rowsU := randMatrix(rng, dt, N, K)
						pw, pu := Pack(w), Pack(u)
						out := make([]float32, M*N)
						downOuter(s, out, h, nil, nil, pw, nil, scale, n0, n1)
						gathered := make([]float32, M*N)
						downOuter(s, gathered, h, nil, idx, pw, nil, nil, n0, n1)
						gu := make([]float32, M*N)
						gateUpOuter(s, gu, h, nil, idx, pw, pu, nil, n0, n1)
						if K > 1 && cols == [3]int{20, 0, 20} { // through the public entry points
							restore := useSIMD(s)
							all := make([]float32, M*N)
							GEMMRows(all, h, nil, pw, scale, n0, n1) // idx nil: every row
							require.Equal(t, out, all, "GEMMRows without idx, %s", s.name)
							viaDown := make([]float32, M*N)
							Down(viaDown, h, pw, scale, n0, n1)
							require.Equal(t, out, viaDown, "Down, %s", s.name)
							restore()
						}
						for m := 0; m < M; m++ {
							xm := h[int(idx[m])*K:][:K]
							for n := 0; n < N; n++ {
								at := fmt.Sprintf("%s %v K=%d M=%d N=%d [%d,%d) row %d col %d", s.name, dt, K, M, N, n0, n1, m, n)
								if n < n0 || n >= n1 {
									require.Zero(t, out[m*N+n], "outside the columns: %s", at)
									require.Zero(t, gu[m*N+n], "outside the columns: %s", at)
									continue
								}
								want := chainDot(h[m*K:(m+1)*K], rowsW[n]) * scale[m]
								require.Equal(t, math.Float32bits(want), math.Float32bits(out[m*N+n]), "down %s", at)
								want = chainDot(xm, rowsW[n])
								require.Equal(t, math.Float32bits(want), math.Float32bits(gathered[m*N+n]), "gathered %s", at)
								want = SwiGLU(chainDot(xm, rowsW[n]), chainDot(xm, rowsU[n]))
								require.Equal(t, math.Float32bits(want), math.Float32bits(gu[m*N+n]), "gate/up %s", at)
							}
						}
					}
				}
			}
		}
	}
}

// useSIMD makes s the active implementation until restore is called.
func useSIMD(s *simd) (restore func()) {
	prev := active
	active = s
	return func() { active = prev }
}

func TestPackColumns(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	for dt := F32; dt <= F16; dt++ {
		m, rows := randMatrix(rng, dt, 9, 40)
		var prev Matrix
		for _, c := range [][3]int{{0, 9, 40}, {2, 7, 33}, {4, 5, 16}, {0, 9, 1}} {
			r0, r1, n := c[0], c[1], c[2]
			p := PackColumns(m, r0, r1, n, prev)
			require.True(t, p.Packed())
			require.Equal(t, [2]int{n, r1 - r0}, [2]int{p.Rows, p.Cols})
			for x := 0; x < n; x++ {
				for j := r0; j < r1; j++ {
					require.Equal(t, rows[j][x], p.At(x, j-r0), "%v %v column %d row %d", dt, c, x, j)
				}
			}
			for x := n; x < p.panels()*PanelWidth; x++ {
				for j := 0; j < r1-r0; j++ {
					require.Zero(t, p.At(x, j), "%v %v padding", dt, c)
				}
			}
			prev = p // the next case reuses (and must clear) its memory
		}
	}
}

// TestPackStrided: row x of the packed matrix is column first + step·x of
// the source, for every dtype, contiguous and interleaved columns; bad
// ranges and dtypes are errors.
func TestPackStrided(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	for dt := F32; dt <= F16; dt++ {
		m, rows := randMatrix(rng, dt, 7, 40)
		for _, c := range [][3]int{{0, 1, 40}, {20, 1, 20}, {0, 2, 20}, {1, 2, 20}, {3, 3, 12}, {5, 1, 1}} {
			first, step, n := c[0], c[1], c[2]
			p, err := PackStrided(m, first, step, n)
			require.NoError(t, err)
			require.True(t, p.Packed())
			require.Equal(t, [2]int{n, 7}, [2]int{p.Rows, p.Cols})
			row := make([]float32, 7)
			for x := 0; x < n; x++ {
				p.RowF32(x, row)
				for j := range row {
					require.Equal(t, rows[j][first+step*x], row[j], "%v %v column %d row %d", dt, c, x, j)
				}
			}
			for x := n; x < p.panels()*PanelWidth; x++ {
				for j := 0; j < 7; j++ {
					require.Zero(t, p.At(x, j), "%v %v padding", dt, c)
				}
			}
		}
		_, err := PackStrided(m, 1, 2, 21)
		require.ErrorContains(t, err, "columns 1 + 2·[0, 21) of a matrix with 40")
		_, err = PackStrided(m, 0, 0, 3)
		require.Error(t, err)
		_, err = PackStrided(Pack(m), 0, 1, 3)
		require.ErrorContains(t, err, "packed true")
	}
}
