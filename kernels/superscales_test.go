package kernels_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/kernels/kerneltest"
)

// TestSuperScales: a K-quant matrix's factors, read back from its
// row-major, exact-mode packed and int8-dot packed layouts, are the same,
// and give its scales (d·sc) and offsets (−dmin·m) exactly; a matrix
// without factors has none.
func TestSuperScales(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, c := range []struct {
		name      string
		dt        kernels.DType
		group, lo int
		n         int
		offsets   bool
	}{
		{"q4_k", kernels.UINT4, 32, 0, 16, true},
		{"q5_k", kernels.INT8, 32, 0, 32, true},
		{"q6_k", kernels.INT8, 16, -32, 64, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			const rows, cols = 40, 512
			m, _ := kerneltest.KQuantWeights(rng, c.dt, rows, cols, c.group, c.lo, c.n, c.offsets)
			_, scales, offsets, group, ok := m.CodeData()
			require.True(t, ok)
			dot, err := kernels.PackInt8Dot(m)
			require.NoError(t, err)
			var first struct {
				per      int
				d, nd    []float32
				sc, mins []int8
			}
			for i, l := range []kernels.Matrix{m, kernels.Pack(m), dot} {
				per, d, nd, sc, mins, ok := l.SuperScales()
				require.True(t, ok, "layout %d", i)
				require.Equal(t, 8, per)
				require.Len(t, sc, rows*cols/group)
				require.Len(t, d, rows*cols/group/per)
				require.Equal(t, c.offsets, nd != nil)
				for g := range sc {
					require.Equal(t, scales[g], d[g/per]*float32(sc[g]), "layout %d group %d", i, g)
					if c.offsets {
						require.Equal(t, offsets[g], nd[g/per]*float32(mins[g]), "layout %d group %d", i, g)
					}
				}
				if i == 0 {
					first.per, first.d, first.nd, first.sc, first.mins = per, d, nd, sc, mins
					continue
				}
				require.Equal(t, first.d, d, "layout %d", i)
				require.Equal(t, first.nd, nd, "layout %d", i)
				require.Equal(t, first.sc, sc, "layout %d", i)
				require.Equal(t, first.mins, mins, "layout %d", i)
			}
		})
	}
	plain, _ := kerneltest.INT8CodeWeights(rng, 16, 64, 32, -16, 32, false)
	_, _, _, _, _, ok := plain.SuperScales()
	require.False(t, ok)
}
