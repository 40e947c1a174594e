package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestGateExp checks gateExp against math.Exp over its range, its clamps,
// and that the Taylor coefficients are 1/i!.
func TestGateExp(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	xs := []float64{0, math.Copysign(0, -1), 1, -1, 0.5 * math.Ln2, -0.5 * math.Ln2, expLo, 709.4, 700, -63.9, 88.7, -30.1}
	for range 200000 {
		xs = append(xs, expLo+rng.Float64()*(709.4-expLo))
	}
	for range 20000 {
		xs = append(xs, (rng.Float64()*2-1)*20)
	}
	for _, x := range xs {
		want := math.Exp(x)
		require.InEpsilon(t, want, gateExp(x), 1e-14, "x = %v", x)
	}
	require.Equal(t, gateExp(expLo), gateExp(-1000))
	require.Equal(t, gateExp(expLo), gateExp(math.NaN()))
	require.Equal(t, gateExp(expLo), gateExp(math.Inf(-1)))
	for _, x := range []float64{709.5, 709.8, expHi, 1e300, math.Inf(1)} {
		require.True(t, math.IsInf(gateExp(x), 1), "e^%v", x)
	}
	f := 1.0
	for i, c := range expCoef {
		if i > 1 {
			f *= float64(i)
		}
		require.Equal(t, 1/f, c, "coefficient %d", i)
	}
}

// gateRef is the activation of one column in float64 from its definition,
// with math.Exp: the gate's value before the rounding to float32.
func gateRef(p *gate, g, u float32) float64 {
	gf, uf := float64(g), float64(u)
	if p.gelu {
		z := math.Sqrt(2/math.Pi) * (gf + 0.044715*gf*gf*gf)
		return gf / (1 + math.Exp(-2*z)) * uf
	}
	gf = math.Min(gf, p.limit)
	uf = math.Max(-p.ulimit, math.Min(uf, p.ulimit))
	alpha := -p.nalpha
	return gf / (1 + math.Exp(-alpha*gf)) * (uf + p.c)
}

// gateCases are the four activations' gates, named.
func gateCases() map[string]*gate {
	return map[string]*gate{
		"silu":           siluGate,
		"geglu":          geluGate,
		"clamped_silu":   clampedSiLU(7),
		"clamped_swiglu": clampedSwiGLU(1.702, 7),
	}
}

// gateInputs returns n gate and up values: random in several ranges, and
// the special ones (±0, ±∞, NaN, subnormals, the clamps, ±FLT_MAX).
func gateInputs(rng *rand.Rand, n int) (g, u []float32) {
	special := []float32{0, float32(math.Copysign(0, -1)), 1, -1, 7, -7, 7.0000005, 100, -100, -104, -110, 88, -88,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 1e-40, -1e-40, math.MaxFloat32, -math.MaxFloat32, 3e4, -3e4}
	g, u = make([]float32, n), make([]float32, n)
	for i := range g {
		pick := func() float32 {
			switch rng.IntN(4) {
			case 0:
				return special[rng.IntN(len(special))]
			case 1:
				return float32(rng.NormFloat64() * 30)
			}
			return float32(rng.NormFloat64() * 3)
		}
		g[i], u[i] = pick(), pick()
	}
	return g, u
}

// TestGateApply checks each gate's Go value against the float64
// definition with math.Exp, within float32's rounding.
func TestGateApply(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	g, u := gateInputs(rng, 100000)
	for name, p := range gateCases() {
		for i := range g {
			got, want := p.apply(g[i], u[i]), gateRef(p, g[i], u[i])
			switch {
			case math.IsNaN(want):
				require.True(t, math.IsNaN(float64(got)), "%s(%v, %v) = %v, want NaN", name, g[i], u[i], got)
			case math.IsInf(want, 0) || math.Abs(want) > math.MaxFloat32:
				require.True(t, math.IsInf(float64(got), 0) || math.Abs(float64(got)) == math.MaxFloat32, "%s(%v, %v) = %v, want %v", name, g[i], u[i], got, want)
			default:
				// Half an ulp of float32 plus the exponential's 1e-13,
				// or float32's smallest subnormal.
				require.InDelta(t, want, float64(got), math.Abs(want)*(0x1p-24+1e-12)+0x1p-150, "%s(%v, %v)", name, g[i], u[i])
			}
		}
	}
	// The exported activations are the gates'.
	for i := range 1000 {
		require.Equal(t, math.Float32bits(siluGate.apply(g[i], u[i])), math.Float32bits(SwiGLU(g[i], u[i])))
		require.Equal(t, math.Float32bits(geluGate.apply(g[i], u[i])), math.Float32bits(GeGLUAct(g[i], u[i])))
		require.Equal(t, math.Float32bits(clampedSwiGLU(1.702, 7).apply(g[i], u[i])), math.Float32bits(ClampedSwiGLUAct(g[i], u[i], 1.702, 7)))
	}
}

// TestGateKernels checks that every implementation's rows, and the Go
// loop's four columns at a time, are apply's bits, over lengths with and
// without a tail.
func TestGateKernels(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	g, u := gateInputs(rng, 4099)
	for _, s := range append([]*simd{nil}, simds...) {
		impl := "go"
		if s != nil {
			if s.gate == nil {
				continue
			}
			impl = s.name
		}
		for name, p := range gateCases() {
			for _, n := range []int{0, 1, 3, 7, 8, 9, 16, 63, 1408, 4099} {
				t.Run(fmt.Sprintf("%s/%s/%d", impl, name, n), func(t *testing.T) {
					h := make([]float32, n)
					prev := active
					active = s
					p.row(h, g, u)
					active = prev
					for i := range h {
						want := p.apply(g[i], u[i])
						if math.IsNaN(float64(want)) {
							require.True(t, math.IsNaN(float64(h[i])), "column %d: (%v, %v)", i, g[i], u[i])
							continue
						}
						require.Equal(t, math.Float32bits(want), math.Float32bits(h[i]), "column %d: (%v, %v) = %v, want %v", i, g[i], u[i], h[i], want)
					}
				})
			}
		}
	}
}

// BenchmarkGate times a row of 1408 columns (DeepSeek-V2-Lite's expert
// width) of each activation on the Go loop and on each implementation's
// kernel, in ns a column.
func BenchmarkGate(b *testing.B) {
	const n = 1408
	g, u := gateInputs(rand.New(rand.NewPCG(7, 8)), n)
	for i := range g { // finite inputs, as the layers make them
		if math.IsNaN(float64(g[i])) || math.IsInf(float64(g[i]), 0) || math.Abs(float64(g[i])) > 1e4 {
			g[i] = 1.5
		}
	}
	h := make([]float32, n)
	impls := append([]*simd{nil}, simds...)
	for _, s := range impls {
		name := "generic"
		if s != nil {
			name = s.name
		}
		for _, c := range []string{"silu", "geglu", "clamped_swiglu"} {
			p := gateCases()[c]
			b.Run(name+"/"+c, func(b *testing.B) {
				prev := active
				active = s
				defer func() { active = prev }()
				for b.Loop() {
					p.row(h, g, u)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/column")
			})
		}
	}
}
