//go:build cuda || cudaemu

package dpattngpu_test

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/dpattn/dpattngpu"
	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/kernels"
)

// mlaCase fills a paged cache with random sequences of the given lengths
// and returns the MLA decode input for it (the cache dense, fp32 or bf16 as
// the cache stores it) with attn.MLA's out and lse as the expected values.
func mlaCase(t *testing.T, seed uint64, lens []int32, heads, D, dv, bs, splitRows int, scale float32, dt kernels.DType) (dpattngpu.MLAInput, []float32, []float32) {
	t.Helper()
	blocks := 0
	for _, l := range lens {
		blocks += (int(l) + bs - 1) / bs
	}
	c, err := attn.NewCache(blocks, bs, D, dt)
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(seed, 1))
	maxBlocks := 0
	for s, l := range lens {
		rows := make([]float32, int(l)*D)
		for i := range rows {
			rows[i] = float32(rng.NormFloat64())
		}
		require.NoError(t, c.Append(s, rows))
		maxBlocks = max(maxBlocks, len(c.BlockTable(s)))
	}
	in := dpattngpu.MLAInput{BlockSize: bs, D: D, MaxBlocks: maxBlocks, SeqLens: lens, Heads: heads, DV: dv,
		SplitRows: splitRows, Scale: scale, BlockTable: make([]int32, len(lens)*maxBlocks)}
	queries := make([]attn.Query, len(lens))
	for s := range lens {
		copy(in.BlockTable[s*maxBlocks:], c.BlockTable(s))
		queries[s] = attn.Query{Table: c.BlockTable(s), Len: int(lens[s])}
	}
	in.Q = make([]float32, len(lens)*heads*D)
	for i := range in.Q {
		in.Q[i] = float32(rng.NormFloat64())
	}
	for b := 0; b < c.NumBlocks(); b++ {
		m := c.Block(b)
		for r := 0; r < bs; r++ {
			for x := 0; x < D; x++ {
				if dt == kernels.BF16 {
					in.CacheBF16 = append(in.CacheBF16, half.F32ToBF16(m.At(r, x)))
				} else {
					in.CacheF32 = append(in.CacheF32, m.At(r, x))
				}
			}
		}
	}
	want := make([]float32, len(lens)*heads*dv)
	wantLSE := make([]float32, len(lens)*heads)
	require.NoError(t, attn.MLA(context.Background(), c, in.Q, queries, attn.MLAParams{Heads: heads, ValueDim: dv, Scale: scale}, want, wantLSE))
	return in, want, wantLSE
}
