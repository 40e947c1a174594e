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
	"github.com/moex-project/moex/ep/epgpu"
	"github.com/moex-project/moex/ep/ncclcomm"
)

// deviceName says where --backend cuda runs.
const deviceName = "the GPU"

// worldDevice is the GPU of this process's NCCL rank, once joined, and
// worldNCCL its communicator.
var (
	worldDevice *cuda.Device
	worldNCCL   *nccl.Comm
)

// deviceComm carries gather mode's hidden states between the ranks'
// devices: NCCL on the device buffers when this process is an NCCL rank,
// else comm staged through the host (ranks sharing a GPU, MPI without
// NCCL; such steps are not captured in graphs).
func deviceComm(d cuda.Launcher, comm ep.Comm) epgpu.DeviceComm {
	if dev, ok := d.(*cuda.Device); ok && dev == worldDevice && worldNCCL != nil {
		return epgpu.NewNCCLComm(dev, worldNCCL, comm)
	}
	return epgpu.NewStagedComm(d, comm)
}

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

// ncclWorld joins the NCCL group of this process's rank and returns ep.Comm
// over it (host bytes staged through the rank's GPU) and the group for the
// coordinator. Under mpirun (an MPI build), MPI numbers the ranks, carries
// the unique id and is the coordinator's CPU group; otherwise torchrun's
// MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE do, the id travels over TCP
// from rank 0 and the coordinator shares the NCCL group. LOCAL_RANK (or
// OMPI_COMM_WORLD_LOCAL_RANK) picks the GPU, else the rank modulo the GPUs.
func ncclWorld(ctx context.Context) (ep.Comm, ep.Comm, func(), error) {
	var plan ep.Comm
	closePlan := func() {}
	var rank, world int
	var bootstrap func() (nccl.UniqueID, error)
	local := os.Getenv("LOCAL_RANK")
	if os.Getenv("OMPI_COMM_WORLD_SIZE") != "" {
		c, closeMPI, err := mpiWorld()
		if err != nil {
			return nil, nil, nil, err
		}
		plan, closePlan = c, closeMPI
		rank, world = c.Rank(), c.Size()
		bootstrap = func() (nccl.UniqueID, error) { return nccl.BootstrapOver(ctx, c, nccl.GetUniqueID) }
		local = os.Getenv("OMPI_COMM_WORLD_LOCAL_RANK")
	} else {
		env, err := nccl.EnvFromOS()
		if err != nil {
			return nil, nil, nil, err
		}
		rank, world = env.Rank, env.WorldSize
		bootstrap = func() (nccl.UniqueID, error) { return nccl.Bootstrap(ctx, env, nccl.GetUniqueID) }
	}
	fail := func(err error) (ep.Comm, ep.Comm, func(), error) {
		closePlan()
		return nil, nil, nil, err
	}
	if err := nccl.Load(nccl.DefaultLibrary); err != nil {
		return fail(err)
	}
	count, err := cuda.Count()
	if err != nil || count == 0 {
		return fail(fmt.Errorf("run: no GPU for NCCL rank %d: %v", rank, err))
	}
	ordinal := rank % count
	if local != "" {
		// Modulo the GPUs this process sees: launchers that give each process
		// one GPU (CUDA_VISIBLE_DEVICES) still set LOCAL_RANK.
		if ordinal, err = strconv.Atoi(local); err != nil || ordinal < 0 {
			return fail(fmt.Errorf("run: local rank %q is not a non-negative integer", local))
		}
		ordinal %= count
	}
	d, err := cuda.Open(ordinal)
	if err != nil {
		return fail(err)
	}
	id, err := bootstrap()
	if err != nil {
		d.Close()
		return fail(err)
	}
	// NCCL sets up on the device current on the thread that calls it; a rank
	// that never joins ends the init at the deadline.
	c, err := nccl.InitRankContext(ctx, id, world, rank, d.Bind)
	if err != nil {
		d.Close()
		return fail(err)
	}
	h := ncclcomm.NewHostComm(c, d.NCCLMemory())
	if plan == nil {
		plan = h
	}
	worldDevice, worldNCCL = d, c
	return h, plan, func() {
		h.Close()
		c.Close()
		worldDevice, worldNCCL = nil, nil
		d.Close()
		closePlan()
	}, nil
}
