// Package epgpu is expert parallelism's collectives on device buffers
// (build tags cuda or cudaemu; builds without them get this documentation
// only): a DeviceComm all-gathers and reduce-scatters the hidden states of
// gather mode in device memory, enqueued on the device's stream between
// the kernels, so that a graph can hold them. NCCLComm runs them on NCCL
// (tag cuda), EmuComm on the emulation (tag cudaemu), StagedComm over any
// ep.Comm through the host (eager only).
//
// Concurrency: a DeviceComm belongs to its rank's goroutine.
package epgpu
