package router

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func workers(loads ...int64) []*Worker {
	ws := make([]*Worker, len(loads))
	for i, l := range loads {
		ws[i] = &Worker{URL: fmt.Sprint("http://w", i)}
		ws[i].load.Store(l)
		ws[i].healthy.Store(true)
	}
	return ws
}

func pick(t *testing.T, p Policy, ws []*Worker, text string) (*Worker, string) {
	t.Helper()
	w, d := p.Pick(&Request{Text: []byte(text)}, ws)
	require.NotNil(t, w)
	return w, d
}

func TestLeastLoadedTies(t *testing.T) {
	ws := workers(3, 1, 1, 2)
	ws[1].processed.Store(5)
	ws[2].processed.Store(4)
	require.Same(t, ws[2], leastLoaded(ws), "equal loads: fewer processed")
	ws[2].processed.Store(5)
	require.Same(t, ws[1], leastLoaded(ws), "and then the first")
}

// TestCacheAware: hits go to the least loaded holder; misses to the least
// loaded worker, so a busy worker with unique prompts (the smallest tree)
// does not get every miss (the death spiral); imbalanced loads go to the
// least loaded whatever is cached.
func TestCacheAware(t *testing.T) {
	ca := CacheAware{Threshold: 0.5, BalanceAbs: 4, BalanceRel: 1.5, SpillAbs: 2, SpillRel: 1.2}
	tree := NewTree(1 << 20)
	p, err := NewPolicy("cache_aware", tree, ca, 1)
	require.NoError(t, err)
	ws := workers(0, 0, 0)
	system := "You are a helpful assistant. Answer briefly. "

	// A hit: the worker that holds the prefix, though others are as idle.
	tree.Insert([]byte(system+"first"), ws[1].URL)
	w, d := pick(t, p, ws, system+"2nd")
	require.Same(t, ws[1], w)
	require.Equal(t, "hit", d)
	tree.Insert([]byte(system+"third"), ws[2].URL)
	ws[1].load.Store(1)
	w, d = pick(t, p, ws, system+"4th")
	require.Same(t, ws[2], w, "the less loaded of two holders")
	require.Equal(t, "hit", d)
	// Below the threshold: a miss, to the least loaded.
	w, d = pick(t, p, ws, "You are"+" somebody else entirely, with a long different text")
	require.Equal(t, "miss", d)
	require.Same(t, ws[0], w)

	// The death spiral: worker 0 is busy with unique prompts (its tree is
	// the smallest); misses go to the least loaded, never all to it.
	ws = workers(3, 0, 1)
	got := map[string]int{}
	for i := range 12 {
		w, d := pick(t, p, ws, fmt.Sprintf("unique prompt %d with nothing shared", i))
		require.Equal(t, "miss", d)
		got[w.URL]++
		w.acquire() // it runs
	}
	// v0.4's rule (the smallest tree) would have sent all twelve to worker
	// 0; the least loaded rule sends it only its share once the others
	// have caught up with it.
	require.LessOrEqual(t, got[ws[0].URL], 3, "%v", got)
	for _, w := range ws {
		require.InDelta(t, 16.0/3, float64(w.Load()), 1, "the loads end level")
	}

	// Imbalance (9 − 1 > 4 and 9 > 1.5): the least loaded, though worker 0
	// holds the prefix.
	ws = workers(9, 1, 2)
	tree.Insert([]byte(system+"x"), ws[0].URL)
	w, d = pick(t, p, ws, system+"x")
	require.Equal(t, "imbalance", d)
	require.Same(t, ws[1], w)
}

// TestSpill: a single hot prefix on a busy worker spills to the least
// loaded worker before the loads are imbalanced, and the spill target then
// holds the prefix too and takes its share of the next requests.
func TestSpill(t *testing.T) {
	tree := NewTree(1 << 20)
	p, _ := NewPolicy("cache_aware", tree, CacheAware{Threshold: 0.5, BalanceAbs: 8, BalanceRel: 1.5, SpillAbs: 2, SpillRel: 1.2}, 1)
	system := "a long shared system prompt, the only one "
	ws := workers(0, 0, 0, 0)
	tree.Insert([]byte(system+"q0"), ws[0].URL)
	var seq []string
	for i := range 40 {
		w, d := pick(t, p, ws, fmt.Sprintf("%sq%d", system, i+1))
		require.NotEqual(t, "imbalance", d, "request %d", i)
		seq = append(seq, d)
		w.acquire() // every request stays in flight
	}
	require.Contains(t, seq, "spill")
	for _, w := range ws {
		require.Positive(t, w.Load(), "the hot prefix reached %s", w.URL)
		m, _ := tree.MatchInsert([]byte(system+"q"), func(Match) string { return "" })
		require.Contains(t, m.Holders, w.URL)
	}
	// No worker more than the spill gate above the others.
	hi, lo := int64(0), int64(1<<62)
	for _, w := range ws {
		hi, lo = max(hi, w.Load()), min(lo, w.Load())
	}
	require.LessOrEqual(t, hi-lo, int64(6), "the imbalance test never had to act")
}

func TestSimplePolicies(t *testing.T) {
	ws := workers(0, 5, 9)
	rr, _ := NewPolicy("round_robin", nil, CacheAware{}, 1)
	var order []string
	for range 4 {
		w, _ := pick(t, rr, ws, "x")
		order = append(order, w.URL)
	}
	require.Equal(t, []string{ws[0].URL, ws[1].URL, ws[2].URL, ws[0].URL}, order)
	p2, _ := NewPolicy("power_of_two", nil, CacheAware{}, 1)
	seen := map[string]int{}
	for range 600 {
		w, _ := pick(t, p2, ws, "x")
		seen[w.URL]++
	}
	require.Zero(t, seen[ws[2].URL], "the most loaded never wins a pair")
	require.Positive(t, seen[ws[1].URL])
	ll, _ := NewPolicy("least_load", nil, CacheAware{}, 1)
	w, _ := pick(t, ll, ws, "x")
	require.Same(t, ws[0], w)
	rnd, _ := NewPolicy("random", nil, CacheAware{}, 1)
	seen = map[string]int{}
	for range 300 {
		w, _ := pick(t, rnd, ws, "x")
		seen[w.URL]++
	}
	require.Len(t, seen, 3)
	_, err := NewPolicy("fastest", nil, CacheAware{}, 1)
	require.ErrorContains(t, err, `unknown policy "fastest"`)
}

// TestConsistentHash: a key always goes to the same worker; when a worker
// leaves, only its keys move.
func TestConsistentHash(t *testing.T) {
	p, _ := NewPolicy("consistent_hash", nil, CacheAware{}, 1)
	ws := workers(0, 0, 0, 0)
	where := map[string]*Worker{}
	count := map[string]int{}
	for i := range 400 {
		key := fmt.Sprint("session-", i)
		w, _ := p.Pick(&Request{Key: key, Text: []byte("whatever")}, ws)
		where[key] = w
		count[w.URL]++
		again, _ := p.Pick(&Request{Key: key, Text: []byte("other text")}, ws)
		require.Same(t, w, again)
	}
	for _, w := range ws {
		require.Greater(t, count[w.URL], 40, "%v", count) // ~100 each
	}
	rest := []*Worker{ws[0], ws[1], ws[3]}
	for key, w := range where {
		now, _ := p.Pick(&Request{Key: key}, rest)
		if w != ws[2] {
			require.Same(t, w, now, "key %s moved though its worker stayed", key)
		}
	}
	// A worker removed and added again under its URL is a new *Worker: the
	// ring gives the one in the list, never the old one.
	again := workers(0, 0, 0, 0)
	for key := range where {
		w, _ := p.Pick(&Request{Key: key}, again)
		require.Contains(t, again, w)
	}
	// Without a key, the text is the key.
	a, _ := p.Pick(&Request{Text: []byte("same text")}, ws)
	b, _ := p.Pick(&Request{Text: []byte("same text")}, ws)
	require.Same(t, a, b)
}

func TestBreaker(t *testing.T) {
	var b breaker
	b.init(3, 2, time.Minute)
	clock := time.Unix(0, 0)
	b.now = func() time.Time { return clock }
	b.record(false)
	b.record(false)
	b.record(true) // resets
	b.record(false)
	b.record(false)
	require.True(t, b.allow())
	b.record(false)
	require.False(t, b.allow(), "three failures in a row: open")
	require.Equal(t, "open", b.State())
	clock = clock.Add(time.Minute)
	require.True(t, b.allow(), "after the timeout: half-open")
	b.begin()
	require.False(t, b.allow(), "one trial at a time")
	b.end() // it ended without an outcome (a client gone)
	require.True(t, b.allow())
	b.begin()
	b.record(false)
	b.end()
	require.False(t, b.allow(), "a half-open failure opens it again")
	clock = clock.Add(time.Minute)
	require.True(t, b.allow())
	b.begin()
	b.record(true)
	b.end()
	require.Equal(t, "half-open", b.State())
	require.True(t, b.allow(), "the next trial")
	b.begin()
	b.record(true)
	b.end()
	require.Equal(t, "closed", b.State())
}
