package kernels_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/kernels"
)

// TestRMSNorm: both orders against the definition in float64, in place and
// not, several rows; the input is left alone when out is another slice.
func TestRMSNorm(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const rows, H, eps = 3, 37, 1e-6
	x := make([]float32, rows*H)
	w := make([]float32, H)
	for i := range x {
		x[i] = float32(rng.NormFloat64() * 3)
	}
	for i := range w {
		w[i] = float32(1 + rng.NormFloat64()*0.2)
	}
	ref := func(r, i int, thenWeight bool) float32 {
		var ss float64
		for _, v := range x[r*H : (r+1)*H] {
			ss += float64(v) * float64(v)
		}
		n := float64(x[r*H+i]) / math.Sqrt(ss/H+eps)
		if thenWeight { // transformers: (x · rsqrt) in fp32, then × w in fp32
			return float32(n) * w[i]
		}
		return float32(n * float64(w[i]))
	}
	for _, thenWeight := range []bool{false, true} {
		norm := kernels.RMSNorm
		if thenWeight {
			norm = kernels.RMSNormThenWeight
		}
		keep := append([]float32(nil), x...)
		out := make([]float32, len(x))
		norm(out, x, w, eps)
		require.Equal(t, keep, x, "input changed")
		for r := range rows {
			for i := range H {
				want := ref(r, i, thenWeight)
				require.InDelta(t, want, out[r*H+i], 1e-6*math.Abs(float64(want))+1e-30, "row %d value %d", r, i)
			}
		}
		in := append([]float32(nil), x...)
		norm(in, in, w, eps)
		require.Equal(t, out, in, "in place")
	}
}

// hfRotate is transformers' apply_rotary_pos_emb on one head of d values:
// x·cos + rotate_half(x)·sin with cos, sin = cat(freqs, freqs)·pos.
func hfRotate(x []float64, freqs []float64, pos int, scale float64) []float64 {
	d := len(x)
	out := make([]float64, d)
	for i := range d {
		f := freqs[i%(d/2)] * float64(pos)
		var rot float64 // rotate_half: cat(-x[d/2:], x[:d/2])
		if i < d/2 {
			rot = -x[i+d/2]
		} else {
			rot = x[i-d/2]
		}
		out[i] = x[i]*math.Cos(f)*scale + rot*math.Sin(f)*scale
	}
	return out
}

// TestRoPE: each style against transformers' rotate_half (the pair styles
// through their permutation of the head), partial rotation leaving the
// rest alone, and the relative-position property.
func TestRoPE(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const d, head = 16, 24
	r, sm, err := kernels.NewRoPE(d, 10000, kernels.RoPEScaling{}, kernels.RoPEHalves)
	require.NoError(t, err)
	require.Equal(t, 1.0, sm)
	for i, f := range r.Freqs {
		require.InDelta(t, math.Pow(10000, -float64(2*i)/d), f, 1e-15)
	}
	x := make([]float32, head)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	for _, pos := range []int{0, 1, 7, 4095} {
		x64 := make([]float64, d)
		for i := range x64 {
			x64[i] = float64(x[i])
		}
		want := hfRotate(x64, r.Freqs, pos, 1)
		for _, style := range []kernels.RoPEStyle{kernels.RoPEHalves, kernels.RoPEPairs, kernels.RoPEPairsToHalves} {
			rs := r
			rs.Style = style
			v := append([]float32(nil), x...)
			if style != kernels.RoPEHalves { // stored as pairs: (x[i], x[i+d/2]) at (2i, 2i+1)
				for i := range d / 2 {
					v[2*i], v[2*i+1] = x[i], x[i+d/2]
				}
			}
			heads := append(append(append([]float32(nil), v...), v...), v...)
			rs.Apply(v, pos)
			rs.ApplyHeads(heads, 3, head, pos) // three heads at once: each Apply's bits
			for h := range 3 {
				require.Equal(t, v, heads[h*head:(h+1)*head], "%v pos %d head %d", style, pos, h)
			}
			for i := range d {
				j := i // where value i of the halves layout sits
				if style == kernels.RoPEPairs {
					j = 2*(i%(d/2)) + i/(d/2)
				}
				require.InDelta(t, want[i], float64(v[j]), 1e-6, "%v pos %d value %d", style, pos, i)
			}
			require.Equal(t, x[d:], v[d:], "the unrotated values stay")
		}
	}
	// ⟨R(p)q, R(p')k⟩ depends on p − p' only.
	q, k := make([]float32, d), make([]float32, d)
	for i := range q {
		q[i], k[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
	}
	dot := func(p, pk int) float64 {
		a, b := append([]float32(nil), q...), append([]float32(nil), k...)
		r.Apply(a, p)
		r.Apply(b, pk)
		s := 0.0
		for i := range a {
			s += float64(a[i]) * float64(b[i])
		}
		return s
	}
	require.InDelta(t, dot(3, 1), dot(103, 101), 1e-5)
}

// TestRoPEScaling: linear, yarn and llama3 frequencies as transformers'
// _compute_*_parameters write them, and the bad settings refused.
func TestRoPEScaling(t *testing.T) {
	const d, theta = 64, 10000.0
	base := make([]float64, d/2)
	for i := range base {
		base[i] = 1 / math.Pow(theta, float64(2*i)/d)
	}
	lin, _, err := kernels.NewRoPE(d, theta, kernels.RoPEScaling{Type: "linear", Factor: 4}, kernels.RoPEHalves)
	require.NoError(t, err)
	for i := range base {
		require.InDelta(t, base[i]/4, lin.Freqs[i], 1e-18)
	}

	// yarn (DeepSeek-V2-Lite's): inv_freq = interpolation·(1 − extrapolation_factor) + extrapolation·extrapolation_factor.
	ys := kernels.RoPEScaling{Type: "yarn", Factor: 40, OrigMaxPos: 4096, BetaFast: 32, BetaSlow: 1, MScale: 0.707, MScaleAllDim: 0.707}
	y, sm, err := kernels.NewRoPE(d, theta, ys, kernels.RoPEPairsToHalves)
	require.NoError(t, err)
	dimOf := func(rot float64) float64 { return d * math.Log(4096/(rot*2*math.Pi)) / (2 * math.Log(theta)) }
	low, high := math.Max(math.Floor(dimOf(32)), 0), math.Min(math.Ceil(dimOf(1)), d-1)
	for i := range base {
		ramp := math.Min(math.Max((float64(i)-low)/(high-low), 0), 1)
		extrap := 1 - ramp
		require.InDelta(t, base[i]/40*(1-extrap)+base[i]*extrap, y.Freqs[i], 1e-15, "freq %d", i)
	}
	m := 0.1*0.707*math.Log(40) + 1
	require.InDelta(t, 1.0, y.Scale, 1e-15, "mscale / mscale_all_dim")
	require.InDelta(t, m*m, sm, 1e-12)

	// llama3 (Llama 3.1's settings).
	l3 := kernels.RoPEScaling{Type: "llama3", Factor: 8, OrigMaxPos: 8192, LowFreqFactor: 1, HighFreqFactor: 4}
	l, _, err := kernels.NewRoPE(128, 500000, l3, kernels.RoPEHalves)
	require.NoError(t, err)
	for i, f := range l.Freqs {
		b := 1 / math.Pow(500000, float64(2*i)/128)
		wave := 2 * math.Pi / b
		want := b
		if wave > 8192/1.0 {
			want = b / 8
		} else if wave >= 8192/4.0 {
			s := (8192/wave - 1) / (4 - 1)
			want = (1-s)*b/8 + s*b
		}
		require.InDelta(t, want, f, 1e-18, "freq %d", i)
	}

	for _, bad := range []struct {
		d     int
		theta float64
		s     kernels.RoPEScaling
		err   string
	}{
		{7, theta, kernels.RoPEScaling{}, "positive even"},
		{8, math.NaN(), kernels.RoPEScaling{}, "rope_theta"},
		{8, theta, kernels.RoPEScaling{Type: "dynamic"}, `"dynamic" is not supported`},
		{8, theta, kernels.RoPEScaling{Type: "linear"}, "linear rope_scaling factor 0"},
		{8, theta, kernels.RoPEScaling{Type: "llama3", Factor: 8}, "llama3 rope_scaling"},
	} {
		_, _, err := kernels.NewRoPE(bad.d, bad.theta, bad.s, kernels.RoPEHalves)
		require.ErrorContains(t, err, bad.err)
	}
}
