//go:build cuda || cudaemu

package epgpu

import (
	"context"
	"errors"
	"fmt"
	"unsafe"

	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/ep"
)

// A DeviceComm is one rank's communicator over device buffers: gather
// mode's all-gather of the hidden states and reduce-scatter of the partial
// outputs, enqueued on the device's stream between the kernels (and so
// recorded into a graph with them, where the communicator allows). NCCLComm
// on GPUs; EmuComm on the emulation; StagedComm over any ep.Comm, staging
// through the host (eager only).
type DeviceComm interface {
	Rank() int
	Size() int
	// AllGather enqueues on l (the device, or a recorder of it): the first
	// bytes of every rank's send land in recv at rank·bytes. ctx bounds
	// what the enqueue waits for on the host.
	AllGather(ctx context.Context, l cuda.Launcher, send, recv cuda.Buffer, bytes int64) error
	// ReduceScatter enqueues on l: recv's count float32 are the sum over
	// the ranks of their send's part rank (send holds Size()·count).
	ReduceScatter(ctx context.Context, l cuda.Launcher, send, recv cuda.Buffer, count int) error
	// Wait waits for the collectives enqueued so far. At ctx's end (a peer
	// that does not arrive) it aborts the communicator and says why.
	Wait(ctx context.Context) error
	// Agree returns whether ok holds on every rank (a host-side
	// all-reduce): whether a graph holding collectives was captured on
	// every rank, since NCCL needs every rank to capture a collective, or
	// none to.
	Agree(ctx context.Context, ok bool) (bool, error)
}

// agree is Agree over a host communicator.
func agree(ctx context.Context, c ep.Comm, ok bool) (bool, error) {
	v := []int64{0}
	if ok {
		v[0] = 1
	}
	if err := c.AllReduceInt64(ctx, v, ep.Min); err != nil {
		return false, err
	}
	return v[0] == 1, nil
}

// errNotCapturable: the communicator's collectives cannot be in a graph.
var errNotCapturable = errors.New("cuda: this communicator's collectives stage through the host and cannot be captured in a graph")

func checkAllGather(c DeviceComm, send, recv cuda.Buffer, bytes int64) error {
	if bytes < 0 || send.Bytes < bytes || recv.Bytes < int64(c.Size())*bytes {
		return fmt.Errorf("cuda: all-gather of %d bytes from each of %d ranks: send holds %d bytes, recv %d",
			bytes, c.Size(), send.Bytes, recv.Bytes)
	}
	return nil
}

func checkReduceScatter(c DeviceComm, send, recv cuda.Buffer, count int) error {
	if count < 0 || send.Bytes < int64(c.Size()*count*4) || recv.Bytes < int64(count*4) {
		return fmt.Errorf("cuda: reduce-scatter of %d float32 to each of %d ranks: send holds %d bytes, recv %d",
			count, c.Size(), send.Bytes, recv.Bytes)
	}
	return nil
}

// StagedComm runs a DeviceComm's collectives over an ep.Comm (in-process
// ranks, MPI), copying through the host: for ranks without NCCL. It runs
// eagerly on its device only; a graph that holds its collectives fails to
// capture (and runs eagerly).
type StagedComm struct {
	dev cuda.Launcher
	c   ep.Comm
}

// NewStagedComm makes a DeviceComm of c on dev.
func NewStagedComm(dev cuda.Launcher, c ep.Comm) *StagedComm {
	return &StagedComm{dev: dev, c: c}
}

func (s *StagedComm) Rank() int { return s.c.Rank() }
func (s *StagedComm) Size() int { return s.c.Size() }

func (s *StagedComm) AllGather(ctx context.Context, l cuda.Launcher, send, recv cuda.Buffer, bytes int64) error {
	if err := checkAllGather(s, send, recv, bytes); err != nil {
		return err
	}
	if l != s.dev {
		return errNotCapturable
	}
	mine := make([]byte, bytes)
	if bytes > 0 {
		if err := s.dev.ToHost(unsafe.Pointer(&mine[0]), send, bytes); err != nil {
			return err
		}
	}
	parts, err := s.c.AllGather(ctx, mine)
	if err != nil {
		return err
	}
	all := make([]byte, 0, int64(len(parts))*bytes)
	for r, p := range parts {
		if int64(len(p)) != bytes {
			return fmt.Errorf("cuda: all-gather: rank %d sent %d bytes, want %d", r, len(p), bytes)
		}
		all = append(all, p...)
	}
	return cuda.CopyIn(s.dev, recv, all)
}

func (s *StagedComm) ReduceScatter(ctx context.Context, l cuda.Launcher, send, recv cuda.Buffer, count int) error {
	if err := checkReduceScatter(s, send, recv, count); err != nil {
		return err
	}
	if l != s.dev {
		return errNotCapturable
	}
	v := make([]float32, s.Size()*count)
	if err := cuda.Download(s.dev, send, v); err != nil {
		return err
	}
	counts := make([]int, s.Size())
	for r := range counts {
		counts[r] = count
	}
	mine, err := s.c.ReduceScatter(ctx, v, counts)
	if err != nil {
		return err
	}
	if len(mine) != count {
		return fmt.Errorf("cuda: reduce-scatter: %d values back, want %d", len(mine), count)
	}
	return cuda.CopyIn(s.dev, recv, mine)
}

// Wait: the staged collectives finished when they returned.
func (s *StagedComm) Wait(ctx context.Context) error { return nil }

func (s *StagedComm) Agree(ctx context.Context, ok bool) (bool, error) { return agree(ctx, s.c, ok) }
