package dpattn

import (
	"context"
	"fmt"
	"time"

	"github.com/moex-project/moex/ep"
	"github.com/moex-project/moex/internal/buffers"
	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// HeadShard is rank's share of the block under tensor-parallel attention
// over ranks: heads [rank·n, (rank+1)·n) of n = Heads / ranks, with their
// rows of q_proj (q_b_proj), their kv_b_proj halves and their columns of
// o_proj; the latent projection (kv_a_proj_with_mqa and its norm, q_a_proj)
// is every rank's whole, since MLA's one latent head cannot be split: each
// rank computes and caches every token's latent row. The shard's output is
// a partial sum of o_proj; the ranks' outputs summed (an all-reduce) are
// the block's. Weights are copied (in their dtype: f32, bf16 or fp16).
func (b *MLABlock) HeadShard(rank, ranks int) (*MLABlock, error) {
	c := b.Cfg
	if ranks < 1 || rank < 0 || rank >= ranks {
		return nil, fmt.Errorf("dpattn: head shard %d of %d ranks", rank, ranks)
	}
	if c.Heads%ranks != 0 {
		return nil, fmt.Errorf("dpattn: %d attention heads do not split over %d tensor-parallel ranks", c.Heads, ranks)
	}
	n := c.Heads / ranks
	h0, h1 := rank*n, (rank+1)*n
	qd := c.NopeDim + c.RopeDim
	s := &MLABlock{Cfg: c, Scale: b.Scale, qANorm: b.qANorm, kvA: b.kvA, kvANorm: b.kvANorm, rope: b.rope,
		wUKT: b.wUKT[h0:h1:h1], wUV: b.wUV[h0:h1:h1]}
	s.Cfg.Heads = n
	var err error
	if c.QLoraRank == nil {
		s.qProj, err = subMatrix(b.qProj, h0*qd, h1*qd, 0, b.qProj.Cols)
	} else {
		s.qA = b.qA
		s.qB, err = subMatrix(b.qB, h0*qd, h1*qd, 0, b.qB.Cols)
	}
	if err != nil {
		return nil, fmt.Errorf("dpattn: head shard of the query projection: %w", err)
	}
	if s.oProj, err = subMatrix(b.oProj, 0, b.oProj.Rows, h0*c.VDim, h1*c.VDim); err != nil {
		return nil, fmt.Errorf("dpattn: head shard of o_proj: %w", err)
	}
	return s, nil
}

// subMatrix copies rows [r0, r1) × columns [c0, c1) of m into a new matrix
// of its dtype (f32, bf16 or fp16: every value exact), packed if m was.
func subMatrix(m kernels.Matrix, r0, r1, c0, c1 int) (kernels.Matrix, error) {
	rows, cols := r1-r0, c1-c0
	row := make([]float32, m.Cols)
	var out kernels.Matrix
	var err error
	switch m.DType {
	case kernels.F32:
		v := make([]float32, rows*cols)
		for i := range rows {
			m.RowF32(r0+i, row)
			copy(v[i*cols:], row[c0:c1])
		}
		out, err = kernels.NewF32(rows, cols, v)
	case kernels.BF16, kernels.F16:
		to := half.F32ToBF16
		if m.DType == kernels.F16 {
			to = half.F32ToF16
		}
		v := make([]uint16, rows*cols)
		for i := range rows {
			m.RowF32(r0+i, row)
			for j, x := range row[c0:c1] {
				v[i*cols+j] = to(x)
			}
		}
		out, err = kernels.NewHalf(m.DType, rows, cols, v)
	default:
		return kernels.Matrix{}, fmt.Errorf("%v weights are not split by heads (f32, bf16 and fp16 are)", m.DType)
	}
	if err != nil {
		return kernels.Matrix{}, err
	}
	if m.Packed() {
		out = kernels.Pack(out)
	}
	return out, nil
}

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
