//go:build cgo

package ncclcomm

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"sync"

	"github.com/moex-project/moex/bindings/nccl"
	"github.com/moex-project/moex/ep"
)

// Collectives is what HostComm needs of a communicator: *nccl.Comm's
// collectives on device addresses, its wait and its abort.
type Collectives interface {
	Rank() int
	Size() int
	AllReduce(send, recv uintptr, count int, dt nccl.DType, op nccl.RedOp, stream uintptr) error
	AllGather(send, recv uintptr, count int, dt nccl.DType, stream uintptr) error
	ReduceScatter(send, recv uintptr, count int, dt nccl.DType, op nccl.RedOp, stream uintptr) error
	AllToAllV(send uintptr, sendCounts, sendOffsets []int, recv uintptr, recvCounts, recvOffsets []int,
		dt nccl.DType, elemBytes int, stream uintptr) error
	Await(ctx context.Context, done func() (bool, error)) error
	Abort() error
}

var _ Collectives = (*nccl.Comm)(nil)

// Memory is the device side of HostComm: memory for its staging buffers,
// copies, and the stream the collectives run on.
type Memory interface {
	Alloc(bytes int) (uintptr, error)
	Free(addr uintptr)
	ToDevice(dst uintptr, src []byte) error
	ToHost(dst []byte, src uintptr) error
	Stream() uintptr
	// Enqueue runs f, which enqueues NCCL work, with the device current on
	// the calling thread.
	Enqueue(f func() error) error
	// Done reports whether the stream's work has finished.
	Done() (bool, error)
}

// HostComm is ep.Comm over NCCL: host bytes staged through two device
// buffers (grown as needed, kept between calls), each collective awaited
// against the context. All-to-all is one group of ncclSend/ncclRecv after an
// all-to-all of the counts; the variable all-gather gathers the sizes, then
// pads every rank's part to the largest; reduce-scatter pads every segment
// to the largest count. When a peer does not arrive by the context's
// deadline, the communicator is aborted (NCCL's way out) and every later
// call fails with ep.ErrAborted.
type HostComm struct {
	c Collectives
	m Memory

	mu         sync.Mutex
	err        error
	send, recv staging
}

type staging struct {
	addr uintptr
	size int
}

// NewHostComm makes an ep.Comm of c, staging through m.
func NewHostComm(c Collectives, m Memory) *HostComm { return &HostComm{c: c, m: m} }

var _ ep.Comm = (*HostComm)(nil)

func (h *HostComm) Rank() int { return h.c.Rank() }
func (h *HostComm) Size() int { return h.c.Size() }

// Close frees the staging buffers (not the communicator); a second Close
// does nothing.
func (h *HostComm) Close() error {
	for _, s := range []*staging{&h.send, &h.recv} {
		if s.size > 0 {
			h.m.Free(s.addr)
			*s = staging{}
		}
	}
	return nil
}

func (h *HostComm) grow(s *staging, bytes int) error {
	if bytes <= s.size {
		return nil
	}
	if s.size > 0 {
		h.m.Free(s.addr)
		*s = staging{}
	}
	a, err := h.m.Alloc(bytes + bytes/4)
	if err != nil {
		return err
	}
	*s = staging{addr: a, size: bytes + bytes/4}
	return nil
}

// run stages in (copied to the send buffer), runs the collective over the
// device buffers, awaits it and returns the first out bytes of the receive
// buffer.
func (h *HostComm) run(ctx context.Context, name string, in []byte, out int, call func(send, recv uintptr) error) ([]byte, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err != nil {
		return nil, h.err
	}
	if err := h.grow(&h.send, max(1, len(in))); err != nil {
		return nil, err
	}
	if err := h.grow(&h.recv, max(1, out)); err != nil {
		return nil, err
	}
	if len(in) > 0 {
		if err := h.m.ToDevice(h.send.addr, in); err != nil {
			return nil, err
		}
	}
	if err := h.m.Enqueue(func() error { return call(h.send.addr, h.recv.addr) }); err != nil {
		return nil, h.fail(fmt.Errorf("nccl: %s: %w", name, err))
	}
	if err := h.c.Await(ctx, h.m.Done); err != nil {
		// Await aborted the communicator.
		h.err = fmt.Errorf("%w: rank %d: %s: %v", ep.ErrAborted, h.c.Rank(), name, err)
		return nil, h.err
	}
	res := make([]byte, out)
	if out > 0 {
		if err := h.m.ToHost(res, h.recv.addr); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// fail aborts the communicator after an error; h.mu is held.
func (h *HostComm) fail(err error) error {
	h.c.Abort()
	h.err = fmt.Errorf("%w: %v", ep.ErrAborted, err)
	return err
}

// Abort breaks the group: the communicator is aborted and every later call
// fails with err.
func (h *HostComm) Abort(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err == nil {
		h.c.Abort()
		h.err = fmt.Errorf("%w: %v", ep.ErrAborted, err)
	}
}

// AllGather returns every rank's send, indexed by rank.
func (h *HostComm) AllGather(ctx context.Context, send []byte) ([][]byte, error) {
	R := h.Size()
	st := h.m.Stream()
	sizes, err := h.run(ctx, "all-gather (sizes)", binary.LittleEndian.AppendUint64(nil, uint64(len(send))), 8*R,
		func(s, r uintptr) error { return h.c.AllGather(s, r, 1, nccl.Int64, st) })
	if err != nil {
		return nil, err
	}
	n := make([]int, R)
	most := 0
	for i := range n {
		n[i] = int(binary.LittleEndian.Uint64(sizes[8*i:]))
		most = max(most, n[i])
	}
	out := make([][]byte, R)
	if most == 0 {
		for i := range out {
			out[i] = []byte{}
		}
		return out, nil
	}
	padded := make([]byte, most)
	copy(padded, send)
	all, err := h.run(ctx, "all-gather", padded, most*R, func(s, r uintptr) error { return h.c.AllGather(s, r, most, nccl.Int8, st) })
	if err != nil {
		return nil, err
	}
	for i := range out {
		out[i] = all[i*most : i*most+n[i] : i*most+n[i]]
	}
	return out, nil
}

// AllToAllV sends send[r] to rank r and returns what each rank sent here.
func (h *HostComm) AllToAllV(ctx context.Context, send [][]byte) ([][]byte, error) {
	R := h.Size()
	if len(send) != R {
		return nil, fmt.Errorf("nccl: all-to-all of %d parts among %d ranks", len(send), R)
	}
	st := h.m.Stream()
	counts := make([]byte, 0, 8*R)
	ones, offs := make([]int, R), make([]int, R)
	for r, b := range send {
		counts = binary.LittleEndian.AppendUint64(counts, uint64(len(b)))
		ones[r], offs[r] = 1, r
	}
	got, err := h.run(ctx, "all-to-all (counts)", counts, 8*R,
		func(s, r uintptr) error { return h.c.AllToAllV(s, ones, offs, r, ones, offs, nccl.Int64, 8, st) })
	if err != nil {
		return nil, err
	}
	sendCounts, sendOffs := make([]int, R), make([]int, R)
	recvCounts, recvOffs := make([]int, R), make([]int, R)
	var flat []byte
	total := 0
	for r := range send {
		sendCounts[r], sendOffs[r] = len(send[r]), len(flat)
		flat = append(flat, send[r]...)
		recvCounts[r], recvOffs[r] = int(binary.LittleEndian.Uint64(got[8*r:])), total
		total += recvCounts[r]
	}
	all, err := h.run(ctx, "all-to-all", flat, total, func(s, r uintptr) error {
		return h.c.AllToAllV(s, sendCounts, sendOffs, r, recvCounts, recvOffs, nccl.Int8, 1, st)
	})
	if err != nil {
		return nil, err
	}
	out := make([][]byte, R)
	for r := range out {
		out[r] = all[recvOffs[r] : recvOffs[r]+recvCounts[r] : recvOffs[r]+recvCounts[r]]
	}
	return out, nil
}

func redOp(op ep.Op) (nccl.RedOp, error) {
	switch op {
	case ep.Sum:
		return nccl.Sum, nil
	case ep.Min:
		return nccl.Min, nil
	case ep.Max:
		return nccl.Max, nil
	}
	return 0, fmt.Errorf("nccl: reduction %v", op)
}

// AllReduceInt64 reduces v element-wise over the ranks, in place.
func (h *HostComm) AllReduceInt64(ctx context.Context, v []int64, op ep.Op) error {
	o, err := redOp(op)
	if err != nil {
		return err
	}
	st := h.m.Stream()
	res, err := h.run(ctx, "all-reduce", ep.Bytes(v), 8*len(v), func(s, r uintptr) error { return h.c.AllReduce(s, r, len(v), nccl.Int64, o, st) })
	if err != nil {
		return err
	}
	for i := range v {
		v[i] = int64(binary.LittleEndian.Uint64(res[8*i:]))
	}
	return nil
}

// AllReduceFloat32 reduces v element-wise over the ranks, in place.
func (h *HostComm) AllReduceFloat32(ctx context.Context, v []float32, op ep.Op) error {
	o, err := redOp(op)
	if err != nil {
		return err
	}
	st := h.m.Stream()
	res, err := h.run(ctx, "all-reduce", ep.Bytes(v), 4*len(v), func(s, r uintptr) error { return h.c.AllReduce(s, r, len(v), nccl.Float32, o, st) })
	if err != nil {
		return err
	}
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(res[4*i:]))
	}
	return nil
}

// ReduceScatter sums v over the ranks and returns this rank's segment of
// counts[rank] values; every segment is padded to the largest count.
func (h *HostComm) ReduceScatter(ctx context.Context, v []float32, counts []int) ([]float32, error) {
	R := h.Size()
	if len(counts) != R {
		return nil, fmt.Errorf("nccl: reduce-scatter with %d counts among %d ranks", len(counts), R)
	}
	most, total := 0, 0
	for _, c := range counts {
		if c < 0 {
			return nil, fmt.Errorf("nccl: reduce-scatter count %d", c)
		}
		most, total = max(most, c), total+c
	}
	if total != len(v) {
		return nil, fmt.Errorf("nccl: reduce-scatter counts add up to %d, not the %d values", total, len(v))
	}
	padded := make([]float32, most*R)
	off := 0
	for r, c := range counts {
		copy(padded[r*most:], v[off:off+c])
		off += c
	}
	st := h.m.Stream()
	res, err := h.run(ctx, "reduce-scatter", ep.Bytes(padded), 4*most, func(s, r uintptr) error {
		return h.c.ReduceScatter(s, r, most, nccl.Float32, nccl.Sum, st)
	})
	if err != nil {
		return nil, err
	}
	out := make([]float32, counts[h.Rank()])
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(res[4*i:]))
	}
	return out, nil
}

// Barrier returns when every rank has called it.
func (h *HostComm) Barrier(ctx context.Context) error {
	return h.AllReduceInt64(ctx, []int64{0}, ep.Sum)
}
