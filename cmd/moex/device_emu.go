//go:build cudaemu && !cuda

package main

import "github.com/moex-project/moex/cuda"

// deviceName says where --backend cuda runs.
const deviceName = "the CPU emulation of the CUDA kernels"

// openDevice gives --backend cuda the CPU emulation of the kernels: the
// same launch code as on a GPU, run on CPU threads (slow; for tests).
func openDevice() (cuda.Launcher, func(), error) {
	return cuda.NewEmu(), func() {}, nil
}
