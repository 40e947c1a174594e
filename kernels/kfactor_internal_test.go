package kernels

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestKFactoredExact: a matrix packed for the exact mode that holds its
// scales only as the K-quants' factors (its fp32 scales made for each
// call, see kscales) gives the bits of the same matrix packed with fp32
// panel scales, on every implementation: in registers and widened, over
// k blocks of the machine's size, of one group and of a few (which start
// inside a super-block and cross into the next), through GateUp, Down and the grouped GEMM.
func TestKFactoredExact(t *testing.T) {
	for _, kBytes := range []int{outerKBytes, 1, 120} { // 120: k blocks of 3 groups of 32, 6 of 16 at K=512
		t.Run(fmt.Sprintf("kbytes=%d", kBytes), func(t *testing.T) {
			defer func(b int) { outerKBytes = b }(outerKBytes)
			outerKBytes = kBytes
			for _, impl := range Implementations() {
				restore, err := Use(impl)
				require.NoError(t, err)
				for _, s := range []struct{ N, K int }{{37, 512}, {20, 384}} {
					rng := rand.New(rand.NewPCG(uint64(s.N), uint64(s.K)))
					for name, m := range dot8Cases(rng, s.N, s.K) {
						if m.q.super == nil || !m.q.kFactored(m.DType) {
							continue
						}
						data, sc, off, g, _ := m.CodeData()
						var flat Matrix
						if m.DType == UINT4 {
							flat, err = NewUINT4(m.Rows, m.Cols, g, data, sc, off)
						} else {
							flat, err = NewINT8(m.Rows, m.Cols, g, bytesAsInt8(data), sc, off)
						}
						require.NoError(t, err)
						pk, pf := Pack(m), Pack(flat)
						require.NotNil(t, pk.q.kmeta, name)
						require.Nil(t, pk.q.panel, name)
						require.NotNil(t, pf.q.panel, name)
						for _, M := range []int{1, 4, 7, 13, 40} {
							x := make([]float32, M*s.K)
							for i := range x {
								x[i] = float32(rng.NormFloat64())
							}
							idx := make([]int32, M)
							for i := range idx {
								idx[i] = int32(M - 1 - i)
							}
							at := fmt.Sprintf("%s %s N=%d K=%d M=%d", impl, name, s.N, s.K, M)
							hk, hf := make([]float32, M*s.N), make([]float32, M*s.N)
							GateUp(hk, x, idx, pk, pk, 0, s.N)
							GateUp(hf, x, idx, pf, pf, 0, s.N)
							require.Equal(t, hf, hk, "gate/up %s", at)
							ok, of := make([]float32, M*s.N), make([]float32, M*s.N)
							Down(ok, x, pk, nil, 3, s.N)
							Down(of, x, pf, nil, 3, s.N)
							require.Equal(t, of, ok, "down %s", at)
							gk := make([]float32, M*s.N)
							require.NoError(t, GroupedGEMM(context.Background(), 2, x, []GEMMGroup{{B: pk, Rows: idx, Out: gk}}))
							gf := make([]float32, M*s.N)
							require.NoError(t, GroupedGEMM(context.Background(), 2, x, []GEMMGroup{{B: pf, Rows: idx, Out: gf}}))
							require.Equal(t, gf, gk, "grouped %s", at)
						}
						if !strings.HasPrefix(name, "q5") {
							require.Equal(t, pf.At(5, 77), pk.At(5, 77), name)
						}
					}
				}
				restore()
			}
		})
	}
}

func bytesAsInt8(b []uint8) []int8 {
	out := make([]int8, len(b))
	for i, v := range b {
		out[i] = int8(v)
	}
	return out
}

// TestGateUpMixedLayouts: gate and up of different groups and code
// layouts (8-bit codes in groups of 32 beside 6-bit ones in groups of 16,
// 5-bit ones beside K-factored 6-bit ones) in one exact-mode call give the
// kernels' FMA chains over the weights' values, in registers and widened.
func TestGateUpMixedLayouts(t *testing.T) {
	const N, K = 40, 256
	rng := rand.New(rand.NewPCG(6, 6))
	c := dot8Cases(rng, N, K)
	pairs := [][2]string{{"int8 g32 offsets=false", "q6 g16"}, {"q5_0 g32", "INT8 K g16 offsets=false"}, {"q6 g16", "int8 g8 offsets=true"}}
	for _, pair := range pairs {
		gate, up := Pack(c[pair[0]]), Pack(c[pair[1]])
		for _, M := range []int{1, 5, 40} {
			x := make([]float32, M*K)
			for i := range x {
				x[i] = float32(rng.NormFloat64())
			}
			idx := make([]int32, M)
			for i := range idx {
				idx[i] = int32(i)
			}
			// The kernels' order: one FMA chain a product over ascending k.
			want := make([]float32, M*N)
			gw, uw := make([]float32, K), make([]float32, K)
			for n := range N {
				gate.RowF32(n, gw)
				up.RowF32(n, uw)
				for r := range M {
					xr := x[r*K:][:K]
					want[r*N+n] = SwiGLU(chainDot(xr, gw), chainDot(xr, uw))
				}
			}
			for _, impl := range Implementations() {
				if impl == "generic" { // its own order
					continue
				}
				restore, err := Use(impl)
				require.NoError(t, err)
				got := make([]float32, M*N)
				GateUp(got, x, idx, gate, up, 0, N)
				restore()
				require.Equal(t, want, got, "%s: %v M=%d", impl, pair, M)
			}
		}
	}
}
