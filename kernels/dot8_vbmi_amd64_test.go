//go:build !purego

package kernels

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestInt8DotMXFP4VBMI: on a CPU with AVX512_VBMI the MXFP4 int8-dot
// kernels are dot8AVX512M4V (nibbles looked up by vpermb); the others keep
// dot8AVX512's m4 (masks and vpshufb). Both tables, run here in turn, give
// the reference's bits on every E8M0 exponent, at 1 to 9 rows (every
// kernel height, and the panel counts the column tiles take).
func TestInt8DotMXFP4VBMI(t *testing.T) {
	if !hasVNNI || !hasVBMI {
		t.Skip("no AVX-512 VNNI and VBMI: dot8AVX512M4V does not run on this CPU")
	}
	const N, blocks = 40, 32
	const K = 32 * blocks
	rng := rand.New(rand.NewPCG(4, 4))
	m := exponentsMXFP4(t, rng, N, blocks)
	d, err := PackInt8Dot(m)
	require.NoError(t, err)
	const rows = 9
	x := make([]float32, rows*K)
	for i := range x {
		x[i] = float32((rng.Float64()*2 - 1) * 0x1p-24)
	}
	restore, err := Use("avx512")
	require.NoError(t, err)
	defer restore()
	prev := active
	defer func() { active = prev }()
	for name, tbl := range map[string]dot8Table{"m4": dot8AVX512.m4, "m4v": dot8AVX512M4V} {
		s := *prev
		k := dot8AVX512
		k.m4 = tbl
		s.dot8 = &k
		active = &s
		for M := 1; M <= rows; M++ {
			o := make([]float32, M*N)
			Down(o, x[:M*K], d, nil, 0, N)
			for r := range M {
				for n := range N {
					want := dot8Reference(x[r*K:][:K], m, n)
					require.Equal(t, math.Float32bits(want), math.Float32bits(o[r*N+n]), "%s: %d rows, row %d col %d", name, M, r, n)
				}
			}
		}
	}
}
