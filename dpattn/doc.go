// Package dpattn is data-parallel attention: the per-step Coordinator
// (every rank's token count all-gathered, IDLE batches for ranks without
// work, the graph-replay vote), gather mode's MoE stage (MoEGather:
// all-gather the ranks' hidden states, each rank's expert shard over every
// token, reduce-scatter), the MoE stage under tensor-parallel attention
// (MoETensorParallel), and the KV accounting of TP against DP attention.
// The attention itself (MLA, its blocks and the paged cache) is package
// attn's. dpattn/dpattngpu runs the steps on a device, plugging in through
// attn.Backend (attn.Core, attn.Projector), GatherRunner and LayerRunner.
//
// The contract:
//
//   - Every call that can block (Plan, MoEGather) takes a context.Context
//     first; a rank that does not arrive at a collective fails the others
//     by the context's deadline.
//   - Concurrency: a Coordinator belongs to its rank's goroutine.
//   - Errors name the sequence, query or rank; a cache without room is
//     errors.Is(err, attn.ErrCacheExhausted).
package dpattn
