package dpattn

import "context"

// Block is an attention block the decode run can drive.
type Block interface {
	HiddenSize() int
	LatentDim() int
	// Forward runs new tokens x [T, hidden] of sequences seqs (a sequence's
	// tokens consecutive, in order), appending their latent rows to the
	// cache, and writes out [T, hidden].
	Forward(ctx context.Context, cache *LatentCache, seqs []int, x, out []float32) error
}

var _ Block = (*MLABlock)(nil)
