package serve_test

import (
	"context"
	"errors"
	"math"
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

// greedy is the argmax chain of a prompt, each token from a prefill of the
// prompt and the tokens before it: what a request must get whatever shares
// its steps.
func greedy(t *testing.T, m *model.Model, prompt []int32, n int) []int32 {
	toks := append([]int32(nil), prompt...)
	var out []int32
	for range n {
		logits, err := m.Prefill(context.Background(), toks)
		require.NoError(t, err)
		last := logits[(len(toks)-1)*m.Vocab:]
		best := 0
		for i, v := range last {
			if v > last[best] {
				best = i
			}
		}
		out = append(out, int32(best))
		toks = append(toks, int32(best))
	}
	return out
}

// collect reads a request's events to the end.
func collect(ch <-chan serve.Event) (toks []int32, last serve.Event) {
	for e := range ch {
		if e.Done {
			return toks, e
		}
		toks = append(toks, e.Token)
	}
	return toks, serve.Event{}
}

func start(t *testing.T, m *model.Model, blocks, blockRows int, o serve.Options) (*serve.Scheduler, *model.KV, context.CancelFunc, *sync.WaitGroup) {
	kv, err := m.NewKV(blocks, blockRows, kernels.F32)
	require.NoError(t, err)
	s, err := serve.New(m, kv, o)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { require.NoError(t, s.Run(ctx)) })
	return s, kv, cancel, &wg
}

// TestContinuousBatching: twelve requests at once on caches too small for
// all of them (so some wait and some are preempted) and a small step
// budget (so prompts go in chunks beside other requests' decode tokens)
// each get their own greedy chain; then every block is free again.
func TestContinuousBatching(t *testing.T) {
	m, err := model.NewRandom(model.Tiny(), 4)
	require.NoError(t, err)
	_, err = m.Prefill(context.Background(), []int32{1, 2, 3}) // the kernels' worker pools, if any, start here
	require.NoError(t, err)
	before := runtime.NumGoroutine()
	s, kv, cancel, wg := start(t, m, 12, 8, serve.Options{Budget: 16, NoPrefixCache: true}) // 96 rows in all
	type job struct {
		prompt []int32
		n      int
		ch     <-chan serve.Event
	}
	var jobs []job
	for i := range 12 {
		j := job{prompt: moetest.Tokens(uint64(i+10), 5+i*3, model.ByteVocab), n: 4 + i%5}
		j.ch, err = s.Submit(context.Background(), serve.Request{IDs: j.prompt, MaxNewTokens: j.n, Sampling: model.Sampling{TopP: 1}})
		require.NoError(t, err)
		jobs = append(jobs, j)
	}
	for i, j := range jobs {
		toks, last := collect(j.ch)
		require.NoError(t, last.Err, "request %d", i)
		require.Equal(t, "length", last.Reason)
		require.Equal(t, greedy(t, m, j.prompt, j.n), toks, "request %d", i)
	}
	require.Eventually(t, func() bool { r, w := s.Load(); return r == 0 && w == 0 }, time.Second, time.Millisecond)
	require.Equal(t, kv.NumBlocks(), kv.FreeBlocks(), "every block free again")
	st := s.Stats()
	require.Positive(t, st.Preemptions, "the caches were too small for every request at once")
	require.LessOrEqual(t, st.MaxBatch, 16, "the step budget")
	t.Logf("%+v", st)
	cancel()
	wg.Wait()
	// Polled here: Eventually runs its condition on a goroutine of its own.
	for i := 0; runtime.NumGoroutine() > before && i < 100; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines left, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
}

// TestStopsAndCancels: a stop id ends a request (unless ignore_eos), a
// cancelled request ends with its context's error and frees its blocks,
// a request larger than the caches and bad ones are refused, and stopping
// the scheduler ends what is left.
func TestStopsAndCancels(t *testing.T) {
	m, err := model.NewRandom(model.Tiny(), 5)
	require.NoError(t, err)
	s, kv, cancel, wg := start(t, m, 6, 8, serve.Options{Budget: 32, NoPrefixCache: true})
	prompt := moetest.Tokens(1, 9, model.ByteVocab)
	want := greedy(t, m, prompt, 3)

	ch, err := s.Submit(context.Background(), serve.Request{IDs: prompt, MaxNewTokens: 3, StopIDs: []int32{want[1]}, Sampling: model.Sampling{TopP: 1}})
	require.NoError(t, err)
	toks, last := collect(ch)
	require.Equal(t, want[:2], toks)
	require.Equal(t, "stop", last.Reason)
	ch, err = s.Submit(context.Background(), serve.Request{IDs: prompt, MaxNewTokens: 3, StopIDs: []int32{want[1]}, IgnoreEOS: true, Sampling: model.Sampling{TopP: 1}})
	require.NoError(t, err)
	toks, _ = collect(ch)
	require.Equal(t, want, toks)

	// Cancelled after its first token. The scheduler does not wait for
	// the reader (the channel holds every event), so on a loaded machine
	// the request can run to its end before the cancel: tried again then.
	cancelled := false
	for try := 0; try < 10 && !cancelled; try++ {
		rctx, rcancel := context.WithCancel(context.Background())
		ch, err = s.Submit(rctx, serve.Request{IDs: prompt, MaxNewTokens: 30, Sampling: model.Sampling{TopP: 1}})
		require.NoError(t, err)
		first := <-ch
		require.False(t, first.Done)
		rcancel()
		toks, last = collect(ch)
		if last.Err == nil {
			require.Equal(t, "length", last.Reason, "not cancelled: it ran to its end")
			require.Len(t, toks, 29)
		} else {
			require.ErrorIs(t, last.Err, context.Canceled)
			cancelled = true
		}
		require.Eventually(t, func() bool { return kv.FreeBlocks() == kv.NumBlocks() }, time.Second, time.Millisecond)
	}
	require.True(t, cancelled, "no try was cancelled before its end")

	_, err = s.Submit(context.Background(), serve.Request{IDs: prompt, MaxNewTokens: 40, Sampling: model.Sampling{TopP: 1}})
	require.ErrorIs(t, err, serve.ErrTooLarge)
	require.EqualError(t, err, "serve: request larger than the cache: a prompt of 9 tokens and 40 new ones need 49 cache rows; the cache holds 48")
	for _, tt := range []struct {
		r    serve.Request
		want string
	}{
		{serve.Request{MaxNewTokens: 1, Sampling: model.Sampling{TopP: 1}}, "serve: empty prompt"},
		{serve.Request{IDs: prompt, Sampling: model.Sampling{TopP: 1}}, "max_new_tokens 0 must be positive"},
		{serve.Request{IDs: []int32{3, 260}, MaxNewTokens: 1, Sampling: model.Sampling{TopP: 1}}, "prompt token 1 is id 260, outside the vocabulary [0, 260)"},
		{serve.Request{IDs: prompt, MaxNewTokens: 1, Sampling: model.Sampling{Temperature: -1, TopP: 1}}, "temperature -1"},
	} {
		_, err := s.Submit(context.Background(), tt.r)
		require.ErrorContains(t, err, tt.want)
	}

	// Stopping the scheduler ends the requests left, and refuses new ones.
	ch, err = s.Submit(context.Background(), serve.Request{IDs: prompt, MaxNewTokens: 30, Sampling: model.Sampling{TopP: 1}})
	require.NoError(t, err)
	cancel()
	wg.Wait()
	_, last = collect(ch)
	if last.Err != nil { // it may have finished first
		require.ErrorContains(t, last.Err, "serve: the scheduler has stopped")
	}
	_, err = s.Submit(context.Background(), serve.Request{IDs: prompt, MaxNewTokens: 1, Sampling: model.Sampling{TopP: 1}})
	require.True(t, errors.Is(err, context.Canceled), "%v", err)
}

// TestPrefixCache: requests sharing a system prompt find it in the prefix
// cache (whole blocks, never their last token) and get the greedy chains
// they get without it; a follow-up turn finds its whole conversation;
// prompts that need the whole cache evict the unused prefixes; the cache
// can be flushed only when idle, and then every block is free.
func TestPrefixCache(t *testing.T) {
	m, err := model.NewRandom(model.Tiny(), 7)
	require.NoError(t, err)
	_, err = m.Prefill(context.Background(), []int32{1})
	require.NoError(t, err)
	before := runtime.NumGoroutine()
	s, kv, cancel, wg := start(t, m, 20, 8, serve.Options{Budget: 64}) // 160 rows
	system := moetest.Tokens(30, 40, model.ByteVocab)                  // five blocks
	withQ := func(q int) []int32 {
		return append(append([]int32(nil), system...), moetest.Tokens(uint64(31+q), 5, model.ByteVocab)...)
	}
	run := func(prompt []int32, n int) <-chan serve.Event {
		ch, err := s.Submit(context.Background(), serve.Request{IDs: prompt, MaxNewTokens: n, Sampling: model.Sampling{TopP: 1}})
		require.NoError(t, err)
		return ch
	}
	first := withQ(0)
	toks, last := collect(run(first, 4))
	require.Equal(t, greedy(t, m, first, 4), toks)
	require.Zero(t, last.Cached)
	// It left its 48 computed tokens (45 + 3: the last one was never fed)
	// as six blocks.
	require.Equal(t, 6, s.Stats().CachedBlocks)

	chans := make([]<-chan serve.Event, 6)
	for q := range chans {
		chans[q] = run(withQ(q+1), 5)
	}
	for q, ch := range chans {
		toks, last := collect(ch)
		require.NoError(t, last.Err)
		require.Equal(t, greedy(t, m, withQ(q+1), 5), toks, "request %d", q+1)
		require.Equal(t, 40, last.Cached, "request %d: the system prompt's five blocks", q+1)
	}
	// The next turn of the first conversation: its 48 computed tokens.
	turn := append(append(append([]int32(nil), first...), greedy(t, m, first, 4)...), moetest.Tokens(40, 3, model.ByteVocab)...)
	toks, last = collect(run(turn, 3))
	require.Equal(t, greedy(t, m, turn, 3), toks)
	require.Equal(t, 48, last.Cached)
	st := s.Stats()
	require.Equal(t, 45*7+len(turn), st.PromptTokens)
	require.Equal(t, 40*6+48, st.CachedTokens)
	require.InDelta(t, float64(40*6+48)/float64(45*7+len(turn)), st.HitRate(), 1e-12)

	// Two prompts of 70 tokens (9 blocks each, 10 with their tokens) need
	// the blocks the cache holds: it gives up its least recently used.
	require.Equal(t, 6+6, st.CachedBlocks) // the first conversation's 6 blocks, a block of each question after the system prompt
	require.Zero(t, st.Evicted)
	big := []<-chan serve.Event{run(moetest.Tokens(50, 70, model.ByteVocab), 8), run(moetest.Tokens(51, 70, model.ByteVocab), 8)}
	for i, ch := range big {
		toks, last := collect(ch)
		require.NoError(t, last.Err)
		require.Equal(t, greedy(t, m, moetest.Tokens(uint64(50+i), 70, model.ByteVocab), 8), toks)
	}
	require.Eventually(t, func() bool { r, w := s.Load(); return r == 0 && w == 0 }, time.Second, time.Millisecond)
	require.Equal(t, kv.NumBlocks(), kv.FreeBlocks()+s.Stats().CachedBlocks, "every block free or the prefix cache's")
	require.Positive(t, s.Stats().Evicted)

	// Flushing: refused while a request runs, then every block free.
	ch := run(moetest.Tokens(60, 9, model.ByteVocab), 100)
	<-ch
	require.ErrorContains(t, s.FlushCache(), "serve: 1 requests are running or waiting; flush the cache when idle")
	collect(ch)
	require.Eventually(t, func() bool { r, w := s.Load(); return r == 0 && w == 0 }, time.Second, time.Millisecond)
	require.NoError(t, s.FlushCache())
	require.Equal(t, kv.NumBlocks(), kv.FreeBlocks())
	require.Zero(t, s.Stats().CachedBlocks)

	cancel()
	wg.Wait()
	for i := 0; runtime.NumGoroutine() > before && i < 100; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	require.LessOrEqual(t, runtime.NumGoroutine(), before, "goroutines left")
}

// TestPrefixBurst: eight prompts sharing a system prompt, sent at once,
// compute it once: the first is computed (in chunks beside nothing else),
// the others wait for it to reach the cache, then find it there; every
// request gets its greedy chain.
func TestPrefixBurst(t *testing.T) {
	m, err := model.NewRandom(model.Tiny(), 8)
	require.NoError(t, err)
	s, _, cancel, wg := start(t, m, 64, 8, serve.Options{Budget: 24})
	defer func() { cancel(); wg.Wait() }()
	system := moetest.Tokens(70, 40, model.ByteVocab)
	prompts := make([][]int32, 8)
	chans := make([]<-chan serve.Event, 8)
	for i := range prompts {
		prompts[i] = append(append([]int32(nil), system...), moetest.Tokens(uint64(71+i), 6, model.ByteVocab)...)
		chans[i], err = s.Submit(context.Background(), serve.Request{IDs: prompts[i], MaxNewTokens: 3, Sampling: model.Sampling{TopP: 1}})
		require.NoError(t, err)
	}
	cached := 0
	for i, ch := range chans {
		toks, last := collect(ch)
		require.NoError(t, last.Err)
		require.Equal(t, greedy(t, m, prompts[i], 3), toks, "request %d", i)
		cached += last.Cached
	}
	require.Equal(t, 7*40, cached, "all but the first found the system prompt")
	require.Equal(t, 7*40, s.Stats().CachedTokens)
}

// TestNoStall: a waiting request that found its prefix cached but cannot
// fit yet holds nothing while it waits, so the running request can evict
// that prefix for the blocks it needs; both finish. A max_new_tokens that
// would overflow the size check is refused, not a panic.
func TestNoStall(t *testing.T) {
	m, err := model.NewRandom(model.Tiny(), 13)
	require.NoError(t, err)
	s, kv, cancel, wg := start(t, m, 10, 2, serve.Options{Budget: 64}) // 20 rows
	defer func() { cancel(); wg.Wait() }()
	p := moetest.Tokens(80, 10, model.ByteVocab)
	run := func(prompt []int32, n int) <-chan serve.Event {
		ch, err := s.Submit(context.Background(), serve.Request{IDs: prompt, MaxNewTokens: n, Sampling: model.Sampling{TopP: 1}})
		require.NoError(t, err)
		return ch
	}
	collect(run(p, 1)) // p's five blocks stay in the prefix cache
	r := moetest.Tokens(81, 8, model.ByteVocab)
	q := append(append([]int32(nil), p...), moetest.Tokens(82, 9, model.ByteVocab)...)
	chR, chQ := run(r, 10), run(q, 1)
	done := make(chan struct{})
	go func() {
		collect(chR)
		collect(chQ)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the requests stalled")
	}
	require.Eventually(t, func() bool { r, w := s.Load(); return r == 0 && w == 0 }, time.Second, time.Millisecond)
	require.Equal(t, kv.NumBlocks(), kv.FreeBlocks()+s.Stats().CachedBlocks)

	_, err = s.Submit(context.Background(), serve.Request{IDs: p, MaxNewTokens: math.MaxInt, Sampling: model.Sampling{TopP: 1}})
	require.ErrorIs(t, err, serve.ErrTooLarge)
}
