//go:build cuda || cudaemu

package cuda_test

import (
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
