package attn

import "context"

// Block is an attention layer a decode loop can drive (MLABlock:
// DeepSeek's), not to be confused with Blocks, the pages of a cache.
type Block interface {
	HiddenSize() int
	LatentDim() int
	// Forward runs new tokens x [T, hidden] of sequences seqs (a sequence's
	// tokens consecutive, in order), appending their latent rows to the
	// cache, and writes out [T, hidden].
	Forward(ctx context.Context, cache *Cache, seqs []int, x, out []float32) error
	// ForwardWith is Forward with the block's work on be (the zero
	// Backend: the host, as Forward).
	ForwardWith(ctx context.Context, be Backend, cache *Cache, seqs []int, x, out []float32) error
}

var _ Block = (*MLABlock)(nil)
