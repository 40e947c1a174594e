package router

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Worker is one upstream worker as the router sees it: its requests in
// flight through this router (taken before a request is sent, given back
// when its response has ended, whatever way), the requests sent, its
// health and its circuit breaker.
type Worker struct {
	URL       string
	load      atomic.Int64
	processed atomic.Int64
	healthy   atomic.Bool
	breaker   breaker

	fails, oks int // consecutive health-check outcomes (the checker's)
}

// Load is the worker's requests in flight through the router.
func (w *Worker) Load() int64 { return w.load.Load() }

// Healthy is whether the worker takes requests.
func (w *Worker) Healthy() bool { return w.healthy.Load() }

// acquire counts a request in flight; the returned release gives it back
// (once, however often it is called).
func (w *Worker) acquire() (release func()) {
	w.load.Add(1)
	w.processed.Add(1)
	var once sync.Once
	return func() { once.Do(func() { w.load.Add(-1) }) }
}

// breaker is a worker's circuit breaker: closed, it lets requests through
// and opens after failures consecutive failures; open, it refuses them
// until timeout has passed, then half-open lets one trial request through
// at a time, closing after successes consecutive successes and opening
// again at a failure.
type breaker struct {
	mu                  sync.Mutex
	failures, successes int
	timeout             time.Duration
	state               string // "closed", "open", "half-open"
	trial               bool   // half-open: a trial request is out
	fails, oks          int
	opened              time.Time
	now                 func() time.Time
}

func (b *breaker) init(failures, successes int, timeout time.Duration) {
	b.failures, b.successes, b.timeout, b.state, b.now = failures, successes, timeout, "closed", time.Now
}

// allow says whether a request may go to the worker now.
func (b *breaker) allow() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == "open" && b.now().Sub(b.opened) >= b.timeout {
		b.state, b.oks, b.trial = "half-open", 0, false
	}
	return b.state == "closed" || b.state == "half-open" && !b.trial
}

// begin marks a request sent to the worker: half-open, it is the trial.
func (b *breaker) begin() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == "half-open" {
		b.trial = true
	}
}

// end marks the request begun ended, with its outcome recorded or not (a
// client gone, a 4xx): the next may be a trial.
func (b *breaker) end() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.trial = false
}

// record counts a request's outcome.
func (b *breaker) record(ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failures <= 0 {
		return // disabled
	}
	switch {
	case ok && b.state == "half-open":
		if b.oks++; b.oks >= b.successes {
			b.state, b.fails = "closed", 0
		}
	case ok:
		b.fails = 0
	case b.state == "half-open":
		b.state, b.opened = "open", b.now()
	case b.state == "open":
		// A request let through before it opened: the open period stands.
	default:
		if b.fails++; b.fails >= b.failures {
			b.state, b.opened = "open", b.now()
		}
	}
}

// State is the breaker's state: closed, open or half-open.
func (b *breaker) State() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}

// Request is what a policy sees of a request: the text matched against the
// tree and the routing key (a header) for consistent hashing.
type Request struct {
	Text []byte
	Key  string
}

// A Policy picks the worker for a request among the eligible ones (healthy,
// circuit not open, not yet tried for it; never empty), in registration
// order, and names its decision (for the metrics).
type Policy interface {
	Name() string
	Pick(r *Request, ws []*Worker) (w *Worker, decision string)
}

// Policies are the names NewPolicy knows.
var Policies = []string{"cache_aware", "round_robin", "random", "power_of_two", "least_load", "consistent_hash"}

// CacheAware is the cache-aware policy's settings.
type CacheAware struct {
	// Threshold: a match rate above it is a hit.
	Threshold float64
	// BalanceAbs and BalanceRel: the loads are imbalanced when max − min >
	// BalanceAbs and max > min × BalanceRel.
	BalanceAbs, BalanceRel float64
	// SpillAbs and SpillRel: a hit's worker spills when its load is above
	// mean + SpillAbs and above mean × SpillRel. They must be tighter than
	// the balance pair to ever act: once the imbalance test has passed, a
	// worker's load is at most max ≤ min × BalanceRel ≤ mean × BalanceRel,
	// and max − min ≤ BalanceAbs.
	SpillAbs, SpillRel float64
}

// NewPolicy makes the policy of that name; cache_aware uses tree and ca.
func NewPolicy(name string, tree *Tree, ca CacheAware, seed uint64) (Policy, error) {
	rng := &lockedRand{r: rand.New(rand.NewPCG(seed, 0x726f7574))}
	switch name {
	case "cache_aware":
		return &cacheAware{tree: tree, CacheAware: ca}, nil
	case "round_robin":
		return &roundRobin{}, nil
	case "random":
		return randomPolicy{rng}, nil
	case "power_of_two":
		return powerOfTwo{rng}, nil
	case "least_load":
		return leastLoad{}, nil
	case "consistent_hash":
		return &consistentHash{}, nil
	}
	return nil, fmt.Errorf("router: unknown policy %q (have %s)", name, strings.Join(Policies, ", "))
}

// leastLoaded is the worker of least load, ties broken by fewer requests
// processed, then registration order.
func leastLoaded(ws []*Worker) *Worker {
	best := ws[0]
	for _, w := range ws[1:] {
		l, bl := w.load.Load(), best.load.Load()
		if l < bl || l == bl && w.processed.Load() < best.processed.Load() {
			best = w
		}
	}
	return best
}

type cacheAware struct {
	tree *Tree
	CacheAware
}

func (*cacheAware) Name() string { return "cache_aware" }

// Pick: imbalanced loads go to the least loaded; otherwise a hit goes to
// the least loaded worker holding the matched prefix, unless its load is far
// above the mean (it spills to the least loaded, for which the prefix is
// inserted too, so hot prefixes replicate); a miss goes to the least loaded
// — never to the smallest tree, which would send every miss to a busy
// worker whose prompts are all unique.
func (p *cacheAware) Pick(r *Request, ws []*Worker) (*Worker, string) {
	least := leastLoaded(ws)
	lo, hi, sum := least.load.Load(), int64(0), int64(0)
	for _, w := range ws {
		l := w.load.Load()
		hi = max(hi, l)
		sum += l
	}
	if float64(hi-lo) > p.BalanceAbs && float64(hi) > float64(lo)*p.BalanceRel {
		p.tree.Insert(r.Text, least.URL)
		return least, "imbalance"
	}
	mean := float64(sum) / float64(len(ws))
	var chosen *Worker
	decision := "miss"
	p.tree.MatchInsert(r.Text, func(m Match) string {
		chosen = least
		if m.Rate <= p.Threshold {
			return least.URL
		}
		var holders []*Worker
		for _, w := range ws {
			if slices.Contains(m.Holders, w.URL) {
				holders = append(holders, w)
			}
		}
		if len(holders) == 0 { // the holders are not eligible
			return least.URL
		}
		c := leastLoaded(holders)
		if l := float64(c.load.Load()); l > mean*p.SpillRel && l > mean+p.SpillAbs {
			decision = "spill"
			return least.URL
		}
		chosen, decision = c, "hit"
		return c.URL
	})
	return chosen, decision
}

type roundRobin struct{ next atomic.Uint64 }

func (*roundRobin) Name() string { return "round_robin" }
func (p *roundRobin) Pick(_ *Request, ws []*Worker) (*Worker, string) {
	return ws[(p.next.Add(1)-1)%uint64(len(ws))], "round_robin"
}

type lockedRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

func (l *lockedRand) IntN(n int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.IntN(n)
}

type randomPolicy struct{ rng *lockedRand }

func (randomPolicy) Name() string { return "random" }
func (p randomPolicy) Pick(_ *Request, ws []*Worker) (*Worker, string) {
	return ws[p.rng.IntN(len(ws))], "random"
}

// powerOfTwo samples two workers and takes the less loaded.
type powerOfTwo struct{ rng *lockedRand }

func (powerOfTwo) Name() string { return "power_of_two" }
func (p powerOfTwo) Pick(_ *Request, ws []*Worker) (*Worker, string) {
	if len(ws) == 1 {
		return ws[0], "power_of_two"
	}
	i := p.rng.IntN(len(ws))
	j := p.rng.IntN(len(ws) - 1)
	if j >= i {
		j++
	}
	return leastLoaded([]*Worker{ws[min(i, j)], ws[max(i, j)]}), "power_of_two"
}

type leastLoad struct{}

func (leastLoad) Name() string { return "least_load" }
func (leastLoad) Pick(_ *Request, ws []*Worker) (*Worker, string) {
	return leastLoaded(ws), "least_load"
}

// consistentHash sends a routing key (or, without one, the text) to the
// worker owning the first of the ring's points at or after the key's hash:
// VirtualNodes points per worker, so that a worker's arrival or departure
// moves only the keys it takes or held.
type consistentHash struct {
	mu   sync.Mutex
	sig  string
	ring []ringPoint
}

type ringPoint struct {
	hash uint64
	url  string // not the *Worker: one removed and added again is a new one
}

// VirtualNodes is the consistent hash's points per worker.
const VirtualNodes = 160

// hash64 is FNV-1a with a final mix (MurmurHash3's fmix64): FNV alone
// leaves short keys that differ in their last bytes close together.
func hash64(b []byte) uint64 {
	h := fnv.New64a()
	h.Write(b)
	x := h.Sum64()
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

func (*consistentHash) Name() string { return "consistent_hash" }
func (p *consistentHash) Pick(r *Request, ws []*Worker) (*Worker, string) {
	urls := make([]string, len(ws))
	for i, w := range ws {
		urls[i] = w.URL
	}
	sig := strings.Join(urls, "\n")
	p.mu.Lock()
	if sig != p.sig {
		ring := make([]ringPoint, 0, len(ws)*VirtualNodes) // a new one: others may still read the old
		for _, w := range ws {
			for v := range VirtualNodes {
				ring = append(ring, ringPoint{hash64(fmt.Appendf(nil, "%s#%d", w.URL, v)), w.URL})
			}
		}
		p.ring = ring
		slices.SortFunc(p.ring, func(a, b ringPoint) int {
			if a.hash != b.hash {
				return compare(a.hash, b.hash)
			}
			return strings.Compare(a.url, b.url)
		})
		p.sig = sig
	}
	ring := p.ring
	p.mu.Unlock()
	key := []byte(r.Key)
	if len(key) == 0 {
		key = r.Text
	}
	h := hash64(key)
	i, _ := slices.BinarySearchFunc(ring, h, func(a ringPoint, h uint64) int { return compare(a.hash, h) })
	u := ring[i%len(ring)].url
	for _, w := range ws {
		if w.URL == u {
			return w, "consistent_hash"
		}
	}
	return ws[0], "consistent_hash" // not reached: the ring is ws's
}

func compare(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
