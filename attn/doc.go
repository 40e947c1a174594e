// Package attn is attention as a layer of its own: the paged KV cache
// (Cache: rows of a fixed width in reference-counted blocks, the radix
// prefix cache's unit), MLA attention in the absorbed form over it (MLA:
// decode and causal extend, split-KV with a log-sum-exp merge), and
// DeepSeek-V2/V3's attention block (MLABlock: the projections, the latent
// norms, RoPE, and MLA over the cached latent rows, whose first
// kv_lora_rank values are the values' view of the key). A Block is what
// a decoder drives; a Backend moves a block's projections and attention
// onto a device (attn.Core, attn.Projector: dpattn/dpattngpu's).
//
// The contract:
//
//   - Every call that can block (MLA, a block's Forward) takes a
//     context.Context first.
//   - Concurrency: a Cache may be read and appended to from several
//     goroutines, with one writer per sequence at a time; a block's
//     weights are read-only and may serve many ranks.
//   - Errors name the sequence, query or tensor; a cache without room is
//     errors.Is(err, ErrCacheExhausted), a NaN or infinity ErrNonFinite.
package attn
