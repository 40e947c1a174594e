//go:build cuda || cudaemu

package cuda_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/kernels"
)

// TestDenseLayout: the one-group layout is kernels.NewLayout's for every
// row routed to group 0.
func TestDenseLayout(t *testing.T) {
	for _, rows := range []int{0, 1, 63, 64, 65, 200} {
		want, err := kernels.NewLayout(make([]int32, rows), rows, 1, 1, cuda.GEMMBlock)
		require.NoError(t, err)
		sorted, groups := cuda.DenseLayout(rows)
		require.Equal(t, want.Pairs, sorted, "%d rows", rows)
		require.Equal(t, make([]int32, len(want.Pairs)/cuda.GEMMBlock), groups, "%d rows", rows)
	}
}

// TestE8Scales: MXFP4 scales that are powers of two 2^(E−127), E in [0,
// 254] (the subnormal 2^−127 and 2^−126's neighbours included), become
// their E8M0 bytes; any other value refuses the whole set.
func TestE8Scales(t *testing.T) {
	var in []float32
	for e := range 255 {
		in = append(in, float32(math.Ldexp(1, e-127)))
	}
	got, ok := cuda.E8Scales(in)
	require.True(t, ok)
	for e, b := range got {
		require.Equal(t, uint8(e), b)
	}
	for _, bad := range []float32{0, 0.75, 3, float32(math.Inf(1)), float32(math.NaN()), -1, float32(math.Ldexp(1, -128))} {
		_, ok := cuda.E8Scales([]float32{1, bad})
		require.False(t, ok, "%v", bad)
	}
}

// TestHalfScales: scales that are finite fp16 values (subnormals and the
// largest included) become their fp16 bits; any other value refuses the
// whole set.
func TestHalfScales(t *testing.T) {
	in := []float32{0, float32(math.Ldexp(1, -24)), float32(math.Ldexp(3, -24)), float32(math.Ldexp(1025, -20)), 65504, -2.5, 0.099975586}
	got, ok := cuda.HalfScales(in)
	require.True(t, ok)
	require.Equal(t, []uint16{0, 0x0001, 0x0003, 0x1401, 0x7bff, 0xc100, 0x2e66}, got)
	for _, bad := range []float32{1e-3, float32(math.Ldexp(1, -25)), 65536, float32(math.Ldexp(2049, -11)), float32(math.NaN()), float32(math.Inf(1))} {
		_, ok := cuda.HalfScales([]float32{1, bad})
		require.False(t, ok, "%v", bad)
	}
}
