// Package cudaemu runs the CUDA kernels of kernels/cuda on CPU threads
// through the emulation header kernels/emu/cuda_emu.h (build tag cudaemu,
// cgo and a C++20 compiler): the way moex checks its GPU kernels on
// machines without a GPU, against the Go implementations.
package cudaemu
