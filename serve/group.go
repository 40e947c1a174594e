package serve

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/moex-project/moex/model"
)

// Engine is what the HTTP API serves: one Scheduler, or a Group of
// data-parallel ranks.
type Engine interface {
	Submit(ctx context.Context, r Request) (<-chan Event, error)
	// Load is the requests running and waiting, in all.
	Load() (running, waiting int)
	// RankLoads is each rank's running and waiting requests.
	RankLoads() []RankLoad
	Stats() Stats
	FlushCache() error
	// Capacity is the tokens one request may hold.
	Capacity() int
	// Blocks is the cache blocks free and in all (per layer, every rank's).
	Blocks() (free, total int)
	// Stopped is the error new requests get once Run has returned.
	Stopped() error
	Ranks() int
}

// RankLoad is one rank's load, as /get_load reports it.
type RankLoad struct {
	Rank    int `json:"dp_rank"`
	Running int `json:"num_running_reqs"`
	Waiting int `json:"num_waiting_reqs"`
	Free    int `json:"free_blocks"`
}

// RankLoads is the one rank's load.
func (s *Scheduler) RankLoads() []RankLoad {
	running, waiting := s.Load()
	return []RankLoad{{Running: running, Waiting: waiting, Free: s.kv.FreeBlocks()}}
}

// Ranks is 1.
func (s *Scheduler) Ranks() int { return 1 }

// Load-balancing methods of a Group's controller (SGLang's
// --load-balance-method).
const (
	RoundRobin    = "round_robin"    // each request to the next rank in turn
	ShortestQueue = "shortest_queue" // to the rank with the fewest requests running and waiting (the lowest on ties)
)

// Group is DP attention inside one instance: a scheduler per data-parallel
// rank, each with its own caches and prefix cache, stepping together over
// a model.DP (every rank joins each step, with an IDLE batch when it has
// nothing), and a controller that gives each request to one rank.
// Prefix-aware placement is the router's, between instances.
type Group struct {
	ranks   []*Scheduler
	balance string
	wake    chan struct{}

	mu   sync.Mutex
	next int // round robin's next rank
}

// NewGroup makes a scheduler for each of dp's ranks over its caches kvs[r].
func NewGroup(m *model.Model, dp *model.DP, kvs []*model.KV, o Options, balance string) (*Group, error) {
	if m == nil || dp == nil {
		return nil, errors.New("serve: a group needs a model and its DP ranks")
	}
	if len(kvs) != dp.Ranks() {
		return nil, fmt.Errorf("serve: %d caches for %d ranks", len(kvs), dp.Ranks())
	}
	if balance != RoundRobin && balance != ShortestQueue {
		return nil, fmt.Errorf("serve: load-balance method %q (have %s, %s)", balance, RoundRobin, ShortestQueue)
	}
	g := &Group{balance: balance, wake: make(chan struct{}, 1)}
	for r, kv := range kvs {
		s, err := New(m, kv, o)
		if err != nil {
			return nil, err
		}
		s.forward = func(ctx context.Context, seqs []int, ids []int32, rows []int) ([]float32, error) {
			return dp.Forward(ctx, r, kv, seqs, ids, rows)
		}
		s.always = true
		s.notify = g.poke
		g.ranks = append(g.ranks, s)
	}
	return g, nil
}

func (g *Group) poke() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// Ranks is the group's size.
func (g *Group) Ranks() int { return len(g.ranks) }

// pick is the rank the controller gives the next request.
func (g *Group) pick() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.balance == RoundRobin {
		r := g.next
		g.next = (g.next + 1) % len(g.ranks)
		return r
	}
	best, load := 0, -1
	for r, s := range g.ranks {
		running, waiting := s.Load()
		if n := running + waiting; load < 0 || n < load {
			best, load = r, n
		}
	}
	return best
}

// Submit gives r to a rank (the load-balance method's); see Scheduler.Submit.
func (g *Group) Submit(ctx context.Context, r Request) (<-chan Event, error) {
	return g.ranks[g.pick()].Submit(ctx, r)
}

// Run steps every rank together until ctx ends (or a step fails, which
// stops them all), then ends every request left.
func (g *Group) Run(ctx context.Context) (err error) {
	defer func() {
		for _, s := range g.ranks {
			s.stop(ctx, err)
		}
	}()
	for ctx.Err() == nil {
		busy := false
		for _, s := range g.ranks {
			if running, waiting := s.Load(); running+waiting > 0 {
				busy = true
			}
		}
		if busy {
			progressed := make([]bool, len(g.ranks))
			errs := make([]error, len(g.ranks))
			var wg sync.WaitGroup
			for r, s := range g.ranks {
				wg.Go(func() { progressed[r], errs[r] = s.step(ctx) })
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				return err
			}
			if slices.Contains(progressed, true) {
				continue
			}
		}
		select {
		case <-ctx.Done():
		case <-g.wake:
		}
	}
	return nil
}

// Load is the requests running and waiting on every rank.
func (g *Group) Load() (running, waiting int) {
	for _, s := range g.ranks {
		r, w := s.Load()
		running, waiting = running+r, waiting+w
	}
	return running, waiting
}

// RankLoads is each rank's load.
func (g *Group) RankLoads() []RankLoad {
	out := make([]RankLoad, len(g.ranks))
	for r, s := range g.ranks {
		out[r] = s.RankLoads()[0]
		out[r].Rank = r
	}
	return out
}

// Stats sums the ranks' counts (MaxBatch: the largest rank's).
func (g *Group) Stats() Stats {
	var st Stats
	for _, s := range g.ranks {
		r := s.Stats()
		st.Steps = max(st.Steps, r.Steps)
		st.Preemptions += r.Preemptions
		st.MaxBatch = max(st.MaxBatch, r.MaxBatch)
		st.PromptTokens += r.PromptTokens
		st.CachedTokens += r.CachedTokens
		st.CachedBlocks += r.CachedBlocks
		st.Evicted += r.Evicted
	}
	return st
}

// FlushCache empties every rank's prefix cache; it refuses while any
// request runs or waits.
func (g *Group) FlushCache() error {
	if running, waiting := g.Load(); running+waiting > 0 {
		return fmt.Errorf("serve: %d requests are running or waiting; flush the cache when idle", running+waiting)
	}
	for _, s := range g.ranks {
		if err := s.FlushCache(); err != nil {
			return err
		}
	}
	return nil
}

// Capacity is a rank's: a request runs on one.
func (g *Group) Capacity() int { return g.ranks[0].Capacity() }

// Blocks sums the ranks' blocks.
func (g *Group) Blocks() (free, total int) {
	for _, s := range g.ranks {
		f, t := s.Blocks()
		free, total = free+f, total+t
	}
	return free, total
}

// Stopped is the error new requests get once Run has returned.
func (g *Group) Stopped() error { return g.ranks[0].Stopped() }
