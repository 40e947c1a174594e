// Package moegpu is the MoE pipeline on a device (build tags cuda or
// cudaemu; builds without them get this documentation only): a layer's
// router and experts resident as bf16 (MoE), the pipeline — route, layout,
// grouped SwiGLU and down GEMMs, combine — written once (Stage, and
// SharedStage for gather mode's shared expert) and used by MoE.Forward,
// the graph-replayed decode Step, dpattn's gather mode and fused layer, and
// the expert runner a moe.Layer can plug in (Experts, moe.ExpertRunner).
// GroupedFFN is kernels.GroupedFFN's contract on the device.
//
// Numerics: activations are rounded to bf16 on the device and accumulated
// in fp32 on the tensor cores, within about 1e-2 of the fp32 CPU path; a
// graph's replay gives the bits of the eager launches.
//
// Concurrency: MoE.Forward may be called from several goroutines at once
// (each call takes a set of temporaries of its own); a Step, a Stage and
// Experts belong to one goroutine at a time. Close frees the device memory
// and must not race with calls in flight.
package moegpu
