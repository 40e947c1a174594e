package kerneltest

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/kernels"
)

// GroupedFFNFunc has the contract of kernels.GroupedFFN: every group's
// SwiGLU FFN over the rows of x [tokens, hidden] it names, scaled by the
// group's routing weights, into the group's Out.
type GroupedFFNFunc func(x []float32, groups []kernels.FFNGroup) error

// GroupedOptions describe the implementation under test.
type GroupedOptions struct {
	// DTypes are the weight dtypes it takes (kerneltest.DTypes when empty).
	DTypes []kernels.DType
	// BF16Activations: x and the intermediate activation h are rounded to
	// bf16 before each GEMM, as tensor-core paths do; the reference rounds
	// them the same way.
	BF16Activations bool
}

// GroupedCase is one grouped FFN case: expert loads over a batch of
// tokens, hidden and intermediate sizes (multiples of 16, so that every
// backend takes them).
type GroupedCase struct {
	Name          string
	Tokens        int
	Hidden, Inter int
	Loads         []int // rows per expert
	Scaled        bool
}

// GroupedCases cover one token, empty experts, ragged loads with row counts
// that are multiples of no block size, one expert holding nearly every row,
// and no rows at all; small enough for an emulated GPU.
var GroupedCases = []GroupedCase{
	{"one token", 1, 32, 16, []int{0, 1, 0}, true},
	{"ragged", 40, 48, 32, []int{7, 0, 65, 1, 0, 13}, true},
	{"one hot expert", 90, 32, 48, []int{130, 1, 2}, false},
	{"no rows", 3, 16, 16, []int{0, 0}, true},
	{"wide", 17, 80, 64, []int{17, 5, 16, 3}, true},
}

// TestGroupedFFN runs the grouped FFN contract over GroupedCases against a
// float64 reference: outputs within tolerance, inputs unmodified, guards
// around every group's output intact.
func TestGroupedFFN(t *testing.T, ffn GroupedFFNFunc, opt GroupedOptions) {
	dtypes := opt.DTypes
	if len(dtypes) == 0 {
		dtypes = DTypes
	}
	for _, dt := range dtypes {
		for ci, c := range GroupedCases {
			t.Run(fmt.Sprintf("%v/%s", dt, c.Name), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(ci+1), uint64(dt)+31))
				x := make([]float32, c.Tokens*c.Hidden)
				for i := range x {
					x[i] = float32(rng.Float64()*2 - 1)
				}
				xCopy := append([]float32(nil), x...)
				type ref struct{ gate, up, down [][]float64 }
				groups := make([]kernels.FFNGroup, len(c.Loads))
				refs := make([]ref, len(c.Loads))
				bufs := make([][]float32, len(c.Loads))
				for e, load := range c.Loads {
					g := &groups[e]
					var r ref
					g.Gate, r.gate = Weights(rng, dt, c.Inter, c.Hidden)
					g.Up, r.up = Weights(rng, dt, c.Inter, c.Hidden)
					g.Down, r.down = Weights(rng, dt, c.Hidden, c.Inter)
					refs[e] = r
					g.Rows = make([]int32, load)
					for i := range g.Rows {
						g.Rows[i] = int32(rng.IntN(c.Tokens))
					}
					if c.Scaled {
						g.Scale = make([]float32, load)
						for i := range g.Scale {
							g.Scale[i] = float32(rng.Float64())
						}
					}
					bufs[e], g.Out = padded(load * c.Hidden)
				}
				require.NoError(t, ffn(x, groups))
				require.Equal(t, xCopy, x, "input modified")
				for e, g := range groups {
					checkGuards(t, bufs[e], len(g.Rows)*c.Hidden)
					r := refs[e]
					for i, row := range g.Rows {
						xr := activations(xCopy[int(row)*c.Hidden:][:c.Hidden], opt.BF16Activations)
						h := make([]float64, c.Inter)
						for n := range h {
							var gs, us float64
							for k, v := range xr {
								gs += v * r.gate[n][k]
								us += v * r.up[n][k]
							}
							h[n] = float64(float32(silu(gs) * us))
						}
						h = activations64(h, opt.BF16Activations)
						scale := 1.0
						if g.Scale != nil {
							scale = float64(g.Scale[i])
						}
						for n := 0; n < c.Hidden; n++ {
							var sum, mag, big float64
							for k, v := range h {
								p := v * r.down[n][k]
								sum += p
								mag += math.Abs(p)
								big = max(big, math.Abs(p))
							}
							// fp32 accumulation, and with bf16 activations an
							// element of h on the other side of a rounding
							// midpoint than the float64 reference put it.
							tol := 2e-5 * mag
							if opt.BF16Activations {
								tol = 1e-4*mag + 0x1p-7*big
							}
							got := g.Out[i*c.Hidden+n]
							require.InDelta(t, sum*scale, float64(got), tol*scale+1e-30,
								"expert %d row %d (token %d) col %d", e, i, row, n)
						}
					}
				}
			})
		}
	}
}

func activations(x []float32, bf16 bool) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		if bf16 {
			v = half.BF16ToF32(half.F32ToBF16(v))
		}
		out[i] = float64(v)
	}
	return out
}

func activations64(h []float64, bf16 bool) []float64 {
	if !bf16 {
		return h
	}
	for i, v := range h {
		h[i] = float64(half.BF16ToF32(half.F32ToBF16(float32(v))))
	}
	return h
}
