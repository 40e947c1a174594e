package model_test

import (
	"context"
	"math"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/model"
)

// TestDP: two data-parallel ranks, each with its own caches and
// sequences, stepping together (rank 1 idle in some steps, a step where
// neither has tokens skipped), give every token the logits a single
// model gives it: bit for bit with all-to-all MoE, within 1e-6 with gather
// mode (its sums go in another order). A rank whose call is refused joins
// the step idle and reports its error; the other's tokens are computed.
func TestDP(t *testing.T) {
	m, err := model.NewRandom(model.Tiny(), 11)
	require.NoError(t, err)
	V := model.ByteVocab
	prompts := [][]int32{moetest.Tokens(1, 9, V), moetest.Tokens(2, 4, V), moetest.Tokens(3, 6, V)}
	alone := func(ids []int32) []float32 { return prefillAlone(t, m, ids, kernels.F32) }
	// Each step: per rank, (sequence, how many of its next tokens).
	type chunk struct{ seq, n int }
	steps := [][2][]chunk{
		{{{0, 5}, {1, 4}}, {}}, // rank 1 idle
		{{{0, 4}}, {{2, 3}}},   // both
		{{}, {}},               // skipped
		{{}, {{2, 3}}},         // rank 0 idle
	}
	rankOf := []int{0, 0, 1}
	for _, mode := range []string{"alltoall", "gather"} {
		t.Run(mode, func(t *testing.T) {
			dp, err := m.NewDP(2, mode)
			require.NoError(t, err)
			kvs := make([]*model.KV, 2)
			for r := range kvs {
				kvs[r], err = m.NewKV(8, 8, kernels.F32)
				require.NoError(t, err)
			}
			got := make([][]float32, 3)
			pos := make([]int, 3)
			for _, st := range steps {
				var wg sync.WaitGroup
				out := make([][]float32, 2)
				errs := make([]error, 2)
				calls := make([][]int, 2)
				for r := range 2 {
					var seqs []int
					var ids []int32
					for _, c := range st[r] {
						for i := range c.n {
							seqs = append(seqs, c.seq)
							ids = append(ids, prompts[c.seq][pos[c.seq]+i])
						}
						pos[c.seq] += c.n
					}
					calls[r] = seqs
					wg.Go(func() { out[r], errs[r] = dp.Forward(context.Background(), r, kvs[r], seqs, ids, nil) })
				}
				wg.Wait()
				for r := range 2 {
					require.NoError(t, errs[r])
					for i, s := range calls[r] {
						got[s] = append(got[s], out[r][i*V:(i+1)*V]...)
					}
				}
			}
			for s, p := range prompts {
				want := alone(p)
				require.Equal(t, len(p), kvs[rankOf[s]].Len(s))
				if mode == "alltoall" {
					require.Equal(t, want, got[s], "sequence %d", s)
					continue
				}
				num, den := 0.0, 0.0
				for i := range want {
					d := float64(got[s][i] - want[i])
					num += d * d
					den += float64(want[i]) * float64(want[i])
				}
				require.LessOrEqual(t, math.Sqrt(num/den), 1e-6, "sequence %d", s)
			}

			// Rank 1's call is refused (an id out of the vocabulary): it
			// runs idle, says why, and rank 0's token is computed.
			var wg sync.WaitGroup
			errs := make([]error, 2)
			var l0 []float32
			wg.Go(func() { l0, errs[0] = dp.Forward(context.Background(), 0, kvs[0], []int{1}, []int32{7}, nil) })
			wg.Go(func() { _, errs[1] = dp.Forward(context.Background(), 1, kvs[1], []int{2}, []int32{int32(V)}, nil) })
			wg.Wait()
			require.NoError(t, errs[0])
			require.Len(t, l0, V)
			require.ErrorContains(t, errs[1], "outside the vocabulary")
			require.Equal(t, 6, kvs[1].Len(2), "the refused call left the caches alone")
		})
	}
	_, err = m.NewDP(0, "alltoall")
	require.ErrorContains(t, err, "0 data-parallel ranks")
	_, err = m.NewDP(2, "broadcast")
	require.ErrorContains(t, err, `MoE mode "broadcast"`)
}

// TestDPGroupedQuery: data-parallel attention over a grouped-query model
// (gpt-oss's: biases, sinks, windows) — each rank its own sequences and
// caches, the MoE in all-to-all mode — gives every token, bit for bit,
// the logits of the single model.
func TestDPGroupedQuery(t *testing.T) {
	_, m := loadWhole(t, gqaSpecs()["gpt_oss_bf16"], nil)
	V := m.Vocab
	prompts := [][]int32{moetest.Tokens(4, 9, V), moetest.Tokens(5, 6, V)}
	dp, err := m.NewDP(2, "alltoall")
	require.NoError(t, err)
	kvs := make([]*model.KV, 2)
	for r := range kvs {
		kvs[r], err = m.NewKV(8, 4, kernels.F32)
		require.NoError(t, err)
	}
	var wg sync.WaitGroup
	out := make([][]float32, 2)
	errs := make([]error, 2)
	for r := range 2 {
		wg.Go(func() {
			out[r], errs[r] = dp.Forward(context.Background(), r, kvs[r], make([]int, len(prompts[r])), prompts[r], nil)
		})
	}
	wg.Wait()
	for r, p := range prompts {
		require.NoError(t, errs[r])
		require.Equal(t, prefillAlone(t, m, p, kernels.F32), out[r], "rank %d", r)
	}
}
