//go:build cudaemu && !cuda

package main

import (
	"context"
	"errors"

	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/ep"
	"github.com/moex-project/moex/ep/epgpu"
)

// deviceName says where --backend cuda runs.
const deviceName = "the CPU emulation of the CUDA kernels"

// openDevice gives --backend cuda the CPU emulation of the kernels: the
// same launch code as on a GPU, run on CPU threads (slow; for tests).
func openDevice() (cuda.Launcher, func(), error) {
	return cuda.NewEmu(), func() {}, nil
}

// ncclWorld: the emulation has no NCCL.
func ncclWorld(context.Context) (ep.Comm, ep.Comm, func(), error) {
	return nil, nil, nil, errors.New("run: --comm nccl needs GPUs and NCCL (a `make cuda` build); the emulation has neither")
}

// deviceComm: the ranks of the emulation exchange the emulated device's
// buffers over their ep.Comm, as steps of its stream (graphs hold them).
func deviceComm(d cuda.Launcher, comm ep.Comm) epgpu.DeviceComm {
	return epgpu.NewEmuComm(d.(*cuda.Emu), comm)
}
