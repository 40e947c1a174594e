//go:build cgo

package ncclcomm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/bindings/nccl"
	"github.com/moex-project/moex/ep"
	"github.com/moex-project/moex/ep/eptest"
)

// fakeHub stands in for NCCL and the GPUs behind HostComm: ranks in one
// process, "device" memory on the host, collectives matched by their order
// on each rank and carried out when the last rank has enqueued its part,
// completion reported asynchronously, as a stream would.
type fakeHub struct {
	mu      sync.Mutex
	n       int
	next    uintptr
	mem     map[uintptr][]byte
	ops     [][]*fakeOp // [generation][rank]
	seq     []int       // ops enqueued per rank
	done    int         // generations carried out
	aborted []bool
	err     error
}

type fakeOp struct {
	kind           string
	send, recv     uintptr
	count, elem    int
	op             nccl.RedOp
	sc, so, rc, ro []int
	dt             nccl.DType
}

func newFakeHub(n int) *fakeHub {
	return &fakeHub{n: n, next: 0x1000, mem: map[uintptr][]byte{}, seq: make([]int, n), aborted: make([]bool, n)}
}

func (h *fakeHub) enqueue(rank int, op *fakeOp) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.aborted[rank] {
		return errors.New("fake nccl: communicator aborted")
	}
	g := h.seq[rank]
	h.seq[rank]++
	for len(h.ops) <= g {
		h.ops = append(h.ops, make([]*fakeOp, h.n))
	}
	h.ops[g][rank] = op
	for _, o := range h.ops[g] {
		if o == nil {
			return nil
		}
	}
	if err := h.carryOut(h.ops[g]); err != nil && h.err == nil {
		h.err = err
	}
	h.done = g + 1
	return nil
}

func elemSize(dt nccl.DType) int {
	switch dt {
	case nccl.Int64:
		return 8
	case nccl.Float32, nccl.Int32:
		return 4
	}
	return 1
}

func (h *fakeHub) carryOut(ops []*fakeOp) error {
	k := ops[0].kind
	for _, o := range ops {
		if o.kind != k {
			return fmt.Errorf("fake nccl: %s matched with %s", k, o.kind)
		}
	}
	es := elemSize(ops[0].dt)
	get := func(a uintptr, off, n int) []byte { return h.mem[a][off : off+n] }
	switch k {
	case "allreduce":
		n := ops[0].count
		res := make([]byte, n*es)
		for i := 0; i < n; i++ {
			var acc float64
			for r, o := range ops {
				b := get(o.send, i*es, es)
				var v float64
				if ops[0].dt == nccl.Int64 {
					v = float64(int64(binary.LittleEndian.Uint64(b)))
				} else {
					v = float64(math.Float32frombits(binary.LittleEndian.Uint32(b)))
				}
				switch {
				case r == 0:
					acc = v
				case o.op == nccl.Sum:
					acc += v
				case o.op == nccl.Max:
					acc = max(acc, v)
				case o.op == nccl.Min:
					acc = min(acc, v)
				}
			}
			if ops[0].dt == nccl.Int64 {
				binary.LittleEndian.PutUint64(res[i*es:], uint64(int64(acc)))
			} else {
				binary.LittleEndian.PutUint32(res[i*es:], math.Float32bits(float32(acc)))
			}
		}
		for _, o := range ops {
			copy(get(o.recv, 0, len(res)), res)
		}
	case "allgather":
		n := ops[0].count * es
		for _, o := range ops {
			for s, so := range ops {
				copy(get(o.recv, s*n, n), get(so.send, 0, n))
			}
		}
	case "reducescatter":
		n := ops[0].count
		for r, o := range ops {
			for i := 0; i < n; i++ {
				var acc float32
				for _, so := range ops {
					acc += math.Float32frombits(binary.LittleEndian.Uint32(get(so.send, (r*n+i)*4, 4)))
				}
				binary.LittleEndian.PutUint32(get(o.recv, i*4, 4), math.Float32bits(acc))
			}
		}
	case "alltoall":
		for s, so := range ops {
			for d, do := range ops {
				if so.sc[d] != do.rc[s] {
					return fmt.Errorf("fake nccl: rank %d sends %d elements to rank %d, which expects %d", s, so.sc[d], d, do.rc[s])
				}
				n := so.sc[d] * so.elem
				copy(get(do.recv, do.ro[s]*do.elem, n), get(so.send, so.so[d]*so.elem, n))
			}
		}
	}
	return nil
}

// fakeRank is one rank's communicator and device memory.
type fakeRank struct {
	h    *fakeHub
	rank int
}

func (f *fakeRank) Rank() int { return f.rank }
func (f *fakeRank) Size() int { return f.h.n }
func (f *fakeRank) AllReduce(send, recv uintptr, count int, dt nccl.DType, op nccl.RedOp, _ uintptr) error {
	return f.h.enqueue(f.rank, &fakeOp{kind: "allreduce", send: send, recv: recv, count: count, dt: dt, op: op})
}
func (f *fakeRank) AllGather(send, recv uintptr, count int, dt nccl.DType, _ uintptr) error {
	return f.h.enqueue(f.rank, &fakeOp{kind: "allgather", send: send, recv: recv, count: count, dt: dt})
}
func (f *fakeRank) ReduceScatter(send, recv uintptr, count int, dt nccl.DType, op nccl.RedOp, _ uintptr) error {
	return f.h.enqueue(f.rank, &fakeOp{kind: "reducescatter", send: send, recv: recv, count: count, dt: dt, op: op})
}
func (f *fakeRank) AllToAllV(send uintptr, sc, so []int, recv uintptr, rc, ro []int, dt nccl.DType, elem int, _ uintptr) error {
	return f.h.enqueue(f.rank, &fakeOp{kind: "alltoall", send: send, recv: recv, sc: sc, so: so, rc: rc, ro: ro, dt: dt, elem: elem})
}
func (f *fakeRank) Abort() error {
	f.h.mu.Lock()
	f.h.aborted[f.rank] = true
	f.h.mu.Unlock()
	return nil
}

// Await is nccl.Comm.Await's loop over the fake: completion, or abort at the
// context's end.
func (f *fakeRank) Await(ctx context.Context, done func() (bool, error)) error {
	for {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		select {
		case <-ctx.Done():
			f.Abort()
			return fmt.Errorf("fake nccl: rank %d: collective not finished: %w; communicator aborted", f.rank, context.Cause(ctx))
		case <-time.After(20 * time.Microsecond):
		}
	}
}

func (f *fakeRank) Alloc(bytes int) (uintptr, error) {
	f.h.mu.Lock()
	defer f.h.mu.Unlock()
	a := f.h.next
	f.h.next += uintptr(bytes+63) &^ 63
	f.h.mem[a] = make([]byte, bytes)
	return a, nil
}
func (f *fakeRank) Free(addr uintptr) {
	f.h.mu.Lock()
	delete(f.h.mem, addr)
	f.h.mu.Unlock()
}
func (f *fakeRank) ToDevice(dst uintptr, src []byte) error {
	f.h.mu.Lock()
	defer f.h.mu.Unlock()
	copy(f.h.mem[dst], src)
	return nil
}
func (f *fakeRank) ToHost(dst []byte, src uintptr) error {
	f.h.mu.Lock()
	defer f.h.mu.Unlock()
	copy(dst, f.h.mem[src])
	return nil
}
func (f *fakeRank) Stream() uintptr               { return 0 }
func (f *fakeRank) Enqueue(fn func() error) error { return fn() }
func (f *fakeRank) Done() (bool, error) {
	f.h.mu.Lock()
	defer f.h.mu.Unlock()
	return f.h.seq[f.rank] <= f.h.done, f.h.err
}

func hostRanks(n int, f func(c ep.Comm) error) []error {
	h := newFakeHub(n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		wg.Go(func() {
			fr := &fakeRank{h: h, rank: r}
			c := NewHostComm(fr, fr)
			defer c.Close()
			errs[r] = f(c)
		})
	}
	wg.Wait()
	return errs
}

// TestHostCommCollectives runs the ep.Comm conformance suite over HostComm
// with the fake NCCL.
func TestHostCommCollectives(t *testing.T) {
	for _, n := range []int{1, 3, 4} {
		eptest.Collectives(t, n, hostRanks)
	}
}

// TestHostCommMissingRank: a rank that never joins leaves the others
// failing at their deadline, the communicator aborted, later calls refused.
func TestHostCommMissingRank(t *testing.T) {
	errs := hostRanks(3, func(c ep.Comm) error {
		if c.Rank() == 2 {
			return nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err := c.AllGather(ctx, []byte{1, 2})
		if err == nil {
			return errors.New("the all-gather finished without rank 2")
		}
		if !errors.Is(err, ep.ErrAborted) {
			return fmt.Errorf("not an abort: %w", err)
		}
		if err2 := c.Barrier(context.Background()); !errors.Is(err2, ep.ErrAborted) {
			return fmt.Errorf("a call after the abort: %v", err2)
		}
		return nil
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
}

func TestHostCommBadArguments(t *testing.T) {
	errs := hostRanks(2, func(c ep.Comm) error {
		ctx := context.Background()
		if _, err := c.AllToAllV(ctx, make([][]byte, 3)); err == nil {
			return errors.New("3 parts among 2 ranks accepted")
		}
		if _, err := c.ReduceScatter(ctx, make([]float32, 5), []int{2, 2}); err == nil {
			return errors.New("counts not adding up accepted")
		}
		return nil
	})
	for _, err := range errs {
		require.NoError(t, err)
	}
}
