//go:build cuda

package main

import (
	"context"
	"fmt"
	"os"
	"strconv"

	"github.com/moex-project/moex/bindings/nccl"
	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/ep"
)

// deviceName says where --backend cuda runs.
const deviceName = "the GPU"

// worldDevice is the GPU of this process's NCCL rank, once joined.
var worldDevice *cuda.Device

// openDevice opens the GPU for --backend cuda: the NCCL rank's, or GPU 0.
func openDevice() (cuda.Launcher, func(), error) {
	if worldDevice != nil {
		return worldDevice, func() {}, nil
	}
	d, err := cuda.Open(0)
	if err != nil {
		return nil, nil, err
	}
	return d, func() { d.Close() }, nil
}

// ncclWorld joins the torchrun-style group (MASTER_ADDR, MASTER_PORT, RANK,
// WORLD_SIZE; LOCAL_RANK picks the GPU, else RANK modulo the GPU count):
// the unique id over TCP from rank 0, an NCCL communicator on this rank's
// GPU, and ep.Comm over it with host bytes staged through the GPU.
func ncclWorld(ctx context.Context) (ep.Comm, func(), error) {
	env, err := nccl.EnvFromOS()
	if err != nil {
		return nil, nil, err
	}
	if err := nccl.Load(nccl.DefaultLibrary); err != nil {
		return nil, nil, err
	}
	count, err := cuda.Count()
	if err != nil || count == 0 {
		return nil, nil, fmt.Errorf("run: no GPU for NCCL rank %d: %v", env.Rank, err)
	}
	ordinal := env.Rank % count
	if v := os.Getenv("LOCAL_RANK"); v != "" {
		if ordinal, err = strconv.Atoi(v); err != nil || ordinal < 0 || ordinal >= count {
			return nil, nil, fmt.Errorf("run: LOCAL_RANK=%q is not a GPU index below %d", v, count)
		}
	}
	d, err := cuda.Open(ordinal)
	if err != nil {
		return nil, nil, err
	}
	id, err := nccl.Bootstrap(ctx, env, nccl.GetUniqueID)
	if err != nil {
		d.Close()
		return nil, nil, err
	}
	unbind, err := d.Bind() // NCCL sets up on the current device
	if err != nil {
		d.Close()
		return nil, nil, err
	}
	c, err := nccl.InitRank(id, env.WorldSize, env.Rank)
	unbind()
	if err != nil {
		d.Close()
		return nil, nil, err
	}
	h := nccl.NewHostComm(c, d.NCCLMemory())
	worldDevice = d
	return h, func() {
		h.Close()
		c.Destroy()
		worldDevice = nil
		d.Close()
	}, nil
}
