// Package dpattn is data-parallel attention: MLA's paged latent-KV cache and
// its attention in the absorbed form (decode and causal extend, split-KV
// with a log-sum-exp merge), and (as it grows) the per-step coordinator and
// the gather/scatter of hidden states around the MoE layer.
package dpattn
