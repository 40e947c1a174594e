package kernels_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/kernels"
)

func TestLayout(t *testing.T) {
	// 4 tokens, top-2 of 5 experts.
	ids := []int32{
		0, 3,
		1, 3,
		0, 4,
		3, 4,
	}
	l, err := kernels.NewLayout(ids, 4, 2, 5, 1)
	require.NoError(t, err)
	require.Equal(t, []int32{2, 1, 0, 3, 2}, l.Counts)
	require.Equal(t, []int32{0, 2, 3, 3, 6, 8}, l.Offsets)
	// Rows sorted by expert, then token: pairs are token·2 + slot.
	require.Equal(t, []int32{0, 4, 2, 1, 3, 6, 5, 7}, l.Pairs)
	for p, r := range l.Rows {
		require.EqualValues(t, p, l.Pairs[r], "Rows is the inverse of Pairs")
	}

	// Padded to blocks of 4, as the GPU GEMM wants; padding holds the sentinel 8.
	l, err = kernels.NewLayout(ids, 4, 2, 5, 4)
	require.NoError(t, err)
	require.Equal(t, []int32{0, 4, 8, 8, 12, 16}, l.Offsets)
	require.Equal(t, []int32{0, 4, 8, 8, 2, 8, 8, 8, 1, 3, 6, 8, 5, 7, 8, 8}, l.Pairs)
	for p, r := range l.Rows {
		require.EqualValues(t, p, l.Pairs[r])
	}

	l, err = kernels.NewLayout(nil, 0, 3, 5, 1)
	require.NoError(t, err)
	require.Empty(t, l.Pairs)
}

func TestLayoutErrors(t *testing.T) {
	_, err := kernels.NewLayout([]int32{0, 5}, 1, 2, 5, 1)
	require.EqualError(t, err, "kernels: token 0 slot 1: expert id 5 out of range [0, 5)")
	_, err = kernels.NewLayout([]int32{-1, 2}, 1, 2, 5, 1)
	require.ErrorContains(t, err, "expert id -1 out of range")
	_, err = kernels.NewLayout([]int32{0, 1, 3, 3}, 2, 2, 5, 1)
	require.EqualError(t, err, "kernels: token 1: expert ids [3 3] are not strictly ascending")
	_, err = kernels.NewLayout([]int32{0, 1, 3}, 2, 2, 5, 1)
	require.ErrorContains(t, err, "3 expert ids for 2 tokens × top-2")
	_, err = kernels.NewLayout(nil, 0, 2, 5, 0)
	require.Error(t, err)
}
