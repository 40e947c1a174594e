package kernels

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestFMAF32: the widening's fused multiply-add against the exact value
// rounded once (math/big) and against the tests' own fma32, on random
// operands and on sums that land next to an fp32 rounding midpoint.
func TestFMAF32(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	exact := func(a, b, c float32) float32 {
		x := new(big.Float).SetPrec(200).SetFloat64(float64(a))
		x.Mul(x, new(big.Float).SetPrec(200).SetFloat64(float64(b)))
		x.Add(x, new(big.Float).SetPrec(200).SetFloat64(float64(c)))
		f, _ := x.Float32()
		return f
	}
	check := func(a, b, c float32) {
		want := exact(a, b, c)
		require.Equal(t, math.Float32bits(want), math.Float32bits(fmaF32(a, b, c)), "fma(%g, %g, %g)", a, b, c)
		require.Equal(t, math.Float32bits(want), math.Float32bits(fma32(a, b, c)), "fma32(%g, %g, %g)", a, b, c)
	}
	for range 200000 {
		a := float32(rng.IntN(256) - 128)
		b := math.Float32frombits(rng.Uint32()&0x807fffff | uint32(100+rng.IntN(40))<<23)
		c := math.Float32frombits(rng.Uint32()&0x807fffff | uint32(90+rng.IntN(60))<<23)
		check(a, b, c)
		// 3·M·2^-23 with M odd in [2^23, 2^25/3) has 25 significant bits:
		// an fp32 rounding midpoint. A tiny c decides the rounding, which
		// a float64 sum rounded again to fp32 would lose.
		M := 1<<23 + 2*rng.IntN((1<<25/3-1<<23)/2) + 1
		b = float32(math.Ldexp(float64(M), -23))
		check(3, b, float32(math.Ldexp(float64(1-2*rng.IntN(2)), -60+rng.IntN(20))))
	}
	check(0, 1, 0)
	check(-1, 0, 0)
	check(3, 0x1p-149, 0x1p-149) // subnormals
	require.True(t, math.IsInf(float64(fmaF32(2, math.MaxFloat32, 0)), 1))
}
