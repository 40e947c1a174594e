package kernels

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRouterDot: the router logits' float64 dot product gives the same
// bits on every implementation (the SIMD kernel's 32 chains and the
// generic loop, tails included), within summation's bound of the exact
// sum (math/big), and RouterLogits computes it for every token and expert.
func TestRouterDot(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 8))
	part := new([32]float64)
	for _, n := range []int{0, 1, 5, 31, 32, 33, 64, 100, 2048, 2051} {
		x, w := make([]float32, n), make([]float32, n)
		for i := range x {
			x[i] = float32(math.Ldexp(2*rng.Float64()-1, rng.IntN(40)-20))
			w[i] = float32(math.Ldexp(2*rng.Float64()-1, rng.IntN(40)-20))
		}
		exact, abs := new(big.Float).SetPrec(4096), 0.0
		for i := range x {
			p := float64(x[i]) * float64(w[i]) // exact: 24 + 24 bits
			exact.Add(exact, new(big.Float).SetFloat64(p))
			abs += math.Abs(p)
		}
		ref, _ := exact.Float64()
		var want float64
		for i, name := range Implementations() {
			restore, err := Use(name)
			require.NoError(t, err)
			got := routerDot(x, w, part)
			restore()
			if i == 0 {
				want = got
				require.InDelta(t, ref, got, float64(n)*0x1p-53*abs+1e-300, "n=%d", n)
				continue
			}
			require.Equal(t, math.Float64bits(want), math.Float64bits(got), "%s, n=%d", name, n)
		}
	}
	// Through RouterLogits: tokens × experts, each the dot product above.
	const tokens, experts, hidden = 3, 5, 70
	x, wv := make([]float32, tokens*hidden), make([]float32, experts*hidden)
	for i := range x {
		x[i] = 2*rng.Float32() - 1
	}
	for i := range wv {
		wv[i] = 2*rng.Float32() - 1
	}
	w, err := NewF32(experts, hidden, wv)
	require.NoError(t, err)
	dst := make([]float64, tokens*experts)
	RouterLogits(dst, x, w)
	for tk := range tokens {
		for e := range experts {
			require.Equal(t, routerDot(x[tk*hidden:][:hidden], wv[e*hidden:][:hidden], part), dst[tk*experts+e])
		}
	}
}

// BenchmarkRouterLogits times DeepSeek-V2-Lite's router (64 experts,
// hidden 2048) for one token, on each implementation.
func BenchmarkRouterLogits(b *testing.B) {
	const experts, hidden = 64, 2048
	rng := rand.New(rand.NewPCG(1, 1))
	x, wv := make([]float32, hidden), make([]float32, experts*hidden)
	for i := range x {
		x[i] = 2*rng.Float32() - 1
	}
	for i := range wv {
		wv[i] = 2*rng.Float32() - 1
	}
	w, err := NewF32(experts, hidden, wv)
	require.NoError(b, err)
	dst := make([]float64, experts)
	for _, name := range Implementations() {
		b.Run(name, func(b *testing.B) {
			restore, err := Use(name)
			require.NoError(b, err)
			defer restore()
			for b.Loop() {
				RouterLogits(dst, x, w)
			}
		})
	}
}
