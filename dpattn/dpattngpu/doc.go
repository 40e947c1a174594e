// Package dpattngpu is DP attention on a device (build tags cuda or
// cudaemu; builds without them get this documentation only): MLA decode
// over a device copy of a rank's latent cache and the DeepSeek attention
// block's projections and decode step (Attention: attn.Core and
// its Projector), gather mode's MoE stage in device memory (GatherMoE:
// dpattn.GatherRunner, on moegpu's pipeline and an epgpu.DeviceComm), and a
// whole decoder layer's decode step as one graph per step shape
// (DecodeLayer: dpattn.LayerRunner). MLADecode is `moex exec mla-decode`'s
// contract on the device.
//
// Concurrency: Attention may serve several ranks' goroutines (one writer
// per sequence at a time); GatherMoE and DecodeLayer belong to their
// rank's goroutine.
package dpattngpu
