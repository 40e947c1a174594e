// Package dpattn is data-parallel attention: the per-step Coordinator
// (every rank's token count all-gathered, IDLE batches for ranks without
// work, the graph-replay vote), gather mode's MoE stage (MoEGather:
// all-gather the ranks' hidden states, each rank's expert shard over every
// token, reduce-scatter), MLA's paged latent-KV cache (LatentCache) and its
// attention in the absorbed form (MLA: decode and causal extend, split-KV
// with a log-sum-exp merge), DeepSeek's attention block (MLABlock), and the
// KV accounting of TP against DP attention. dpattn/dpattngpu runs its steps
// on a device, plugging in through a Backend (AttentionCore, Projector),
// GatherRunner and LayerRunner.
//
// The contract:
//
//   - Every call that can block (Plan, MoEGather, MLA, a block's Forward)
//     takes a context.Context first; a rank that does not arrive at a
//     collective fails the others by the context's deadline.
//   - Concurrency: a Coordinator belongs to its rank's goroutine; a LatentCache may be read and appended to from several
//     goroutines, with one writer per sequence at a time; an MLABlock's
//     weights are read-only and may serve many ranks.
//   - Errors name the sequence, query or rank; a cache without room is
//     errors.Is(err, ErrCacheExhausted).
package dpattn
