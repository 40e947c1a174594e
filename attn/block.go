package attn

import (
	"context"

	"github.com/moex-project/moex/kernels"
)

// Block is an attention layer a decoder drives (MLABlock: DeepSeek's
// multi-head latent attention; GQABlock: grouped-query attention), not to
// be confused with Blocks, the pages of a cache.
type Block interface {
	// HiddenSize is the model width the block reads and writes.
	HiddenSize() int
	// RowDim is the width of the cache row a token leaves (MLA: its
	// latent, kv_lora_rank + rope; GQA: its keys then its values).
	RowDim() int
	// Forward runs new tokens x [T, hidden] of sequences seqs (a sequence's
	// tokens consecutive, in order), appending their rows to the cache,
	// and writes out [T, hidden].
	Forward(ctx context.Context, cache *Cache, seqs []int, x, out []float32) error
	// ForwardWith is Forward with the block's work on be (the zero
	// Backend: the host, as Forward).
	ForwardWith(ctx context.Context, be Backend, cache *Cache, seqs []int, x, out []float32) error
	// WeightBytes is the bytes of the block's weights a step reads.
	WeightBytes() int64
	// SetNumerics puts each host projection whose dtype can take mode n
	// (kernels.Numerics.Pack) in it; the others stay exact. It returns how
	// many projections took it. Call it before any Forward.
	SetNumerics(n kernels.Numerics) int
	// Close releases what the block owns (a checkpoint it opened).
	Close() error
}

var (
	_ Block = (*MLABlock)(nil)
	_ Block = (*GQABlock)(nil)
)

// projector is be's Projector, or the host's.
func (be Backend) projector() Projector {
	if be.Proj != nil {
		return be.Proj
	}
	return cpuProjector{}
}

// setTables gives each query its sequence's block table, fetched once a
// sequence after its rows are in the cache: a token reads the prefix of it
// its length covers (one copy a sequence, not a token: a long prompt's
// extend would copy its table once per token).
func setTables(cache *Cache, seqs []int, queries []Query) {
	tables := map[int][]int32{}
	for t, s := range seqs {
		if tables[s] == nil {
			tables[s] = cache.BlockTable(s)
		}
		queries[t].Table = tables[s]
	}
}

// setNumerics repacks each matrix of ms for n where n.Pack takes it, and
// counts them; the others are left as they are.
func setNumerics(n kernels.Numerics, ms ...*kernels.Matrix) int {
	took := 0
	for _, m := range ms {
		if m.Rows == 0 || m.Numerics() == n {
			continue
		}
		if p, err := n.Pack(*m); err == nil {
			*m, took = p, took+1
		}
	}
	return took
}
