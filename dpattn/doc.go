// Package dpattn will own data-parallel attention: the per-step coordinator
// (token counts, IDLE batches, the graph-replay vote), the gather/scatter of
// hidden states around the MoE layer, and MLA attention over a paged latent
// KV cache.
package dpattn
