// Package serve is the worker around a whole model: a scheduler that
// batches requests continuously over the model's paged latent caches.
package serve

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/moex-project/moex/model"
)

// Request is one generation: a prompt's token ids, how to sample, and when
// to stop (MaxNewTokens, or a token of StopIDs unless IgnoreEOS).
type Request struct {
	IDs          []int32
	Sampling     model.Sampling
	MaxNewTokens int
	StopIDs      []int32
	IgnoreEOS    bool
}

// Event is a request's progress: each new token, then one last event with
// Done set and the Reason ("length", "stop", or the error's text with Err),
// and Cached, the prompt tokens it found in the prefix cache.
type Event struct {
	Token  int32
	Done   bool
	Reason string
	Err    error
	Cached int
}

// ErrTooLarge is the class of a request that can never fit the caches.
var ErrTooLarge = errors.New("serve: request larger than the cache")

type request struct {
	Request
	ctx     context.Context
	events  chan Event
	sampler *model.Sampler
	seq     int
	tokens  []int32     // the prompt, then the tokens generated
	fed     int         // tokens the caches hold
	gen     int         // tokens generated
	unwatch func() bool // stops ctx's wake-up of the loop
	prefix  *node       // the prefix-cache node its cached tokens end at (held), or nil
	inTree  int         // its tokens the prefix cache holds (whole blocks)
	cached  int         // prompt tokens found cached when first admitted
	started bool        // admitted once
}

// Scheduler runs requests' prompts and decode steps in shared forward
// passes: every step takes each running request's next token, then chunks
// of waiting prompts up to Budget tokens in all, admitted while the caches
// have blocks for them; when the caches are full the newest requests wait
// (preempted ones give their blocks back and are computed again later),
// never an error. A request's tokens are those it would get alone.
type Scheduler struct {
	m      *model.Model
	kv     *model.KV
	budget int
	tree   *prefixCache // nil: no prefix cache
	// forward runs a step's tokens (Model.Forward over kv, or a DP rank's);
	// always: it is called even with none (a DP rank joins every step).
	forward func(ctx context.Context, seqs []int, ids []int32, rows []int) ([]float32, error)
	always  bool
	notify  func() // called when a request arrives: pokes the loop that steps

	mu      sync.Mutex
	queue   []*request // waiting, in arrival order (preempted ones first)
	running []*request
	nextSeq int
	wake    chan struct{}
	stopped error
	stats   Stats
}

// Stats counts a scheduler's work so far.
type Stats struct {
	Steps        int // forward passes
	Preemptions  int // running requests sent back to wait for blocks
	MaxBatch     int // most tokens in one step
	PromptTokens int // prompt tokens of the requests admitted
	CachedTokens int // of them, those found in the prefix cache
	CachedBlocks int // blocks the prefix cache holds now (per layer)
	Evicted      int // blocks the prefix cache gave up for other requests
}

// HitRate is the prefix cache's hit rate: cached prompt tokens over prompt
// tokens (0 before any).
func (st Stats) HitRate() float64 {
	if st.PromptTokens == 0 {
		return 0
	}
	return float64(st.CachedTokens) / float64(st.PromptTokens)
}

// Stats returns the counts so far.
func (s *Scheduler) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	if s.tree != nil {
		st.CachedBlocks = s.tree.held
	}
	return st
}

// Options are a scheduler's settings.
type Options struct {
	// Budget is the most tokens a step runs (decode tokens and prompt
	// chunks together).
	Budget int
	// NoPrefixCache turns the radix prefix cache off: every prompt is
	// computed whole, and a request's blocks are free when it ends.
	NoPrefixCache bool
}

// New makes a scheduler of m over kv.
func New(m *model.Model, kv *model.KV, o Options) (*Scheduler, error) {
	if o.Budget < 1 {
		return nil, fmt.Errorf("serve: a step's token budget must be positive, have %d", o.Budget)
	}
	s := &Scheduler{m: m, kv: kv, budget: o.Budget, wake: make(chan struct{}, 1)}
	if !o.NoPrefixCache {
		s.tree = newPrefixCache(kv)
	}
	s.forward = func(ctx context.Context, seqs []int, ids []int32, rows []int) ([]float32, error) {
		return m.Forward(ctx, kv, seqs, ids, rows)
	}
	s.notify = s.poke
	return s, nil
}

// FlushCache empties the prefix cache, freeing its blocks; it refuses while
// requests run or wait (SGLang's /flush_cache).
func (s *Scheduler) FlushCache() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.running) + len(s.queue); n > 0 {
		return fmt.Errorf("serve: %d requests are running or waiting; flush the cache when idle", n)
	}
	if s.tree == nil {
		return nil
	}
	return s.tree.flush()
}

// Capacity is the tokens a request may hold: every block.
func (s *Scheduler) Capacity() int { return s.kv.NumBlocks() * s.kv.BlockSize() }

// Blocks is the cache blocks free and in all (per layer).
func (s *Scheduler) Blocks() (free, total int) { return s.kv.FreeBlocks(), s.kv.NumBlocks() }

// Submit queues r; its events come on the channel returned, which is
// closed after the Done event. Cancelling ctx ends the request (its Done
// event carries ctx's error) and frees its blocks.
func (s *Scheduler) Submit(ctx context.Context, r Request) (<-chan Event, error) {
	switch {
	case len(r.IDs) == 0:
		return nil, errors.New("serve: empty prompt")
	case r.MaxNewTokens < 1:
		return nil, fmt.Errorf("serve: max_new_tokens %d must be positive", r.MaxNewTokens)
	case s.m.Arch != nil && s.m.Arch.ContextLength > 0 &&
		(len(r.IDs) >= s.m.Arch.ContextLength || r.MaxNewTokens > s.m.Arch.ContextLength-len(r.IDs)):
		c := s.m.Arch.ContextLength
		return nil, fmt.Errorf("%w: the model's context is %d tokens; the request asks for %.0f (%d in the prompt, %d new)",
			ErrTooLarge, c, float64(len(r.IDs))+float64(r.MaxNewTokens), len(r.IDs), r.MaxNewTokens)
	case len(r.IDs) > s.Capacity() || r.MaxNewTokens > s.Capacity()-len(r.IDs): // no sum to overflow
		return nil, fmt.Errorf("%w: a prompt of %d tokens and %d new ones need %.0f cache rows; the cache holds %d",
			ErrTooLarge, len(r.IDs), r.MaxNewTokens, float64(len(r.IDs))+float64(r.MaxNewTokens), s.Capacity())
	}
	for i, id := range r.IDs {
		if id < 0 || int(id) >= s.m.Vocab {
			return nil, fmt.Errorf("serve: prompt token %d is id %d, outside the vocabulary [0, %d)", i, id, s.m.Vocab)
		}
	}
	smp, err := model.NewSampler(r.Sampling)
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	q := &request{Request: r, ctx: ctx, events: make(chan Event, r.MaxNewTokens+1), sampler: smp,
		tokens: slices.Clone(r.IDs)}
	s.mu.Lock()
	if s.stopped != nil {
		s.mu.Unlock()
		return nil, s.stopped
	}
	q.seq = s.nextSeq
	s.nextSeq++
	s.queue = append(s.queue, q)
	// A client gone wakes the loop, which may be parked with nothing to run.
	q.unwatch = context.AfterFunc(ctx, s.notify)
	s.mu.Unlock()
	s.notify()
	return q.events, nil
}

func (s *Scheduler) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Stopped is the error new requests get once Run has returned (nil
// before).
func (s *Scheduler) Stopped() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopped
}

// Load is the requests running and waiting.
func (s *Scheduler) Load() (running, waiting int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.running), len(s.queue)
}

// Run steps until ctx ends, then ends every request left with ctx's error.
// Requests' own contexts are watched between steps.
func (s *Scheduler) Run(ctx context.Context) (err error) {
	defer func() { s.stop(ctx, err) }()
	for ctx.Err() == nil {
		progressed, err := s.step(ctx)
		if err != nil {
			return err
		}
		if progressed {
			continue
		}
		select {
		case <-ctx.Done():
		case <-s.wake:
		}
	}
	return nil
}

// stop ends every request left, with err (Run's) or ctx's cause.
func (s *Scheduler) stop(ctx context.Context, err error) {
	if err == nil {
		err = context.Cause(ctx)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = fmt.Errorf("serve: the scheduler has stopped: %w", err)
	left := append(s.running, s.queue...)
	s.running, s.queue = nil, nil
	for _, r := range left { // under the lock: the tree and caches are the scheduler's (the events are buffered)
		s.finish(r, s.stopped.Error(), s.stopped)
	}
}

// finish ends r: leaves its tokens' whole blocks in the prefix cache,
// frees its blocks and sends its Done event.
func (s *Scheduler) finish(r *request, reason string, err error) {
	if r.unwatch != nil {
		r.unwatch()
	}
	s.cache(r)
	s.release(r)
	r.events <- Event{Done: true, Reason: reason, Err: err, Cached: r.cached}
	close(r.events)
}

// cache leaves r's computed tokens, whole blocks, in the prefix cache (as
// they are computed, so that requests sharing them reuse them at once), and
// moves r's hold to where they end.
func (s *Scheduler) cache(r *request) {
	bs := s.kv.BlockSize()
	if s.tree == nil || r.fed-r.fed%bs <= r.inTree {
		return
	}
	x, err := s.tree.insert(r.tokens[:r.fed], r.seq)
	if err != nil {
		return // best effort: a prefix the tree cannot take is only not cached
	}
	s.tree.lock(x, 1)
	if r.prefix != nil {
		s.tree.lock(r.prefix, -1)
	}
	r.prefix, r.inTree = x, r.fed-r.fed%bs
}

// release gives back r's blocks and its hold on the prefix cache.
func (s *Scheduler) release(r *request) {
	if r.fed > 0 {
		s.kv.Free(r.seq)
		r.fed = 0
	}
	if r.prefix != nil {
		s.tree.lock(r.prefix, -1)
		r.prefix = nil
	}
	r.inTree = 0
}

// attach gives waiting request r (holding nothing) the longest cached
// prefix of its tokens, whole blocks and short of its last token (whose
// logits it needs): its sequence starts with those blocks, and the prefix
// is held against eviction.
func (s *Scheduler) attach(r *request) {
	last, n, runs := s.tree.match(r.tokens, len(r.tokens)-1)
	if n == 0 {
		return
	}
	if err := s.kv.Attach(r.seq, runs...); err != nil {
		return // computed whole instead
	}
	s.tree.lock(last, 1)
	r.prefix, r.fed, r.inTree = last, n, n
}

// blocksFor is the blocks a sequence of have rows needs for n more.
func (s *Scheduler) blocksFor(have, n int) int {
	bs := s.kv.BlockSize()
	return (have+n+bs-1)/bs - (have+bs-1)/bs
}

// step runs one forward pass; progressed is false when there was nothing
// to run.
func (s *Scheduler) step(ctx context.Context) (progressed bool, err error) {
	b := s.plan()
	if len(b.ids) == 0 && !s.always {
		return false, nil
	}
	logits, err := s.forward(ctx, b.seqs, b.ids, b.rows)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		for _, t := range b.taken { // the caches were rolled back: so are the requests
			t.r.fed -= t.n
		}
		if ctx.Err() != nil {
			return true, nil // Run's stop ends the requests
		}
		return true, fmt.Errorf("serve: step of %d tokens: %w", len(b.ids), err)
	}
	if len(b.ids) == 0 {
		return false, nil // an IDLE batch
	}
	s.stats.Steps++
	s.stats.MaxBatch = max(s.stats.MaxBatch, len(b.ids))
	for _, t := range b.taken {
		s.cache(t.r)
	}
	V := s.m.Vocab
	for i, r := range b.sampled {
		tok := r.sampler.Next(logits[i*V : (i+1)*V])
		r.tokens = append(r.tokens, tok)
		r.gen++
		r.events <- Event{Token: tok}
		reason := ""
		switch {
		case !r.IgnoreEOS && slices.Contains(r.StopIDs, tok):
			reason = "stop"
		case r.gen >= r.MaxNewTokens:
			reason = "length"
		}
		if reason != "" {
			s.running = slices.DeleteFunc(s.running, func(x *request) bool { return x == r })
			s.finish(r, reason, nil)
		}
	}
	return true, nil
}

// batch is a step's tokens: token t of sequence seqs[t] is ids[t]; rows are
// the tokens whose logits sample the next token of sampled's requests.
type batch struct {
	seqs    []int
	ids     []int32
	rows    []int
	sampled []*request
	taken   []struct {
		r *request
		n int
	}
}

// plan drops the requests whose clients went away, preempts while the
// running requests' next tokens do not fit the blocks, and makes the step's
// batch (advancing each request's fed count).
func (s *Scheduler) plan() (b batch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// Requests whose clients went away.
	for _, list := range []*[]*request{&s.running, &s.queue} {
		kept := (*list)[:0]
		for _, r := range *list {
			if err := r.ctx.Err(); err != nil {
				s.finish(r, err.Error(), err)
				continue
			}
			kept = append(kept, r)
		}
		*list = kept
	}
	// Decode tokens first; preempt the newest while their blocks do not fit.
	free := s.kv.FreeBlocks()
	// room evicts unused prefixes from the cache while fewer than n
	// blocks are free.
	room := func(n int) {
		if n > free && s.tree != nil {
			got := s.tree.evict(n - free)
			free += got
			s.stats.Evicted += got
		}
	}
	for {
		need := 0
		for _, r := range s.running {
			need += s.blocksFor(r.fed, 1)
		}
		room(need)
		if need <= free || len(s.running) <= 1 {
			break
		}
		last := s.running[len(s.running)-1]
		s.running = s.running[:len(s.running)-1]
		s.release(last)
		free = s.kv.FreeBlocks()
		s.queue = append([]*request{last}, s.queue...)
		s.stats.Preemptions++
	}
	budget := s.budget
	take := func(r *request, n int) {
		for i := 0; i < n; i++ {
			b.seqs = append(b.seqs, r.seq)
			b.ids = append(b.ids, r.tokens[r.fed+i])
		}
		b.taken = append(b.taken, struct {
			r *request
			n int
		}{r, n})
		free -= s.blocksFor(r.fed, n)
		r.fed += n
		budget -= n
		if r.fed == len(r.tokens) {
			b.rows = append(b.rows, len(b.ids)-1)
			b.sampled = append(b.sampled, r)
		}
	}
	// fit is at most n of r's next tokens that the budget and blocks allow.
	fit := func(r *request, n int) int {
		n = min(n, budget)
		room(s.blocksFor(r.fed, n))
		for n > 0 && s.blocksFor(r.fed, n) > free {
			n--
		}
		return n
	}
	// Every running request's next token (the preemption above made room
	// for one each), then more of the prompts being prefilled.
	for _, r := range s.running {
		if budget > 0 && s.blocksFor(r.fed, 1) <= free {
			take(r, 1)
		}
	}
	for _, r := range s.running {
		if n := fit(r, len(r.tokens)-r.fed); n > 0 {
			take(r, n)
		}
	}
	// Then waiting prompts, in order, while budget and blocks last. A new
	// prompt that begins with the first block of a prompt still being
	// computed waits for that one to reach the cache
	// (SGLang's in-batch prefix caching): a burst of prompts sharing a
	// system prompt computes it once.
	pending := map[string]bool{}
	prefilling := func(r *request) {
		if s.tree != nil && len(r.tokens) > s.kv.BlockSize() {
			pending[s.tree.blockKey(r.tokens)] = true
		}
	}
	for _, r := range s.running {
		if r.gen == 0 {
			prefilling(r)
		}
	}
	for i := 0; i < len(s.queue) && budget > 0; {
		r := s.queue[i]
		if s.tree != nil && !r.started && len(r.tokens) > s.kv.BlockSize() && pending[s.tree.blockKey(r.tokens)] {
			s.release(r) // matched again when it goes
			i++
			continue
		}
		if r.fed == 0 && s.tree != nil {
			s.attach(r)
		}
		n := fit(r, len(r.tokens)-r.fed)
		if n == 0 {
			// It waits holding nothing: a prefix it held could not be
			// evicted for the running requests, which might then never fit.
			s.release(r)
			break
		}
		if !r.started {
			r.started, r.cached = true, min(r.fed, len(r.IDs))
			s.stats.PromptTokens += len(r.IDs)
			s.stats.CachedTokens += r.cached
		}
		s.queue = slices.Delete(s.queue, i, i+1)
		s.running = append(s.running, r)
		take(r, n)
		prefilling(r)
	}
	return b
}
