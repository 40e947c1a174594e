package attn_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/kernels"
)

// TestHeadShard: the heads split over tensor-parallel ranks, each rank
// caching every token's latent row and computing its heads, give summed
// (the all-reduce) the float64 reference's output within 1e-5, for a
// prefill and decode steps; the ranks' caches hold the same rows.
func TestHeadShard(t *testing.T) {
	for i, tt := range []struct {
		spec  moetest.AttnSpec
		ranks int
	}{
		{moetest.AttnSpec{Hidden: 48, Heads: 4, KVLoraRank: 32, Nope: 16, Rope: 8, VDim: 16, Theta: 10000, DType: "F32", Seed: 1}, 2},
		{moetest.AttnSpec{Hidden: 40, Heads: 3, QLoraRank: 24, KVLoraRank: 40, Nope: 8, Rope: 16, VDim: 12, Theta: 10000, Yarn: true, DType: "BF16", Seed: 2}, 3},
		{moetest.AttnSpec{Hidden: 48, Heads: 4, KVLoraRank: 32, Nope: 16, Rope: 8, VDim: 16, Theta: 10000, DType: "BF16", Seed: 6}, 4},
	} {
		t.Run(fmt.Sprintf("case%d", i), func(t *testing.T) {
			s := tt.spec
			dir, ref := attnCheckpoint(t, s)
			b, err := attn.LoadMLABlock(dir, 0)
			require.NoError(t, err)
			defer b.Close()
			shards := make([]*attn.MLABlock, tt.ranks)
			caches := make([]*attn.Cache, tt.ranks)
			for r := range shards {
				shards[r], err = b.HeadShard(r, tt.ranks)
				require.NoError(t, err)
				require.Equal(t, s.Heads/tt.ranks, shards[r].Cfg.Heads)
				caches[r], err = attn.NewCache(16, 8, b.RowDim(), kernels.F32)
				require.NoError(t, err)
			}
			const prompt, extra = 13, 3
			H := s.Hidden
			x := moetest.Input(uint64(i), prompt+extra, H, false)
			want := ref.Forward(x)
			step := func(seqs []int, x []float32) []float32 {
				sum := make([]float32, len(x))
				for r, sh := range shards {
					part := make([]float32, len(x))
					require.NoError(t, sh.Forward(context.Background(), caches[r], seqs, x, part))
					for j, v := range part {
						sum[j] += v
					}
				}
				return sum
			}
			got := step(make([]int, prompt), x[:prompt*H])
			require.LessOrEqual(t, moetest.RelErr(got, want[:prompt*H]), 1e-5, "prefill")
			for j := prompt; j < prompt+extra; j++ {
				got := step([]int{0}, x[j*H:(j+1)*H])
				require.LessOrEqual(t, moetest.RelErr(got, want[j*H:(j+1)*H]), 1e-5, "decode position %d", j)
			}
			for r := range caches {
				require.Equal(t, prompt+extra, caches[r].Len(0))
				blk := caches[r].BlockTable(0)[1]
				require.Equal(t, caches[0].Block(int(caches[0].BlockTable(0)[1])).At(3, 5), caches[r].Block(int(blk)).At(3, 5),
					"every rank caches the same latent rows")
			}
		})
	}
	dir, _ := attnCheckpoint(t, moetest.AttnSpec{Hidden: 48, Heads: 4, KVLoraRank: 32, Nope: 16, Rope: 8, VDim: 16, Theta: 10000, DType: "F32", Seed: 1})
	b, err := attn.LoadMLABlock(dir, 0)
	require.NoError(t, err)
	defer b.Close()
	_, err = b.HeadShard(0, 3)
	require.EqualError(t, err, "attn: 4 attention heads do not split over 3 tensor-parallel ranks")
	_, err = b.HeadShard(2, 2)
	require.EqualError(t, err, "attn: head shard 2 of 2 ranks")
	dir, _ = attnCheckpoint(t, moetest.AttnSpec{Hidden: 48, Heads: 2, KVLoraRank: 32, Nope: 16, Rope: 8, VDim: 16, Theta: 10000, DType: "F8_E4M3", Seed: 5})
	f8, err := attn.LoadMLABlock(dir, 0)
	require.NoError(t, err)
	defer f8.Close()
	_, err = f8.HeadShard(0, 2)
	require.ErrorContains(t, err, "F8_E4M3 weights are not split by heads")
}
