package dpattn

import (
	"context"
	"fmt"
	"time"

	"github.com/moex-project/moex/ep"
	"github.com/moex-project/moex/internal/buffers"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// MoETensorParallel is the MoE stage under tensor-parallel attention: the
// hidden states x (every token of the step, the same on every rank) go
// through this rank's expert shard, the shared expert (for this rank's
// share of the tokens, plan's Offset and Tokens, so that it is counted
// once), and an all-reduce sums the ranks' partial outputs into y on every
// rank. times: Experts the local work, Scatter the all-reduce.
func MoETensorParallel(ctx context.Context, comm ep.Comm, shard *moe.Layer, plan *StepPlan, x []float32, tokens []int32, y []float32, times *GatherTimes) error {
	if times == nil {
		times = new(GatherTimes)
	}
	t0 := time.Now()
	c := shard.Config
	H, K, T := c.Hidden, c.TopK, plan.Total
	fail := func(err error) error {
		comm.Abort(err)
		return err
	}
	switch {
	case len(x) != T*H || len(y) != len(x):
		return fail(fmt.Errorf("dpattn: tensor-parallel MoE: x has %d values and y %d, the step %d tokens of %d", len(x), len(y), T, H))
	case c.ResidualInput:
		return fail(fmt.Errorf("dpattn: tensor-parallel MoE: %s's block (its own norms and residual) is run in DP attention only", c.ModelType))
	case plan.Offset < 0 || plan.Offset+plan.Tokens > T:
		return fail(fmt.Errorf("dpattn: tensor-parallel MoE: this rank's tokens [%d, %d) of %d", plan.Offset, plan.Offset+plan.Tokens, T))
	}
	if err := moe.CheckFinite(x, H); err != nil {
		return fail(err)
	}
	if err := shard.Router.CheckTokens(tokens, T); err != nil {
		return fail(err)
	}
	sc := moePool.Get().(*moeScratch)
	defer moePool.Put(sc)
	ids := buffers.Grow(&sc.ids, T*K)
	weights := buffers.Grow(&sc.weights, T*K)
	if err := shard.RouteTokens(ctx, x, tokens, ids, weights); err != nil {
		return fail(err)
	}
	g, err := shard.Group(ids, weights, K, true, sc.out)
	if err != nil {
		return fail(err)
	}
	sc.out = g.Out[:cap(g.Out)]
	if err := shard.RunExperts(ctx, x, g.Groups, &sc.ffn); err != nil {
		return fail(err)
	}
	clear(y)
	moe.Combine(y, g.Out, g.RowOf, K, H, nil)
	lo, hi := plan.Offset*H, (plan.Offset+plan.Tokens)*H
	if shared := shard.SharedFFN(x[lo:hi], nil, buffers.Grow(&sc.shared, hi-lo)); shared != nil {
		if err := shard.RunExperts(ctx, x[lo:hi], []kernels.FFNGroup{*shared}, &sc.ffn); err != nil {
			return fail(err)
		}
		for i, v := range shared.Out {
			y[lo+i] += v
		}
	}
	t1 := time.Now()
	times.Experts += t1.Sub(t0)
	if err := comm.AllReduceFloat32(ctx, y, ep.Sum); err != nil {
		return err
	}
	times.Scatter += time.Since(t1)
	return nil
}
