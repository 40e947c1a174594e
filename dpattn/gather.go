package dpattn

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/ep"
	"github.com/moex-project/moex/internal/buffers"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// GatherTimes are the accumulated wall times of gather mode's stages.
type GatherTimes struct {
	Gather  time.Duration // all-gather of the hidden states
	Experts time.Duration // routing, the shard's experts, the shared expert
	Scatter time.Duration // reduce-scatter of the partial outputs
}

// GatherRunner runs gather mode's MoE stage of one rank somewhere other
// than the CPU (a GPU: dpattngpu.GatherMoE): every rank calls Forward for each
// step that is not skipped, with its rows x of plan (none when IDLE), and
// gets its rows of the layer's output in y.
type GatherRunner interface {
	Forward(ctx context.Context, plan *StepPlan, x, y []float32, times *GatherTimes) error
}

// LayerRunner runs a whole decoder layer's decode step of one rank (a GPU:
// dpattngpu.DecodeLayer): the attention block over cache for one new token of
// each of seqs, the residual, and gather mode's MoE stage; x are the
// tokens' hidden states (none when IDLE), y gets the layer's output. Every
// rank calls Forward for each step that is not skipped. times (nil: none)
// accumulates the step's wall time.
type LayerRunner interface {
	Forward(ctx context.Context, plan *StepPlan, cache *attn.Cache, seqs []int, x, y []float32, times *time.Duration) error
}

// MoEGather runs the MoE layer in gather mode (SGLang, late 2024): the
// hidden states of every rank are all-gathered, each rank runs the experts
// it holds (shard, e.g. from moe.LoadSubset with an ep.Placement) on all
// tokens, and the partial outputs are reduce-scattered back to each rank's
// own rows; the shared expert then runs on the rank's own rows. x and y are
// this rank's tokens [tokens, hidden]; plan is this step's StepPlan.
//
// Every expert is held by exactly one rank (placement without replicas).
// The cross-rank sum associates differently from one rank, so the output
// matches it to rounding (not bit for bit), and is the same run to run.
//
// times (nil: none) accumulates the stages' wall times.
//
// A block that owns its norms (gemma4) gathers the residual: every rank
// norms the gathered tokens for its experts, and norms its own rows for
// the dense MLP and the output.
func MoEGather(ctx context.Context, comm ep.Comm, shard *moe.Layer, plan *StepPlan, x, y []float32, times *GatherTimes) error {
	return MoEGatherTokens(ctx, comm, shard, plan, x, nil, y, times)
}

// MoEGatherTokens is MoEGather given this rank's token ids [tokens], which
// a layer that chooses its experts by token id needs (deepseek_v4's hash
// layers, moe.Layer.TokenRouted); they are gathered with the hidden
// states. Other layers ignore them.
func MoEGatherTokens(ctx context.Context, comm ep.Comm, shard *moe.Layer, plan *StepPlan, x []float32, tokens []int32, y []float32, times *GatherTimes) error {
	if times == nil {
		times = new(GatherTimes)
	}
	t0 := time.Now()
	c := shard.Config
	H, K := c.Hidden, c.TopK
	if len(x) != plan.Tokens*H || len(y) != len(x) {
		err := fmt.Errorf("dpattn: gather: x has %d values and y %d, the plan says %d tokens of %d", len(x), len(y), plan.Tokens, H)
		comm.Abort(err)
		return err
	}
	if err := moe.CheckFinite(x, H); err != nil {
		comm.Abort(err)
		return err
	}
	routed := shard.TokenRouted()
	if err := shard.Router.CheckTokens(tokens, plan.Tokens); err != nil {
		comm.Abort(err)
		return err
	}
	var total int64
	for _, n := range plan.Counts {
		total += n
	}
	if int64(plan.Total) != total || len(plan.Counts) != comm.Size() {
		err := fmt.Errorf("dpattn: gather: the plan's counts %v (total %d) for %d ranks", plan.Counts, plan.Total, comm.Size())
		comm.Abort(err)
		return err
	}
	parts, err := comm.AllGather(ctx, ep.Bytes(x))
	if err != nil {
		return err
	}
	T := plan.Total
	sc := moePool.Get().(*moeScratch)
	defer moePool.Put(sc)
	all := buffers.Grow(&sc.all, T*H)[:0]
	for r, p := range parts {
		v, err := ep.FromBytes[float32](p)
		if err != nil || len(v) != int(plan.Counts[r])*H {
			err := fmt.Errorf("dpattn: gather: rank %d sent %d bytes for %d tokens", r, len(p), plan.Counts[r])
			comm.Abort(err)
			return err
		}
		all = append(all, v...)
	}
	var allTokens []int32
	if routed {
		parts, err := comm.AllGather(ctx, ep.Bytes(tokens))
		if err != nil {
			return err
		}
		for r, p := range parts {
			v, err := ep.FromBytes[int32](p)
			if err != nil || len(v) != int(plan.Counts[r]) {
				err := fmt.Errorf("dpattn: gather: rank %d sent %d bytes of token ids for %d tokens", r, len(p), plan.Counts[r])
				comm.Abort(err)
				return err
			}
			allTokens = append(allTokens, v...)
		}
	}
	t1 := time.Now()
	times.Gather += t1.Sub(t0)
	ids := buffers.Grow(&sc.ids, T*K)
	weights := buffers.Grow(&sc.weights, T*K)
	if err := shard.RouteTokens(ctx, all, allTokens, ids, weights); err != nil {
		comm.Abort(err)
		return err
	}
	// What the experts read, and (a block owning its norms) what the
	// dense MLP reads: this rank's rows of the gathered tokens' dense input.
	in, own := all, x
	if c.ResidualInput {
		var dense []float32
		if in, dense, err = shard.BlockInputs(ctx, all); err != nil {
			comm.Abort(err)
			return err
		}
		own = dense[plan.Offset*H : (plan.Offset+plan.Tokens)*H]
	}
	// This rank's experts over every token routed to them, then each
	// token's partial sum over them in ascending expert id (zero where this
	// rank holds none): the one pipeline's grouping and combine.
	g, err := shard.Group(ids, weights, K, true, sc.out)
	if err != nil {
		comm.Abort(err)
		return err
	}
	sc.out = g.Out[:cap(g.Out)]
	if err := shard.RunExperts(ctx, in, g.Groups, &sc.ffn); err != nil {
		comm.Abort(err)
		return err
	}
	partial := buffers.Grow(&sc.partial, T*H)
	clear(partial)
	moe.Combine(partial, g.Out, g.RowOf, K, H, nil)
	counts := make([]int, len(plan.Counts))
	for r, n := range plan.Counts {
		counts[r] = int(n) * H
	}
	t2 := time.Now()
	times.Experts += t2.Sub(t1)
	mine, err := comm.ReduceScatter(ctx, partial, counts)
	if err != nil {
		return err
	}
	copy(y, mine)
	t3 := time.Now()
	times.Scatter += t3.Sub(t2)
	defer func() { times.Experts += time.Since(t3) }()
	if shared := shard.SharedFFN(own, nil, buffers.Grow(&sc.shared, len(own))); shared != nil {
		if err := shard.RunExperts(ctx, own, []kernels.FFNGroup{*shared}, &sc.ffn); err != nil {
			comm.Abort(err)
			return err
		}
		if c.ResidualInput {
			if err := shard.BlockOutput(ctx, y, shared.Out); err != nil {
				comm.Abort(err)
				return err
			}
			return nil
		}
		for i := range y {
			y[i] += shared.Out[i]
		}
	}
	return nil
}

// moeScratch is a gather-mode or tensor-parallel MoE step's working
// memory, pooled: a step's buffers are reused, not fresh pages to fault in
// (those made gather mode's expert stage ~30 % slower than all-to-all's on
// a 2-core VM). A collective's send buffer is free again once it returns:
// every rank has read it by then.
type moeScratch struct {
	all, weights, partial, out, shared []float32
	ids                                []int32
	ffn                                kernels.Scratch
}

var moePool = sync.Pool{New: func() any { return new(moeScratch) }}
