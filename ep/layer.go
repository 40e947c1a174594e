package ep

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/moex-project/moex/internal/buffers"
	"github.com/moex-project/moex/internal/errkind"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// Layer is one rank's part of an expert-parallel MoE layer: the router and
// shared expert (every rank has them) and the routed experts its placement
// gives it.
type Layer struct {
	Config    *moe.Config
	Placement *Placement
	comm      Comm
	moe       *moe.Layer
	ckpt      *moe.Checkpoint

	// Buffers reused from step to step; a Layer runs one step at a time.
	ex        Exchanger
	ffn       kernels.Scratch
	out       []float32
	grouped   []float32
	sharedOut []float32

	mu     sync.Mutex
	load   []int64    // tokens routed to each expert by this rank, all steps so far
	times  StageTimes // the stages of every forward pass on this rank
	closed bool
}

// StageTimes are the accumulated wall times of an EP layer's stages.
type StageTimes struct {
	Dispatch time.Duration // routing, packing and the first all-to-all
	Experts  time.Duration // the grouped FFN
	Combine  time.Duration // the second all-to-all and the sum
}

// Load maps, on this rank, the router, the shared expert and the experts
// that place gives comm.Rank() from checkpoint dir; other ranks' expert
// tensors are never touched. Close releases the mapping.
func Load(dir string, layer int, comm Comm, place *Placement) (*Layer, error) {
	ck, err := moe.OpenCheckpoint(dir)
	if err != nil {
		return nil, err
	}
	l, err := LoadFrom(ck, layer, comm, place)
	if err != nil {
		ck.Close()
		return nil, err
	}
	l.ckpt = ck
	return l, nil
}

// LoadFrom is Load from an open checkpoint, which stays the caller's.
func LoadFrom(ck *moe.Checkpoint, layer int, comm Comm, place *Placement) (*Layer, error) {
	if err := place.Validate(); err != nil {
		return nil, err
	}
	if place.NumExperts != ck.Config.NumExperts || place.Ranks != comm.Size() {
		return nil, fmt.Errorf("ep: placement is for %d experts over %d ranks, the model has %d experts and the group %d ranks",
			place.NumExperts, place.Ranks, ck.Config.NumExperts, comm.Size())
	}
	mine := make([]bool, place.NumExperts)
	for _, e := range place.Local(comm.Rank()) {
		mine[e] = true
	}
	m, err := moe.LoadSubset(ck, layer, func(e int) bool { return mine[e] })
	if err != nil {
		return nil, err
	}
	return &Layer{Config: m.Config, Placement: place, comm: comm, moe: m, load: make([]int64, place.NumExperts)}, nil
}

// Shard is rank's share of m under place: the experts it holds (a view of
// m's, no copy), its kernels on workers goroutines.
func Shard(m *moe.Layer, place *Placement, rank, workers int) *moe.Layer {
	mine := map[int]bool{}
	for _, e := range place.Local(rank) {
		mine[e] = true
	}
	shard := m.Subset(func(e int) bool { return mine[e] })
	shard.SetWorkers(workers)
	return shard
}

// FromLayer makes this rank's part from a layer that holds (at least) the
// experts place gives comm.Rank().
func FromLayer(m *moe.Layer, comm Comm, place *Placement) (*Layer, error) {
	if err := place.Validate(); err != nil {
		return nil, err
	}
	if place.NumExperts != m.Config.NumExperts || place.Ranks != comm.Size() {
		return nil, fmt.Errorf("ep: placement is for %d experts over %d ranks, the layer has %d experts and the group %d ranks",
			place.NumExperts, place.Ranks, m.Config.NumExperts, comm.Size())
	}
	for _, e := range place.Local(comm.Rank()) {
		if _, ok := m.Expert(e); !ok {
			return nil, fmt.Errorf("ep: rank %d should hold expert %d, which the layer lacks", comm.Rank(), e)
		}
	}
	return &Layer{Config: m.Config, Placement: place, comm: comm, moe: m, load: make([]int64, place.NumExperts)}, nil
}

// Close releases the checkpoint mapping Load opened (FromLayer's and
// LoadFrom's stay their caller's). Later forward passes fail with
// moe.ErrClosed; a second Close does nothing. Like Forward, it must not be
// called while a forward pass runs.
func (l *Layer) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	if l.ckpt == nil {
		return nil
	}
	return l.ckpt.Close()
}

// StageTimes returns the wall times of this rank's stages, summed over every
// forward pass so far.
func (l *Layer) StageTimes() StageTimes {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.times
}

func (l *Layer) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

func (l *Layer) addTimes(f func(t *StageTimes)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f(&l.times)
}

// SetWorkers sets the goroutines the local expert FFN uses (0: GOMAXPROCS).
func (l *Layer) SetWorkers(n int) { l.moe.SetWorkers(n) }

// CheckWeights is moe.Layer.CheckWeights on this rank's experts.
func (l *Layer) CheckWeights(ctx context.Context) error { return l.moe.CheckWeights(ctx) }

// ExpertLoad returns the per-expert token counts this rank has routed so far.
func (l *Layer) ExpertLoad() []int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]int64(nil), l.load...)
}

// GlobalExpertLoad sums every rank's per-expert counts (a collective), the input
// Balanced wants.
func (l *Layer) GlobalExpertLoad(ctx context.Context) ([]int64, error) {
	v := l.ExpertLoad()
	if err := l.comm.AllReduceInt64(ctx, v, Sum); err != nil {
		return nil, err
	}
	return v, nil
}

// Forward computes this rank's y = MoE(x), x and y [tokens, hidden] being
// this rank's own tokens (possibly none: every rank must call Forward each
// step). The bits equal those of one rank running all tokens.
func (l *Layer) Forward(ctx context.Context, x, y []float32) error {
	return l.ForwardRouting(ctx, x, y, nil, nil)
}

// ForwardRouting is Forward that also returns this rank's routing (see
// moe.Layer.ForwardRouting); ids and weights may be nil.
func (l *Layer) ForwardRouting(ctx context.Context, x, y []float32, ids []int32, weights []float32) error {
	return l.ForwardTokens(ctx, x, nil, y, ids, weights)
}

// ForwardTokens is ForwardRouting given this rank's token ids [tokens],
// which a layer that chooses its experts by token id needs (deepseek_v4's
// hash layers, moe.Layer.TokenRouted); other layers ignore them.
func (l *Layer) ForwardTokens(ctx context.Context, x []float32, tokens []int32, y []float32, ids []int32, weights []float32) error {
	start := time.Now()
	c, comm := l.Config, l.comm
	H, K := c.Hidden, c.TopK
	// Local checks first; a rank that fails here breaks the group so that
	// the others do not wait for it.
	fail := func(err error) error {
		comm.Abort(fmt.Errorf("rank %d: %w", comm.Rank(), err))
		return err
	}
	if l.isClosed() {
		return fail(errkind.Errorf(moe.ErrClosed, "ep: rank %d: forward pass on a closed layer", comm.Rank()))
	}
	if len(x)%H != 0 || len(y) != len(x) {
		return fail(fmt.Errorf("ep: input has %d values and output %d, want equal multiples of hidden size %d", len(x), len(y), H))
	}
	T := len(x) / H
	if ids != nil && len(ids) != T*K || weights != nil && len(weights) != T*K {
		return fail(fmt.Errorf("ep: routing outputs have %d ids and %d weights, want %d", len(ids), len(weights), T*K))
	}
	if err := moe.CheckFinite(x, H); err != nil {
		return fail(err)
	}
	if err := l.moe.Router.CheckTokens(tokens, T); err != nil {
		return fail(err)
	}
	counts, err := AllGatherInt64(ctx, comm, int64(T))
	if err != nil {
		return err
	}
	offset := 0
	for _, n := range counts[:comm.Rank()] {
		offset += int(n)
	}
	if ids == nil {
		ids = make([]int32, T*K)
	}
	if weights == nil {
		weights = make([]float32, T*K)
	}
	if err := l.moe.RouteTokens(ctx, x, tokens, ids, weights); err != nil {
		return fail(err)
	}
	l.mu.Lock()
	for _, e := range ids {
		l.load[e]++
	}
	l.mu.Unlock()

	// A block that owns its norms (gemma4) dispatches its experts' normed
	// input and runs the dense MLP on its own.
	xe, xs := x, x
	if c.ResidualInput {
		if xe, xs, err = l.moe.BlockInputs(ctx, x); err != nil {
			return fail(err)
		}
	}
	d, err := l.ex.Dispatch(ctx, comm, l.Placement, xe, ids, weights, H, K, offset, T)
	if err != nil {
		return err
	}
	tExperts := time.Now()
	l.addTimes(func(t *StageTimes) { t.Dispatch += tExperts.Sub(start) })
	// Local experts over the received rows, plus the shared expert over this
	// rank's own tokens, in one grouped FFN over [received rows; own tokens].
	all := d.Hidden
	copy(all[len(d.Rows)*H:], xs)
	rowIDs := make([]int32, len(d.Rows))
	rowWeights := make([]float32, len(d.Rows))
	for i, rw := range d.Rows {
		if _, ok := l.moe.Expert(rw.Expert); !ok {
			return fail(fmt.Errorf("ep: rank %d sent a row for expert %d, which rank %d does not hold", rw.Src, rw.Expert, comm.Rank()))
		}
		rowIDs[i], rowWeights[i] = int32(rw.Expert), rw.Weight
	}
	// Each received row is a pair of its own (top-1): grouped by expert by
	// the one pipeline's Group.
	g, err := l.moe.Group(rowIDs, rowWeights, 1, false, buffers.Grow(&l.grouped, len(d.Rows)*H))
	if err != nil {
		return fail(err)
	}
	groups := g.Groups
	own := make([]int32, T)
	for t := range own {
		own[t] = int32(len(d.Rows) + t)
	}
	shared := l.moe.SharedFFN(all, own, buffers.Grow(&l.sharedOut, T*H))
	if shared != nil {
		groups = append(groups, *shared)
	}
	if err := l.moe.RunExperts(ctx, all, groups, &l.ffn); err != nil {
		return fail(err)
	}
	// The outputs go back in received order.
	out := buffers.Grow(&l.out, len(d.Rows)*H)
	for i, r := range g.RowOf {
		copy(out[i*H:(i+1)*H], g.Out[int(r)*H:][:H])
	}
	tCombine := time.Now()
	l.addTimes(func(t *StageTimes) { t.Experts += tCombine.Sub(tExperts) })
	defer l.addTimes(func(t *StageTimes) { t.Combine += time.Since(tCombine) })
	pairOut, err := d.Return(ctx, comm, out)
	if err != nil {
		return err
	}
	// Combine in the order of one rank.
	rowsOf := make([]int32, T*K)
	for p := range rowsOf {
		rowsOf[p] = int32(p)
	}
	var sharedOut []float32
	if shared != nil {
		sharedOut = shared.Out
	}
	if c.ResidualInput {
		moe.Combine(y, pairOut, rowsOf, K, H, nil)
		if err := l.moe.BlockOutput(ctx, y, sharedOut); err != nil {
			return fail(err)
		}
		return moe.CheckOutput(y, H)
	}
	moe.Combine(y, pairOut, rowsOf, K, H, sharedOut)
	return moe.CheckOutput(y, H)
}
