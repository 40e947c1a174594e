//go:build cuda

package epgpu

import (
	"context"

	"github.com/moex-project/moex/bindings/nccl"
	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/ep"
)

// NCCLComm is a DeviceComm over an NCCL communicator on this device: its
// collectives go on the stream they are given (the legacy default stream,
// or a capture's stream, so graphs hold them). On a non-blocking
// communicator each call is followed by a wait for NCCL to queue it, which
// is what a capture may wait for (an error there does not abort inside the
// capture: Wait or the next eager call does).
type NCCLComm struct {
	d    *cuda.Device
	c    *nccl.Comm
	host ep.Comm
}

// NewNCCLComm makes a DeviceComm of c on d; host (an ep.Comm of the same
// ranks: the coordinator's group, or ncclcomm.HostComm over c) carries
// Agree.
func NewNCCLComm(d *cuda.Device, c *nccl.Comm, host ep.Comm) *NCCLComm {
	return &NCCLComm{d: d, c: c, host: host}
}

// queued waits (under ctx) for NCCL to queue the call just made on stream:
// aborting on an error when eager (the legacy stream, 0), not inside a
// capture.
func (n *NCCLComm) queued(ctx context.Context, stream uintptr) error {
	if stream != 0 {
		return n.c.WaitQueued(ctx)
	}
	return n.c.Queued(ctx)
}

func (n *NCCLComm) Agree(ctx context.Context, ok bool) (bool, error) { return agree(ctx, n.host, ok) }

func (n *NCCLComm) Rank() int { return n.c.Rank() }
func (n *NCCLComm) Size() int { return n.c.Size() }

func (n *NCCLComm) AllGather(ctx context.Context, l cuda.Launcher, send, recv cuda.Buffer, bytes int64) error {
	if err := checkAllGather(n, send, recv, bytes); err != nil {
		return err
	}
	return l.Collective(ctx, "ncclAllGather", func(ctx context.Context, stream uintptr) error {
		if err := n.c.AllGather(send.Addr(), recv.Addr(), int(bytes), nccl.Int8, stream); err != nil {
			return err
		}
		return n.queued(ctx, stream)
	})
}

func (n *NCCLComm) ReduceScatter(ctx context.Context, l cuda.Launcher, send, recv cuda.Buffer, count int) error {
	if err := checkReduceScatter(n, send, recv, count); err != nil {
		return err
	}
	return l.Collective(ctx, "ncclReduceScatter", func(ctx context.Context, stream uintptr) error {
		if err := n.c.ReduceScatter(send.Addr(), recv.Addr(), count, nccl.Float32, nccl.Sum, stream); err != nil {
			return err
		}
		return n.queued(ctx, stream)
	})
}

// Wait waits for the default stream's work, the collectives included, and
// aborts the communicator at ctx's end.
func (n *NCCLComm) Wait(ctx context.Context) error {
	return n.c.Await(ctx, n.d.NCCLMemory().Done)
}
