// Package decoderun is moex run's decode loop, the harness that drives the
// library the way a serving process would: R ranks (in-process, or one per
// process over a communicator), each with its own requests and latent
// cache on a deterministic schedule, run decode steps of one layer (the
// attention block, then the MoE layer in all-to-all or gather mode) with
// the coordinator's plan and IDLE batches, then the same tokens on one
// rank, and report the stage times, the KV accounting and the parity. The
// device implementations plug in through Config's hooks.
package decoderun

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/dpattn"
	"github.com/moex-project/moex/ep"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// Config is a multi-rank decode run: R in-process ranks, each with its
// own requests and latent cache, run Steps decode steps of one layer (MLA
// attention, then the MoE layer in the chosen mode).
type Config struct {
	Ranks, Steps int
	// Batch, when positive, gives every rank Batch requests of Context
	// prompt tokens, all decoding at every step (a steady batch, to time);
	// 0: the varied schedule, uneven across ranks and steps, with IDLE
	// batches (to exercise the coordinator).
	Batch, Context int
	// AttnMode is "dp" (or ""): each rank attends over its own requests and
	// cache; or "tp": the heads split over the ranks, every rank caching
	// every request's latent rows and computing its heads over every token,
	// the partial outputs all-reduced, and the MoE layer's expert shards
	// over every token all-reduced likewise (MoEMode must be "gather").
	AttnMode   string
	MoEMode    string // "alltoall" (EP dispatch/combine) or "gather"
	Seed       uint64
	MoE        *moe.Layer // holds every expert; the ranks take their shards of it
	Attn       attn.Block
	CacheDType kernels.DType
	// RankTimeout bounds each collective (ep.WithTimeout): a rank that does
	// not arrive within it fails the run, naming the collective; 0: none.
	RankTimeout time.Duration
	// Experts, when set, gives each rank the runner of its shard's experts
	// (a GPU: moegpu.Experts), which the run closes; nil: the CPU kernels.
	// The one-rank reference of the parity check stays on the CPU.
	Experts func(rank int, shard *moe.Layer) (ExpertRunner, error)
	// AttnCore, when set, computes every rank's attention over its cache
	// (a GPU: dpattngpu.Attention); nil: attn.MLA on the host. The one-rank reference
	// stays on the host. A core that is a moe.GraphVoter gets each step's
	// vote, as the experts' runner does.
	AttnCore attn.Core
	// AttnProj, when set, computes every rank's attention projections (a
	// GPU: dpattngpu.Attention's Projections); nil: the CPU kernels. The one-rank
	// reference stays on the host.
	AttnProj attn.Projector
	// Gather, when set, gives each rank gather mode's MoE stage over its
	// data communicator comm (a GPU: dpattngpu.GatherMoE, the hidden states
	// gathered and scattered in device memory), which the run closes;
	// Experts is then not used in gather mode. nil: dpattn.MoEGather on the CPU.
	// A runner that is a moe.GraphVoter gets each step's vote.
	Gather func(ctx context.Context, rank int, shard *moe.Layer, comm ep.Comm) (GatherRunner, error)
	// Layer, when set, gives each rank the whole layer's decode step in
	// gather mode (a GPU: dpattngpu.DecodeLayer, attention and MoE in one
	// graph), which the run closes; AttnCore, AttnProj, Gather
	// and Experts are then not used by the ranks (the one-rank reference
	// still runs on the host). A nil runner: this layer is not for it (the
	// stages run apart). Its time is reported as the MoE stage's.
	Layer func(ctx context.Context, rank int, attn attn.Block, shard *moe.Layer, comm ep.Comm) (LayerRunner, error)
}

// The runners a Config's hooks give: their role's interface, and Close,
// which the run calls when the rank is done with them.
type (
	ExpertRunner interface {
		moe.ExpertRunner
		io.Closer
	}
	GatherRunner interface {
		dpattn.GatherRunner
		io.Closer
	}
	LayerRunner interface {
		dpattn.LayerRunner
		io.Closer
	}
)

// RankTimes are one rank's accumulated stage times.
type RankTimes struct {
	Plan      time.Duration // the coordinator's collectives
	Attention time.Duration
	Gather    time.Duration // gather: all-gather; alltoall: routing + dispatch
	MoE       time.Duration // the experts
	Scatter   time.Duration // gather: reduce-scatter; alltoall: combine
	Tokens    int
	// Decode: from the first step's start to the last one's end (the
	// prefill of the requests' caches before it not counted).
	Decode time.Duration
	// Replays: the steps a device runner (Layer or Gather) replayed from a
	// CUDA graph, for runners that count them (GraphReplays).
	Replays int
	// KVBytes: the latent cache's blocks in use at the end.
	KVBytes int64
}

// StepInfo is what the coordinator planned for one step.
type StepInfo struct {
	Counts  []int64
	Skip    bool
	GraphOK bool
}

// Report is the outcome of Run.
type Report struct {
	Config Config
	Wall   time.Duration // the whole run, the caches' prefill included
	// DecodeWall is the slowest rank's decode steps (RankTimes.Decode):
	// what tokens a second are measured over.
	DecodeWall   time.Duration
	Tokens       int
	Ranks        []RankTimes
	Steps        []StepInfo
	IdleSteps    int     // (rank, step) pairs that ran an IDLE batch
	ParityRelErr float64 // ‖y − one rank‖ / ‖one rank‖ over every step
	ParityExact  bool    // bit for bit
}

// schedule is the deterministic workload of a run: requests per rank,
// their prompt lengths, and the batch size of each rank at each step.
type schedule struct {
	requests [][]int // [rank][request] prompt length
	batch    [][]int // [rank][step] requests active (the first ones)
}

func makeSchedule(ranks, steps int, seed uint64, batch, context int) schedule {
	rng := rand.New(rand.NewPCG(seed, 0x5c4ed))
	s := schedule{requests: make([][]int, ranks), batch: make([][]int, ranks)}
	if batch > 0 {
		for r := range s.requests {
			s.requests[r] = slices.Repeat([]int{max(context, 1)}, batch)
			s.batch[r] = slices.Repeat([]int{batch}, steps)
		}
		return s
	}
	for r := range s.requests {
		n := 2 + (r*5+int(seed%4))%4 // uneven request counts
		for range n {
			s.requests[r] = append(s.requests[r], 1+rng.IntN(300))
		}
		s.batch[r] = make([]int, steps)
		for st := range s.batch[r] {
			s.batch[r][st] = (r*3 + st*2 + int(seed%uint64(n+1))) % (n + 1)
		}
	}
	// At least one step with an idle rank while others work.
	if ranks > 1 && steps > 1 {
		s.batch[ranks-1][1] = 0
		if s.batch[0][1] == 0 {
			s.batch[0][1] = 1
		}
	}
	return s
}

// hiddenOf is the deterministic input of request q of rank r at step st.
func hiddenOf(seed uint64, r, q, st, hidden int) []float32 {
	rng := rand.New(rand.NewPCG(seed, uint64(r)<<40|uint64(q)<<20|uint64(st)))
	x := make([]float32, hidden)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	return x
}

// prefill fills request q's prompt into the cache with deterministic latents.
func prefill(c *attn.Cache, seq int, length int, seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, uint64(seq)+1<<50))
	rows := make([]float32, length*c.Dim())
	for i := range rows {
		rows[i] = float32(rng.NormFloat64())
	}
	return c.Append(seq, rows)
}

func newCacheFor(s schedule, ranks []int, steps, dim int, dtype kernels.DType) (*attn.Cache, error) {
	blocks := 0
	for _, r := range ranks {
		for _, l := range s.requests[r] {
			blocks += (l+steps+attn.DefaultBlockSize-1)/attn.DefaultBlockSize + 1
		}
	}
	return attn.NewCache(max(blocks, 1), attn.DefaultBlockSize, dim, dtype)
}

// Run runs the decode steps on cfg.Ranks in-process ranks, then the same
// tokens on one rank, and reports times and parity.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	R, S := cfg.Ranks, cfg.Steps
	if R < 1 || S < 1 {
		return nil, fmt.Errorf("dpattn: run of %d ranks × %d steps", R, S)
	}
	if cfg.MoEMode != "alltoall" && cfg.MoEMode != "gather" {
		return nil, fmt.Errorf("decoderun: MoE mode %q (want alltoall or gather)", cfg.MoEMode)
	}
	tp := cfg.AttnMode == "tp"
	switch {
	case cfg.AttnMode != "" && cfg.AttnMode != "dp" && !tp:
		return nil, fmt.Errorf("decoderun: attention mode %q (want dp or tp)", cfg.AttnMode)
	case tp && cfg.MoEMode != "gather":
		return nil, fmt.Errorf("decoderun: tensor-parallel attention runs the MoE layer in gather mode (expert shards over every token), not %s", cfg.MoEMode)
	case tp && (cfg.Experts != nil || cfg.AttnCore != nil || cfg.AttnProj != nil || cfg.Gather != nil || cfg.Layer != nil):
		return nil, errors.New("decoderun: tensor-parallel attention runs on the host")
	}
	H := cfg.MoE.Config.Hidden
	if cfg.Attn.HiddenSize() != H {
		return nil, fmt.Errorf("decoderun: attention hidden %d, MoE hidden %d", cfg.Attn.HiddenSize(), H)
	}
	sched := makeSchedule(R, S, cfg.Seed, cfg.Batch, cfg.Context)
	// The caller's garbage (making random weights leaves as much again)
	// collected before the clock runs, not inside a timed step.
	runtime.GC()
	comms, err := ep.NewLocal(R)
	if err != nil {
		return nil, err
	}
	place, err := ep.Contiguous(cfg.MoE.Config.NumExperts, R)
	if err != nil {
		return nil, err
	}
	workers := max(1, runtime.GOMAXPROCS(0)/R)
	rep := &Report{Config: cfg, Ranks: make([]RankTimes, R), Steps: make([]StepInfo, S)}
	ys := make([][][]float32, R) // [rank][step] outputs
	errs := make([]error, R)
	start := time.Now()
	var wg sync.WaitGroup
	for r, comm := range comms {
		comm := ep.WithTimeout(comm, cfg.RankTimeout)
		wg.Go(func() {
			if tp {
				ys[r], errs[r] = runRankTP(ctx, cfg, sched, comm, place, workers, &rep.Ranks[r], rep.Steps)
			} else {
				ys[r], errs[r] = runRank(ctx, cfg, sched, comm, comm, place, workers, &rep.Ranks[r], rep.Steps)
			}
			if errs[r] != nil {
				comm.Abort(fmt.Errorf("rank %d: %w", r, errs[r]))
			}
		})
	}
	wg.Wait()
	rep.Wall = time.Since(start)
	for _, rt := range rep.Ranks {
		rep.DecodeWall = max(rep.DecodeWall, rt.Decode)
	}
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return rep, finish(ctx, cfg, sched, rep, ys)
}

// finish fills in the report's totals and the parity of ys [rank][step]
// against the same tokens on one rank.
func finish(ctx context.Context, cfg Config, sched schedule, rep *Report, ys [][][]float32) error {
	R, S := cfg.Ranks, cfg.Steps
	for r := range sched.batch {
		for st, b := range sched.batch[r] {
			rep.Tokens += b
			if b == 0 && !rep.Steps[st].Skip {
				rep.IdleSteps++
			}
		}
	}
	want, err := runOneRank(ctx, cfg, sched)
	if err != nil {
		return err
	}
	var num, den float64
	rep.ParityExact = true
	for st := 0; st < S; st++ {
		var got []float32
		for r := 0; r < R; r++ {
			got = append(got, ys[r][st]...)
		}
		for i, w := range want[st] {
			if math.Float32bits(w) != math.Float32bits(got[i]) {
				rep.ParityExact = false
			}
			d := float64(got[i]) - float64(w)
			num += d * d
			den += float64(w) * float64(w)
		}
	}
	if den > 0 {
		rep.ParityRelErr = math.Sqrt(num / den)
	}
	return nil
}

// RunComm is Run with this process as one rank of comm (MPI, NCCL, …): every
// rank calls it with the same cfg (Ranks is comm's size). Rank 0 gets the
// report, with every rank's outputs and stage times gathered to it and the
// parity against one rank computed there; the other ranks get nil.
func RunComm(ctx context.Context, cfg Config, comm ep.Comm) (*Report, error) {
	return RunComms(ctx, cfg, comm, comm)
}

// RunComms is RunComm with the coordinator's collectives (token counts, the
// graph vote) on plan, a CPU group, and the hidden states on comm (NCCL):
// SGLang's split between its CPU and device process groups. Both must
// number the ranks alike.
func RunComms(ctx context.Context, cfg Config, comm, plan ep.Comm) (*Report, error) {
	if plan.Size() != comm.Size() || plan.Rank() != comm.Rank() {
		return nil, fmt.Errorf("decoderun: rank %d of %d in the plan group, %d of %d in the data group",
			plan.Rank(), plan.Size(), comm.Rank(), comm.Size())
	}
	cfg.Ranks = comm.Size()
	comm, plan = ep.WithTimeout(comm, cfg.RankTimeout), ep.WithTimeout(plan, cfg.RankTimeout)
	R, S := cfg.Ranks, cfg.Steps
	if S < 1 {
		return nil, fmt.Errorf("dpattn: run of %d steps", S)
	}
	if cfg.MoEMode != "alltoall" && cfg.MoEMode != "gather" {
		return nil, fmt.Errorf("decoderun: MoE mode %q (want alltoall or gather)", cfg.MoEMode)
	}
	if cfg.Attn.HiddenSize() != cfg.MoE.Config.Hidden {
		return nil, fmt.Errorf("decoderun: attention hidden %d, MoE hidden %d", cfg.Attn.HiddenSize(), cfg.MoE.Config.Hidden)
	}
	sched := makeSchedule(R, S, cfg.Seed, cfg.Batch, cfg.Context)
	place, err := ep.Contiguous(cfg.MoE.Config.NumExperts, R)
	if err != nil {
		return nil, err
	}
	rep := &Report{Config: cfg, Ranks: make([]RankTimes, R), Steps: make([]StepInfo, S)}
	var mine RankTimes
	start := time.Now()
	y, err := runRank(ctx, cfg, sched, comm, plan, place, runtime.GOMAXPROCS(0), &mine, rep.Steps)
	if err != nil {
		comm.Abort(fmt.Errorf("rank %d: %w", comm.Rank(), err))
		return nil, err
	}
	wall := []int64{int64(time.Since(start)), int64(mine.Decode)}
	if err := comm.AllReduceInt64(ctx, wall, ep.Max); err != nil {
		return nil, err
	}
	rep.Wall, rep.DecodeWall = time.Duration(wall[0]), time.Duration(wall[1])
	// Everything to every rank (the transports have all-gather, not gather).
	t := []int64{int64(mine.Plan), int64(mine.Attention), int64(mine.Gather), int64(mine.MoE), int64(mine.Scatter), int64(mine.Tokens),
		int64(mine.Replays)}
	parts, err := comm.AllGather(ctx, ep.Bytes(t))
	if err != nil {
		return nil, err
	}
	for r, b := range parts {
		v, err := ep.FromBytes[int64](b)
		if err != nil || len(v) != len(t) {
			return nil, fmt.Errorf("decoderun: rank %d sent %d bytes of stage times", r, len(b))
		}
		rep.Ranks[r] = RankTimes{Plan: time.Duration(v[0]), Attention: time.Duration(v[1]), Gather: time.Duration(v[2]),
			MoE: time.Duration(v[3]), Scatter: time.Duration(v[4]), Tokens: int(v[5]), Replays: int(v[6])}
	}
	ys := make([][][]float32, R)
	for r := range ys {
		ys[r] = make([][]float32, S)
	}
	for st := 0; st < S; st++ {
		parts, err := comm.AllGather(ctx, ep.Bytes(y[st]))
		if err != nil {
			return nil, err
		}
		for r, b := range parts {
			if ys[r][st], err = ep.FromBytes[float32](b); err != nil {
				return nil, err
			}
		}
	}
	if comm.Rank() != 0 {
		return nil, nil
	}
	return rep, finish(ctx, cfg, sched, rep, ys)
}

func runRank(ctx context.Context, cfg Config, sched schedule, comm, plan ep.Comm, place *ep.Placement, workers int,
	times *RankTimes, steps []StepInfo) ([][]float32, error) {
	r := comm.Rank()
	H := cfg.Attn.HiddenSize()
	cache, err := newCacheFor(sched, []int{r}, cfg.Steps, cfg.Attn.RowDim(), cfg.CacheDType)
	if err != nil {
		return nil, err
	}
	backend := attn.Backend{Core: cfg.AttnCore, Proj: cfg.AttnProj}
	for q, l := range sched.requests[r] {
		if err := prefill(cache, seqID(r, q), l, cfg.Seed); err != nil {
			return nil, err
		}
	}
	shard := ep.Shard(cfg.MoE, place, r, workers)
	var gather dpattn.GatherRunner
	var layer dpattn.LayerRunner
	if cfg.MoEMode == "gather" && cfg.Layer != nil {
		runner, err := cfg.Layer(ctx, r, cfg.Attn, shard, comm)
		if err != nil {
			return nil, err
		}
		if runner != nil {
			defer runner.Close()
			layer = runner
		}
	}
	var experts ExpertRunner
	switch {
	case layer != nil: // the layer runner holds its experts
	case cfg.MoEMode == "gather" && cfg.Gather != nil:
		runner, err := cfg.Gather(ctx, r, shard, comm)
		if err != nil {
			return nil, err
		}
		defer runner.Close()
		gather = runner
	case cfg.Experts != nil:
		runner, err := cfg.Experts(r, shard)
		if err != nil {
			return nil, err
		}
		defer runner.Close()
		shard.SetExpertRunner(runner)
		experts = runner
	}
	epl, err := ep.FromLayer(shard, comm, place)
	if err != nil {
		return nil, err
	}
	coord := dpattn.NewCoordinator(plan)
	var gt dpattn.GatherTimes
	out := make([][]float32, cfg.Steps)
	// Every rank's caches filled before the decode clock starts: a rank
	// that filled its own first would otherwise count its wait for the
	// others as its first step.
	if err := plan.AllReduceInt64(ctx, []int64{0}, ep.Max); err != nil {
		return nil, err
	}
	decodeStart := time.Now()
	defer func() { times.Decode = time.Since(decodeStart) }()
	for st := 0; st < cfg.Steps; st++ {
		b := sched.batch[r][st]
		t0 := time.Now()
		plan, err := coord.Plan(ctx, b, dpattn.Decode)
		if err != nil {
			return nil, err
		}
		times.Plan += time.Since(t0)
		if r == 0 {
			steps[st] = StepInfo{Counts: plan.Counts, Skip: plan.Skip, GraphOK: plan.GraphOK}
		}
		if v, ok := experts.(moe.GraphVoter); ok {
			v.AllowGraph(plan.GraphOK)
		}
		if v, ok := cfg.AttnCore.(moe.GraphVoter); ok {
			v.AllowGraph(plan.GraphOK)
		}
		if v, ok := gather.(moe.GraphVoter); ok {
			v.AllowGraph(plan.GraphOK)
		}
		if v, ok := layer.(moe.GraphVoter); ok {
			v.AllowGraph(plan.GraphOK)
		}
		if plan.Skip {
			continue
		}
		x, seqs := stepInputs(cfg.Seed, r, st, b, H)
		tokens := stepTokens(cfg, r, st, b)
		if layer != nil {
			y := make([]float32, len(x))
			if err := layer.Forward(ctx, plan, cache, seqs, x, y, &times.MoE); err != nil {
				return nil, err
			}
			times.Tokens += b
			out[st] = y
			continue
		}
		t1 := time.Now()
		attn := make([]float32, len(x))
		if err := cfg.Attn.ForwardWith(ctx, backend, cache, seqs, x, attn); err != nil {
			return nil, err
		}
		for i := range attn {
			attn[i] += x[i] // residual: the MoE layer's input
		}
		times.Attention += time.Since(t1)
		y := make([]float32, len(x))
		if cfg.MoEMode == "alltoall" {
			if err := epl.ForwardTokens(ctx, attn, tokens, y, nil, nil); err != nil {
				return nil, err
			}
		} else if gather != nil {
			if err := gather.Forward(ctx, plan, attn, y, &gt); err != nil {
				return nil, err
			}
		} else if err := dpattn.MoEGatherTokens(ctx, comm, shard, plan, attn, tokens, y, &gt); err != nil {
			return nil, err
		}
		times.Tokens += b
		out[st] = y
	}
	for _, runner := range []any{layer, gather} {
		if c, ok := runner.(moe.GraphCounter); ok {
			times.Replays += c.GraphReplays()
		}
	}
	if cfg.MoEMode == "alltoall" {
		st := epl.StageTimes()
		times.Gather, times.MoE, times.Scatter = st.Dispatch, st.Experts, st.Combine
	} else {
		times.Gather, times.Scatter = gt.Gather, gt.Scatter
		times.MoE += gt.Experts
	}
	times.KVBytes = cache.BytesUsed()
	return out, nil
}

// runRankTP is runRank under tensor-parallel attention: this rank caches
// every rank's requests, computes its heads (attn.MLABlock.HeadShard)
// over every token of the step, and all-reduces the partial outputs; the
// MoE layer is its expert shard over every token, all-reduced
// (dpattn.MoETensorParallel). Its outputs are those of its own requests'
// tokens, as a DP rank's, for the parity check.
func runRankTP(ctx context.Context, cfg Config, sched schedule, comm ep.Comm, place *ep.Placement, workers int,
	times *RankTimes, steps []StepInfo) ([][]float32, error) {
	r, R := comm.Rank(), comm.Size()
	H := cfg.Attn.HiddenSize()
	blk, ok := cfg.Attn.(*attn.MLABlock)
	if !ok {
		return nil, fmt.Errorf("decoderun: tensor-parallel attention needs an MLA block, have %T", cfg.Attn)
	}
	heads, err := blk.HeadShard(r, R)
	if err != nil {
		return nil, err
	}
	all := make([]int, R)
	for i := range all {
		all[i] = i
	}
	cache, err := newCacheFor(sched, all, cfg.Steps, cfg.Attn.RowDim(), cfg.CacheDType)
	if err != nil {
		return nil, err
	}
	for rr := range sched.requests {
		for q, l := range sched.requests[rr] {
			if err := prefill(cache, seqID(rr, q), l, cfg.Seed); err != nil {
				return nil, err
			}
		}
	}
	shard := ep.Shard(cfg.MoE, place, r, workers)
	var gt dpattn.GatherTimes
	var reduce time.Duration
	out := make([][]float32, cfg.Steps)
	// Every rank's caches filled before the decode clock starts: a rank
	// that filled its own first would otherwise count its wait for the
	// others as its first step.
	if err := comm.AllReduceInt64(ctx, []int64{0}, ep.Max); err != nil {
		return nil, err
	}
	decodeStart := time.Now()
	defer func() { times.Decode = time.Since(decodeStart) }()
	for st := 0; st < cfg.Steps; st++ {
		// Every rank knows the schedule: the step's tokens are every rank's.
		plan := &dpattn.StepPlan{Counts: make([]int64, R), Tokens: sched.batch[r][st]}
		var x []float32
		var seqs []int
		var tokens []int32
		for rr := 0; rr < R; rr++ {
			b := sched.batch[rr][st]
			plan.Counts[rr] = int64(b)
			if rr < r {
				plan.Offset += b
			}
			plan.Total += b
			xr, sr := stepInputs(cfg.Seed, rr, st, b, H)
			x, seqs = append(x, xr...), append(seqs, sr...)
			tokens = append(tokens, stepTokens(cfg, rr, st, b)...)
		}
		plan.Skip, plan.GraphOK = plan.Total == 0, true
		if r == 0 {
			steps[st] = StepInfo{Counts: plan.Counts, Skip: plan.Skip, GraphOK: true}
		}
		if plan.Skip {
			continue
		}
		t1 := time.Now()
		attn := make([]float32, len(x))
		if err := heads.Forward(ctx, cache, seqs, x, attn); err != nil {
			return nil, err
		}
		t2 := time.Now()
		times.Attention += t2.Sub(t1)
		if err := comm.AllReduceFloat32(ctx, attn, ep.Sum); err != nil {
			return nil, err
		}
		reduce += time.Since(t2)
		for i := range attn {
			attn[i] += x[i] // residual: the MoE layer's input
		}
		y := make([]float32, len(x))
		if err := dpattn.MoETensorParallel(ctx, comm, shard, plan, attn, tokens, y, &gt); err != nil {
			return nil, err
		}
		times.Tokens += plan.Tokens
		out[st] = y[plan.Offset*H : (plan.Offset+plan.Tokens)*H]
	}
	// The report's columns: the attention all-reduce where DP has its
	// dispatch or all-gather, the MoE all-reduce where it has its combine.
	times.Gather, times.MoE, times.Scatter = reduce, gt.Experts, gt.Scatter
	times.KVBytes = cache.BytesUsed()
	return out, nil
}

func seqID(rank, req int) int { return rank<<16 | req }

// stepInputs are rank r's hidden states at step st: one token for each of
// its first b requests.
func stepInputs(seed uint64, r, st, b, hidden int) ([]float32, []int) {
	x := make([]float32, 0, b*hidden)
	seqs := make([]int, b)
	for q := 0; q < b; q++ {
		x = append(x, hiddenOf(seed, r, q, st, hidden)...)
		seqs[q] = seqID(r, q)
	}
	return x, seqs
}

// stepTokens are the token ids of rank r's first b requests at step st
// when the layer routes by them (a hash layer: the ids decide the experts,
// so each is drawn from the vocabulary from the seed, the request and the
// step, as a decode step's sampled token would be); nil otherwise.
func stepTokens(cfg Config, r, st, b int) []int32 {
	if !cfg.MoE.TokenRouted() {
		return nil
	}
	ids := make([]int32, b)
	for q := range ids {
		rng := rand.New(rand.NewPCG(cfg.Seed^0x70c3, uint64(r)<<40|uint64(q)<<20|uint64(st)))
		ids[q] = int32(rng.IntN(cfg.MoE.Config.VocabSize))
	}
	return ids
}

// runOneRank computes every step's outputs, all ranks' tokens together in
// rank order, on one rank: attention per request, then the whole MoE layer.
func runOneRank(ctx context.Context, cfg Config, sched schedule) ([][]float32, error) {
	H := cfg.Attn.HiddenSize()
	all := make([]int, cfg.Ranks)
	for r := range all {
		all[r] = r
	}
	cache, err := newCacheFor(sched, all, cfg.Steps, cfg.Attn.RowDim(), cfg.CacheDType)
	if err != nil {
		return nil, err
	}
	for r := range sched.requests {
		for q, l := range sched.requests[r] {
			if err := prefill(cache, seqID(r, q), l, cfg.Seed); err != nil {
				return nil, err
			}
		}
	}
	out := make([][]float32, cfg.Steps)
	for st := 0; st < cfg.Steps; st++ {
		var h []float32
		var tokens []int32
		for r := 0; r < cfg.Ranks; r++ {
			x, seqs := stepInputs(cfg.Seed, r, st, sched.batch[r][st], H)
			tokens = append(tokens, stepTokens(cfg, r, st, sched.batch[r][st])...)
			attn := make([]float32, len(x))
			if err := cfg.Attn.Forward(ctx, cache, seqs, x, attn); err != nil {
				return nil, err
			}
			for i := range attn {
				attn[i] += x[i]
			}
			h = append(h, attn...)
		}
		y := make([]float32, len(h))
		if err := cfg.MoE.ForwardTokens(ctx, h, tokens, y, nil, nil); err != nil {
			return nil, err
		}
		out[st] = y
	}
	return out, nil
}
