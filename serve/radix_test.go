package serve

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/model"
)

// TestRadixTree: prefixes that differ inside their first block are
// different children; a match ends on a block boundary, never past its
// limit, splitting the node it ends in; a request's hold covers the nodes
// above it even after a later split; eviction takes the least recently used
// unheld leaves, and a parent left childless after them; flush refuses
// while a prefix is held.
func TestRadixTree(t *testing.T) {
	m, err := model.NewRandom(model.Tiny(), 1)
	require.NoError(t, err)
	kv, err := m.NewKV(16, 4, kernels.F32)
	require.NoError(t, err)
	// cached computes ids as sequence 0 and leaves them in the tree.
	p := newPrefixCache(kv)
	cached := func(ids ...int32) {
		_, err := m.Forward(context.Background(), kv, make([]int, len(ids)), ids, []int{0})
		require.NoError(t, err)
		_, err = p.insert(ids, 0)
		require.NoError(t, err)
		require.NoError(t, kv.Free(0))
	}
	cached(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13) // 3 blocks (13th token: no whole block)
	require.Equal(t, 3, p.held)
	cached(1, 2, 3, 9, 5, 6, 7, 8) // differs in the first block: a child of its own
	require.Equal(t, 5, p.held)
	require.Len(t, p.root.children, 2)
	cached(1, 2, 3, 4, 5, 6, 7, 8, 20, 21, 22, 23) // splits the first after 8 tokens
	require.Equal(t, 6, p.held)

	last, n, runs := p.match([]int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}, 12)
	require.Equal(t, 12, n)
	require.Len(t, runs, 2) // [1…8] and [9…12]
	require.Equal(t, 2, runs[0].Len())
	_, n, _ = p.match([]int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}, 11)
	require.Equal(t, 8, n, "never past the limit")
	_, n, _ = p.match([]int32{1, 2, 3, 4, 5, 6, 7}, 7)
	require.Equal(t, 4, n, "whole blocks only")
	_, n, _ = p.match([]int32{7, 2, 3, 4, 5}, 5)
	require.Zero(t, n)

	p.lock(last, 1)
	// Splitting the held node [1…8] at 4 (by a prefix ending there): the
	// hold still covers the new parent.
	_, n, _ = p.match([]int32{1, 2, 3, 4, 0, 0, 0, 0}, 8)
	require.Equal(t, 4, n)
	top := p.root.children[p.blockKey([]int32{1, 2, 3, 4})]
	require.Equal(t, 4, len(top.key))
	require.Equal(t, 1, top.users)
	require.ErrorIs(t, p.flush(), errInUse)

	// The held path [1…4][5…8][9…12] stays; [1,2,3,9 …] (2 blocks) is the
	// oldest unheld leaf, then [20…23].
	free := kv.FreeBlocks()
	require.Equal(t, 2, p.evict(1))
	require.Equal(t, free+2, kv.FreeBlocks())
	require.Equal(t, 1, p.evict(5), "only [20…23] is unheld")
	require.Equal(t, 3, p.held)
	p.lock(last, -1)
	require.Zero(t, top.users)
	require.NoError(t, p.flush())
	require.Zero(t, p.held)
	require.Equal(t, kv.NumBlocks(), kv.FreeBlocks())
}
