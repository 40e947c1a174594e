package serve_test

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/model"
	"github.com/moex-project/moex/serve"
)

// TestGroup: DP attention inside one instance. Two ranks with caches of
// their own; the controller spreads requests (round robin, shortest queue);
// every request gets the greedy chain a single model gives it, with the
// ranks stepping together (one idle while the other runs, prompts sharing
// a prefix found in the rank's prefix cache), in both MoE modes; every
// block ends free or in a prefix cache; no goroutine is left.
func TestGroup(t *testing.T) {
	m, err := model.NewRandom(model.Tiny(), 12)
	require.NoError(t, err)
	_, err = m.Prefill(context.Background(), []int32{1})
	require.NoError(t, err)
	system := moetest.Tokens(90, 24, model.ByteVocab)
	prompts := make([][]int32, 10)
	for i := range prompts {
		prompts[i] = moetest.Tokens(uint64(91+i), 3+i*2, model.ByteVocab)
		if i%3 == 0 {
			prompts[i] = append(append([]int32(nil), system...), prompts[i]...)
		}
	}
	want := make([][]int32, len(prompts))
	for i, p := range prompts {
		want[i] = greedy(t, m, p, 2+i%4)
	}
	before := runtime.NumGoroutine()
	for _, tt := range []struct{ mode, balance string }{
		{"alltoall", serve.RoundRobin}, {"gather", serve.ShortestQueue}, {"alltoall", serve.ShortestQueue},
	} {
		t.Run(tt.mode+"/"+tt.balance, func(t *testing.T) {
			dp, err := m.NewDP(2, tt.mode)
			require.NoError(t, err)
			kvs := make([]*model.KV, 2)
			for r := range kvs {
				kvs[r], err = m.NewKV(10, 8, kernels.F32) // small: evictions
				require.NoError(t, err)
			}
			g, err := serve.NewGroup(m, dp, kvs, serve.Options{Budget: 16}, tt.balance)
			require.NoError(t, err)
			require.Equal(t, 2, g.Ranks())
			chans := make([]<-chan serve.Event, len(prompts))
			for i, p := range prompts {
				chans[i], err = g.Submit(context.Background(), serve.Request{IDs: p, MaxNewTokens: len(want[i]), Sampling: model.Sampling{TopP: 1}})
				require.NoError(t, err)
			}
			loads := g.RankLoads()
			require.Equal(t, 5, loads[0].Waiting, "the controller spread them before any ran")
			require.Equal(t, 5, loads[1].Waiting)
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			wg.Go(func() { require.NoError(t, g.Run(ctx)) })
			for i, ch := range chans {
				toks, last := collect(ch)
				require.NoError(t, last.Err, "request %d", i)
				require.Equal(t, want[i], toks, "request %d", i)
			}
			// A late request on an idle group: it wakes and runs.
			ch, err := g.Submit(context.Background(), serve.Request{IDs: prompts[1], MaxNewTokens: len(want[1]), Sampling: model.Sampling{TopP: 1}})
			require.NoError(t, err)
			toks, _ := collect(ch)
			require.Equal(t, want[1], toks)
			require.Eventually(t, func() bool { r, w := g.Load(); return r == 0 && w == 0 }, time.Second, time.Millisecond)
			st, sum := g.Stats(), len(prompts[1])
			for _, p := range prompts {
				sum += len(p)
			}
			require.Equal(t, sum, st.PromptTokens)
			require.Positive(t, st.CachedTokens, "the shared system prompt and the repeated prompt")
			t.Logf("%+v", st)
			free, total := g.Blocks()
			require.Equal(t, 20, total)
			require.Equal(t, total, free+g.Stats().CachedBlocks)
			require.NoError(t, g.FlushCache())
			free, _ = g.Blocks()
			require.Equal(t, total, free)
			cancel()
			wg.Wait()
			_, err = g.Submit(context.Background(), serve.Request{IDs: prompts[1], MaxNewTokens: 1, Sampling: model.Sampling{TopP: 1}})
			require.ErrorContains(t, err, "the scheduler has stopped")
		})
	}
	for i := 0; runtime.NumGoroutine() > before && i < 100; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	require.LessOrEqual(t, runtime.NumGoroutine(), before, "goroutines left")
	dp, err := m.NewDP(2, "alltoall")
	require.NoError(t, err)
	_, err = serve.NewGroup(m, dp, nil, serve.Options{Budget: 1}, serve.RoundRobin)
	require.EqualError(t, err, "serve: 0 caches for 2 ranks")
	kv, err := m.NewKV(2, 2, kernels.F32)
	require.NoError(t, err)
	_, err = serve.NewGroup(m, dp, []*model.KV{kv, kv}, serve.Options{Budget: 1}, "random")
	require.EqualError(t, err, `serve: load-balance method "random" (have round_robin, shortest_queue)`)
	_, err = serve.NewGroup(m, nil, nil, serve.Options{Budget: 1}, serve.RoundRobin)
	require.EqualError(t, err, "serve: a group needs a model and its DP ranks")
}
