package attn

import (
	"fmt"

	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/kernels"
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
		return nil, fmt.Errorf("attn: head shard %d of %d ranks", rank, ranks)
	}
	if c.Heads%ranks != 0 {
		return nil, fmt.Errorf("attn: %d attention heads do not split over %d tensor-parallel ranks", c.Heads, ranks)
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
		return nil, fmt.Errorf("attn: head shard of the query projection: %w", err)
	}
	if s.oProj, err = subMatrix(b.oProj, 0, b.oProj.Rows, h0*c.VDim, h1*c.VDim); err != nil {
		return nil, fmt.Errorf("attn: head shard of o_proj: %w", err)
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
