package kernels_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/kernels/kerneltest"
)

// clampedRef is gpt-oss's expert activation from its definition, in
// float64: g = min(g, limit), u = clamp(u, −limit, limit),
// g·σ(alpha·g)·(u + 1).
func clampedRef(g, u, alpha, limit float64) float64 {
	g = math.Min(g, limit)
	u = math.Max(-limit, math.Min(u, limit))
	return g / (1 + math.Exp(-alpha*g)) * (u + 1)
}

// TestGroupedFFNBiasClamped runs experts with biases on all three
// projections and the clamped SwiGLU, on every implementation, packed and
// not, against a float64 reference on the dequantized weights; the
// projections are large enough that both clamps bind on many columns.
func TestGroupedFFNBiasClamped(t *testing.T) {
	const H, I, T = 64, 96, 9
	act := kernels.Activation{Kind: kernels.ClampedSwiGLU, Alpha: 1.702, Limit: 7}
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.MXFP4} {
		rng := rand.New(rand.NewPCG(7, uint64(dt)))
		weights := func(rows, cols int) (kernels.Matrix, [][]float64) {
			if dt == kernels.MXFP4 {
				return kerneltest.MXFP4Weights(rng, rows, cols)
			}
			return kerneltest.Weights(rng, dt, rows, cols)
		}
		bias := func(n int) []float32 {
			b := make([]float32, n)
			for i := range b {
				b[i] = float32(rng.Float64()*18 - 9)
			}
			return b
		}
		x := make([]float32, T*H)
		for i := range x {
			x[i] = float32(rng.Float64()*2 - 1)
		}
		type ref struct{ gate, up, down [][]float64 }
		var groups []kernels.FFNGroup
		var refs []ref
		for _, load := range []int{1, 5, 9} {
			var g kernels.FFNGroup
			var r ref
			g.Gate, r.gate = weights(I, H)
			g.Up, r.up = weights(I, H)
			g.Down, r.down = weights(H, I)
			g.GateBias, g.UpBias, g.DownBias = bias(I), bias(I), bias(H)
			g.Act = act
			for i := 0; i < load; i++ {
				g.Rows = append(g.Rows, int32(rng.IntN(T)))
				g.Scale = append(g.Scale, float32(rng.Float64()))
			}
			groups, refs = append(groups, g), append(refs, r)
		}
		// The reference, and how often each clamp binds in it.
		want := make([][]float64, len(groups))
		var gateClamped, upClamped int
		for gi, g := range groups {
			r := refs[gi]
			for i, row := range g.Rows {
				xr := x[int(row)*H:][:H]
				h := make([]float64, I)
				for n := range h {
					var gs, us float64
					for k, v := range xr {
						gs += float64(v) * r.gate[n][k]
						us += float64(v) * r.up[n][k]
					}
					gs += float64(g.GateBias[n])
					us += float64(g.UpBias[n])
					if gs > 7 {
						gateClamped++
					}
					if math.Abs(us) > 7 {
						upClamped++
					}
					h[n] = clampedRef(gs, us, 1.702, 7)
				}
				for n := 0; n < H; n++ {
					var s float64
					for k, v := range h {
						s += v * r.down[n][k]
					}
					want[gi] = append(want[gi], float64(g.Scale[i])*(s+float64(g.DownBias[n])))
				}
			}
		}
		require.Greater(t, gateClamped, 20, "the gate clamp must bind")
		require.Greater(t, upClamped, 20, "the up clamp must bind")
		runEverywhere(t, dt.String(), x, H, groups, want)
	}
}

func TestActivationValidate(t *testing.T) {
	require.NoError(t, kernels.Activation{}.Validate())
	require.NoError(t, kernels.Activation{Kind: kernels.ClampedSwiGLU, Alpha: 1.702, Limit: 7}.Validate())
	require.NoError(t, kernels.Activation{Kind: kernels.GeGLU}.Validate())
	require.NoError(t, kernels.Activation{Kind: kernels.ClampedSiLU, Limit: 10}.Validate())
	for _, a := range []kernels.Activation{
		{Kind: kernels.ClampedSwiGLU, Alpha: 1.702},
		{Kind: kernels.ClampedSwiGLU, Alpha: 1.702, Limit: float32(math.Inf(1))},
		{Kind: kernels.ClampedSwiGLU, Alpha: float32(math.NaN()), Limit: 7},
		{Kind: kernels.ClampedSiLU},
		{Kind: kernels.ClampedSiLU, Limit: float32(math.NaN())},
		{Kind: 9, Limit: 7},
	} {
		require.Error(t, a.Validate(), "%+v", a)
	}
	// The activation itself at the clamps: the gate has no lower clamp.
	require.InDelta(t, clampedRef(9, 9, 1.702, 7), float64(kernels.ClampedSwiGLUAct(9, 9, 1.702, 7)), 1e-5)
	require.InDelta(t, clampedRef(-9, -9, 1.702, 7), float64(kernels.ClampedSwiGLUAct(-9, -9, 1.702, 7)), 1e-9)
	require.Equal(t, float32(7/(1+math.Exp(-1.702*7))*8), kernels.ClampedSwiGLUAct(100, 100, 1.702, 7))
}

// TestGroupedFFNScaleInput runs experts whose routing weight scales their
// input (llama4), on every implementation, packed and not, with groups of
// one row up to more than one row tile, against the float64 expert of the
// scaled input; and checks that scaling the output instead would be far
// from it, so that the test tells the two apart.
func TestGroupedFFNScaleInput(t *testing.T) {
	const H, I, T = 48, 80, 16
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
		rng := rand.New(rand.NewPCG(11, uint64(dt)))
		x := make([]float32, T*H)
		for i := range x {
			x[i] = float32(rng.Float64()*4 - 2)
		}
		type ref struct{ gate, up, down [][]float64 }
		var groups []kernels.FFNGroup
		var refs []ref
		for _, load := range []int{1, 5, 13, 200} {
			var g kernels.FFNGroup
			var r ref
			g.Gate, r.gate = kerneltest.Weights(rng, dt, I, H)
			g.Up, r.up = kerneltest.Weights(rng, dt, I, H)
			g.Down, r.down = kerneltest.Weights(rng, dt, H, I)
			g.ScaleInput = true
			for i := 0; i < load; i++ {
				g.Rows = append(g.Rows, int32(rng.IntN(T)))
				g.Scale = append(g.Scale, float32(rng.Float64()*3))
			}
			groups, refs = append(groups, g), append(refs, r)
		}
		expert := func(r ref, in []float64) []float64 {
			h := make([]float64, I)
			for n := range h {
				var gs, us float64
				for k, v := range in {
					gs += v * r.gate[n][k]
					us += v * r.up[n][k]
				}
				h[n] = gs / (1 + math.Exp(-gs)) * us
			}
			out := make([]float64, H)
			for n := range out {
				for k, v := range h {
					out[n] += v * r.down[n][k]
				}
			}
			return out
		}
		want := make([][]float64, len(groups))
		outScaled := make([][]float64, len(groups))
		for gi, g := range groups {
			for i, row := range g.Rows {
				s := float64(g.Scale[i])
				in, scaled := make([]float64, H), make([]float64, H)
				for k, v := range x[int(row)*H:][:H] {
					in[k], scaled[k] = float64(v), s*float64(v)
				}
				want[gi] = append(want[gi], expert(refs[gi], scaled)...)
				for _, v := range expert(refs[gi], in) {
					outScaled[gi] = append(outScaled[gi], s*v)
				}
			}
		}
		for gi := range groups {
			o := make([]float32, len(outScaled[gi]))
			for j, v := range outScaled[gi] {
				o[j] = float32(v)
			}
			require.Greater(t, relErr(o, want[gi]), 0.05, "group %d: the output-scaled expert must differ", gi)
		}
		runEverywhere(t, dt.String(), x, H, groups, want)
	}
}

// relErr is ‖got − want‖ / ‖want‖.
var relErr = moetest.RelErr

// runEverywhere runs groups over x [tokens, hidden] on every
// implementation, packed and not, and requires each group's output within
// 1e-5 of want (relative).
func runEverywhere(t *testing.T, name string, x []float32, hidden int, groups []kernels.FFNGroup, want [][]float64) {
	t.Helper()
	for _, impl := range kernels.Implementations() {
		for _, packed := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/%s/packed=%v", name, impl, packed), func(t *testing.T) {
				restore, err := kernels.Use(impl)
				require.NoError(t, err)
				defer restore()
				run := make([]kernels.FFNGroup, len(groups))
				for i, g := range groups {
					if packed {
						g.Gate, g.Up, g.Down = kernels.Pack(g.Gate), kernels.Pack(g.Up), kernels.Pack(g.Down)
					}
					g.Out = make([]float32, len(g.Rows)*hidden)
					run[i] = g
				}
				require.NoError(t, kernels.GroupedFFN(context.Background(), 2, x, run, nil))
				for i, g := range run {
					require.LessOrEqual(t, relErr(g.Out, want[i]), 1e-5, "group %d", i)
				}
			})
		}
	}
}

// geluTanhRef is GELU's tanh approximation from its definition.
func geluTanhRef(x float64) float64 {
	return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
}

// TestGroupedFFNActivations runs Gemma 4's GeGLU and DeepSeek-V4's clamped
// SiLU experts on every implementation, packed and not, against float64
// experts written from the activations' definitions, with inputs large
// enough that both of the clamps bind; and checks that each differs from
// SwiGLU on the same weights, so that the test tells them apart.
func TestGroupedFFNActivations(t *testing.T) {
	const H, I, T = 48, 72, 12
	for _, c := range []struct {
		act kernels.Activation
		ref func(g, u float64) float64
	}{
		{kernels.Activation{Kind: kernels.GeGLU}, func(g, u float64) float64 { return geluTanhRef(g) * u }},
		{kernels.Activation{Kind: kernels.ClampedSiLU, Limit: 2}, func(g, u float64) float64 {
			g, u = math.Min(g, 2), math.Max(-2, math.Min(u, 2))
			return g / (1 + math.Exp(-g)) * u
		}},
	} {
		rng := rand.New(rand.NewPCG(13, uint64(c.act.Kind)))
		x := make([]float32, T*H)
		for i := range x {
			x[i] = float32(rng.Float64()*6 - 3)
		}
		type ref struct{ gate, up, down [][]float64 }
		var groups []kernels.FFNGroup
		var refs []ref
		for _, load := range []int{1, 7, 12} {
			var g kernels.FFNGroup
			var r ref
			g.Gate, r.gate = kerneltest.Weights(rng, kernels.BF16, I, H)
			g.Up, r.up = kerneltest.Weights(rng, kernels.BF16, I, H)
			g.Down, r.down = kerneltest.Weights(rng, kernels.BF16, H, I)
			g.Act = c.act
			for i := 0; i < load; i++ {
				g.Rows = append(g.Rows, int32(rng.IntN(T)))
				g.Scale = append(g.Scale, float32(rng.Float64()))
			}
			groups, refs = append(groups, g), append(refs, r)
		}
		want := make([][]float64, len(groups))
		swiglu := make([][]float64, len(groups))
		var clamped int
		for gi, g := range groups {
			r := refs[gi]
			for i, row := range g.Rows {
				h, hs := make([]float64, I), make([]float64, I)
				for n := range h {
					var gs, us float64
					for k, v := range x[int(row)*H:][:H] {
						gs += float64(v) * r.gate[n][k]
						us += float64(v) * r.up[n][k]
					}
					if gs > 2 || math.Abs(us) > 2 {
						clamped++
					}
					h[n], hs[n] = c.ref(gs, us), gs/(1+math.Exp(-gs))*us
				}
				for n := 0; n < H; n++ {
					var s, ss float64
					for k := range h {
						s += h[k] * r.down[n][k]
						ss += hs[k] * r.down[n][k]
					}
					want[gi] = append(want[gi], float64(g.Scale[i])*s)
					swiglu[gi] = append(swiglu[gi], float64(g.Scale[i])*ss)
				}
			}
		}
		require.Greater(t, clamped, 100, "inputs large enough for the clamps to bind")
		for gi := range groups {
			o := make([]float32, len(swiglu[gi]))
			for j, v := range swiglu[gi] {
				o[j] = float32(v)
			}
			require.Greater(t, relErr(o, want[gi]), 0.01, "%v group %d: SwiGLU must differ", c.act.Kind, gi)
		}
		runEverywhere(t, c.act.Kind.String(), x, H, groups, want)
	}
}

// TestExpShifted: a softmax's numerators within 1e-14 of math.Exp of the
// same float64 argument, the clamps where they apply, and the same bits
// on every implementation, tails included.
func TestExpShifted(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	src := make([]float32, 203)
	for i := range src {
		src[i] = float32(rng.NormFloat64() * 30)
	}
	src[5], src[6], src[7] = 0, 5000, -1e4
	const scale, shift = 0.125, 2.5
	var first []float64
	for _, impl := range kernels.Implementations() {
		restore, err := kernels.Use(impl)
		require.NoError(t, err)
		for _, n := range []int{203, 7, 1, 0} {
			dst := make([]float64, n+1)
			dst[n] = 42
			kernels.ExpShifted(dst, src[:n], scale, shift)
			require.Equal(t, 42.0, dst[n], "%s: past the end", impl)
			if n == 203 {
				if first == nil {
					first = dst
				}
				require.Equal(t, first, dst, "%s: the same bits as %s", impl, kernels.Implementations()[0])
			}
			for i, v := range dst[:n] {
				x := float64(float64(src[i])*scale) - shift
				want := math.Exp(min(max(x, -64), 710))
				require.InEpsilon(t, want, v, 1e-14, "%s: e^%v", impl, x)
			}
		}
		restore()
	}
}

func TestNonFinite(t *testing.T) {
	inf := float32(math.Inf(1))
	nan := float32(math.NaN())
	assert.Equal(t, -1, kernels.NonFinite(nil))
	assert.Equal(t, -1, kernels.NonFinite([]float32{0, float32(math.Copysign(0, -1)), math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32}))
	assert.Equal(t, 2, kernels.NonFinite([]float32{1, 2, nan, inf}))
	assert.Equal(t, 1, kernels.NonFinite([]float32{1, inf, nan}))
	assert.Equal(t, 0, kernels.NonFinite([]float32{-inf}))
}
