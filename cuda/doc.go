// Package cuda is the GPU runtime of moex (build tag cuda over
// gorgonia.org/cu; the CPU emulation of kernels/cudaemu under tag cudaemu):
// a device context, the embedded kernel fatbin, device buffers, copies,
// one typed launcher per kernel of kernels/cuda behind the Launcher
// interface (Device on a GPU, Emu on the emulation), graph capture and
// replay, and the allocators of a call's temporaries (Buffers, Scratch,
// ScratchPool). It knows nothing of MoE layers or attention: the packages
// that sequence its kernels (moe/moegpu, ep/epgpu, dpattn/dpattngpu)
// import it, never the other way round.
//
// gorgonia.org/cu calls cuInit in its package init and exits the process
// when no GPU is usable, so nothing outside the cuda tag imports it; builds
// without either tag get this documentation only.
//
// Concurrency: a Device or an Emu may be used from several goroutines (its
// launches are serialised on its stream); a Buffers, Scratch or
// ScratchAlloc belongs to one caller at a time; ScratchPool is safe for
// concurrent use.
package cuda
