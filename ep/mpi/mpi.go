//go:build mpi && cgo

// Package mpi implements ep.Comm over MPI (Open MPI; build tag mpi, needs
// libopenmpi-dev), one process per rank under mpirun.
//
// Every collective is a non-blocking MPI call polled against the context,
// so a rank that never arrives gives the others an error at the deadline;
// the communicator is broken afterwards (the request cannot be taken back)
// and later calls fail. Every call first agrees on a small header (which
// collective, which lengths) so that mismatched calls are reported as
// errors instead of corrupting buffers. MPI is called from one goroutine at
// a time (MPI_THREAD_SERIALIZED).
package mpi

/*
#cgo pkg-config: ompi-c
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>

static MPI_Comm world(void) { return MPI_COMM_WORLD; }
static void* in_place(void) { return MPI_IN_PLACE; }
static MPI_Datatype dt_byte(void) { return MPI_BYTE; }
static MPI_Datatype dt_int64(void) { return MPI_INT64_T; }
static MPI_Datatype dt_float(void) { return MPI_FLOAT; }
static MPI_Op op_sum(void) { return MPI_SUM; }
static MPI_Op op_min(void) { return MPI_MIN; }
static MPI_Op op_max(void) { return MPI_MAX; }
static MPI_Request* new_request(void) { MPI_Request* r = malloc(sizeof(MPI_Request)); *r = MPI_REQUEST_NULL; return r; }
static int test(MPI_Request* r, int* done) { return MPI_Test(r, done, MPI_STATUS_IGNORE); }
static int init_serialized(int* provided) {
	int inited = 0;
	MPI_Initialized(&inited);
	if (inited) { MPI_Query_thread(provided); return MPI_SUCCESS; }
	return MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, provided);
}
static int thread_serialized(void) { return MPI_THREAD_SERIALIZED; }
static void error_string(int code, char* buf) { int n = 0; MPI_Error_string(code, buf, &n); buf[n] = 0; }
static int max_error_string(void) { return MPI_MAX_ERROR_STRING; }
*/
import "C"

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/moex-project/moex/ep"
)

// Comm is MPI_COMM_WORLD as an ep.Comm.
type Comm struct {
	mu     sync.Mutex
	rank   int
	size   int
	broken error
}

var _ ep.Comm = (*Comm)(nil)

// World initialises MPI (once) and returns MPI_COMM_WORLD.
func World() (*Comm, error) {
	var provided C.int
	if rc := C.init_serialized(&provided); rc != C.MPI_SUCCESS {
		return nil, mpiError("MPI_Init_thread", rc)
	}
	if provided < C.thread_serialized() {
		return nil, fmt.Errorf("mpi: the library provides thread level %d, moex needs MPI_THREAD_SERIALIZED", int(provided))
	}
	var rank, size C.int
	C.MPI_Comm_rank(C.world(), &rank)
	C.MPI_Comm_size(C.world(), &size)
	return &Comm{rank: int(rank), size: int(size)}, nil
}

// Finalize shuts MPI down; after a broken collective it does nothing (a
// pending request would make it hang).
func (c *Comm) Finalize() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken != nil {
		return nil
	}
	if rc := C.MPI_Finalize(); rc != C.MPI_SUCCESS {
		return mpiError("MPI_Finalize", rc)
	}
	return nil
}

func (c *Comm) Rank() int { return c.rank }
func (c *Comm) Size() int { return c.size }

// Abort breaks this rank's communicator; the other processes learn of it
// when this one exits (mpirun ends the job) or at their deadline.
func (c *Comm) Abort(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken == nil {
		c.broken = fmt.Errorf("%w: %w", ep.ErrAborted, err)
	}
}

func mpiError(call string, rc C.int) error {
	buf := (*C.char)(C.malloc(C.size_t(C.max_error_string() + 1)))
	defer C.free(unsafe.Pointer(buf))
	C.error_string(rc, buf)
	return fmt.Errorf("mpi: %s: %s", call, C.GoString(buf))
}

// call runs one collective: start it (returning MPI's code), then poll the
// request until it completes or ctx ends. Buffers handed to MPI are pinned
// until the request completes; after a timeout they stay pinned for good.
func (c *Comm) call(ctx context.Context, what string, start func(req *C.MPI_Request) C.int, pins ...any) error {
	if c.broken != nil {
		return c.broken
	}
	var pinner runtime.Pinner
	for _, p := range pins {
		pinner.Pin(p)
	}
	req := C.new_request()
	if rc := start(req); rc != C.MPI_SUCCESS {
		pinner.Unpin()
		C.free(unsafe.Pointer(req))
		c.broken = mpiError(what, rc)
		return c.broken
	}
	delay := time.Microsecond
	for {
		var done C.int
		if rc := C.test(req, &done); rc != C.MPI_SUCCESS {
			c.broken = mpiError(what, rc)
			return c.broken
		}
		if done != 0 {
			pinner.Unpin()
			C.free(unsafe.Pointer(req))
			return nil
		}
		if err := ctx.Err(); err != nil {
			c.broken = fmt.Errorf("mpi: %s on rank %d: the other ranks did not arrive: %w", what, c.rank, err)
			return c.broken // the request, its buffers and their pins are leaked on purpose
		}
		time.Sleep(delay)
		delay = min(2*delay, 200*time.Microsecond)
	}
}

// agree all-reduces a header so that every rank sees the same collective
// and the same lengths, or every rank reports the mismatch.
func (c *Comm) agree(ctx context.Context, what string, kind int64, lengths ...int64) error {
	h := append([]int64{kind, -kind}, lengths...)
	for _, l := range lengths {
		h = append(h, -l)
	}
	mx := append([]int64(nil), h...)
	if err := c.allreduceInt64(ctx, what+" (header)", mx, C.op_max()); err != nil {
		return err
	}
	if mx[0] != kind || -mx[1] != kind {
		return c.fail(fmt.Errorf("mpi: %s on rank %d: the ranks called different collectives", what, c.rank))
	}
	n := len(lengths)
	for i := range lengths {
		if mx[2+i] != lengths[i] || -mx[2+n+i] != lengths[i] {
			return c.fail(fmt.Errorf("mpi: %s on rank %d: the ranks passed different lengths (this rank %v)", what, c.rank, lengths))
		}
	}
	return nil
}

func (c *Comm) fail(err error) error {
	c.broken = err
	return err
}

func (c *Comm) allreduceInt64(ctx context.Context, what string, v []int64, op C.MPI_Op) error {
	if len(v) == 0 {
		return nil
	}
	return c.call(ctx, what, func(req *C.MPI_Request) C.int {
		return C.MPI_Iallreduce(C.in_place(), unsafe.Pointer(&v[0]), C.int(len(v)), C.dt_int64(), op, C.world(), req)
	}, &v[0])
}

const (
	kindAllGather = iota + 1
	kindAllToAllV
	kindAllReduceInt64
	kindAllReduceFloat32
	kindReduceScatter
	kindBarrier
)

func (c *Comm) lock() func() { c.mu.Lock(); return c.mu.Unlock }

func (c *Comm) AllGather(ctx context.Context, send []byte) ([][]byte, error) {
	defer c.lock()()
	if err := c.agree(ctx, "AllGather", kindAllGather); err != nil {
		return nil, err
	}
	sizes := make([]int64, c.size)
	sizes[c.rank] = int64(len(send))
	if err := c.call(ctx, "AllGather sizes", func(req *C.MPI_Request) C.int {
		return C.MPI_Iallgather(C.in_place(), 0, C.dt_byte(), unsafe.Pointer(&sizes[0]), 1, C.dt_int64(), C.world(), req)
	}, &sizes[0]); err != nil {
		return nil, err
	}
	counts, displs, total, err := layout(sizes)
	if err != nil {
		return nil, c.fail(err)
	}
	recv := make([]byte, max(total, 1))
	sendBuf := send
	if len(sendBuf) == 0 {
		sendBuf = []byte{0}
	}
	if err := c.call(ctx, "AllGather", func(req *C.MPI_Request) C.int {
		return C.MPI_Iallgatherv(unsafe.Pointer(&sendBuf[0]), C.int(len(send)), C.dt_byte(), unsafe.Pointer(&recv[0]),
			&counts[0], &displs[0], C.dt_byte(), C.world(), req)
	}, &sendBuf[0], &recv[0], &counts[0], &displs[0]); err != nil {
		return nil, err
	}
	out := make([][]byte, c.size)
	for r := range out {
		out[r] = recv[displs[r] : displs[r]+counts[r] : displs[r]+counts[r]]
	}
	return out, nil
}

// layout turns byte sizes into MPI counts and displacements.
func layout(sizes []int64) (counts, displs []C.int, total int, err error) {
	counts = make([]C.int, len(sizes))
	displs = make([]C.int, len(sizes))
	for r, s := range sizes {
		if s < 0 || int64(total)+s > math.MaxInt32 {
			return nil, nil, 0, fmt.Errorf("mpi: message of %d bytes from rank %d is too large (2 GiB per collective)", s, r)
		}
		counts[r], displs[r] = C.int(s), C.int(total)
		total += int(s)
	}
	return counts, displs, total, nil
}

func (c *Comm) AllToAllV(ctx context.Context, send [][]byte) ([][]byte, error) {
	defer c.lock()()
	if len(send) != c.size {
		return nil, c.fail(fmt.Errorf("mpi: AllToAllV on rank %d: %d send buffers for %d ranks", c.rank, len(send), c.size))
	}
	if err := c.agree(ctx, "AllToAllV", kindAllToAllV); err != nil {
		return nil, err
	}
	sendSizes := make([]int64, c.size)
	for r, b := range send {
		sendSizes[r] = int64(len(b))
	}
	recvSizes := make([]int64, c.size)
	if err := c.call(ctx, "AllToAllV sizes", func(req *C.MPI_Request) C.int {
		return C.MPI_Ialltoall(unsafe.Pointer(&sendSizes[0]), 1, C.dt_int64(), unsafe.Pointer(&recvSizes[0]), 1, C.dt_int64(), C.world(), req)
	}, &sendSizes[0], &recvSizes[0]); err != nil {
		return nil, err
	}
	scounts, sdispls, stotal, err := layout(sendSizes)
	if err != nil {
		return nil, c.fail(err)
	}
	rcounts, rdispls, rtotal, err := layout(recvSizes)
	if err != nil {
		return nil, c.fail(err)
	}
	sbuf := make([]byte, max(stotal, 1))
	for r, b := range send {
		copy(sbuf[sdispls[r]:], b)
	}
	rbuf := make([]byte, max(rtotal, 1))
	if err := c.call(ctx, "AllToAllV", func(req *C.MPI_Request) C.int {
		return C.MPI_Ialltoallv(unsafe.Pointer(&sbuf[0]), &scounts[0], &sdispls[0], C.dt_byte(),
			unsafe.Pointer(&rbuf[0]), &rcounts[0], &rdispls[0], C.dt_byte(), C.world(), req)
	}, &sbuf[0], &scounts[0], &sdispls[0], &rbuf[0], &rcounts[0], &rdispls[0]); err != nil {
		return nil, err
	}
	out := make([][]byte, c.size)
	for r := range out {
		// Each part in its own allocation, so callers may view it as float32s.
		out[r] = append(make([]byte, 0, rcounts[r]), rbuf[rdispls[r]:rdispls[r]+rcounts[r]]...)
	}
	return out, nil
}

func opOf(op ep.Op) (C.MPI_Op, error) {
	switch op {
	case ep.Sum:
		return C.op_sum(), nil
	case ep.Min:
		return C.op_min(), nil
	case ep.Max:
		return C.op_max(), nil
	}
	return C.op_sum(), fmt.Errorf("mpi: unknown reduction %v", op)
}

func (c *Comm) AllReduceInt64(ctx context.Context, v []int64, op ep.Op) error {
	defer c.lock()()
	mop, err := opOf(op)
	if err != nil {
		return c.fail(err)
	}
	if err := c.agree(ctx, "AllReduceInt64", kindAllReduceInt64, int64(len(v)), int64(op)); err != nil {
		return err
	}
	return c.allreduceInt64(ctx, "AllReduceInt64", v, mop)
}

func (c *Comm) AllReduceFloat32(ctx context.Context, v []float32, op ep.Op) error {
	defer c.lock()()
	mop, err := opOf(op)
	if err != nil {
		return c.fail(err)
	}
	if err := c.agree(ctx, "AllReduceFloat32", kindAllReduceFloat32, int64(len(v)), int64(op)); err != nil {
		return err
	}
	if len(v) == 0 {
		return nil
	}
	return c.call(ctx, "AllReduceFloat32", func(req *C.MPI_Request) C.int {
		return C.MPI_Iallreduce(C.in_place(), unsafe.Pointer(&v[0]), C.int(len(v)), C.dt_float(), mop, C.world(), req)
	}, &v[0])
}

func (c *Comm) ReduceScatter(ctx context.Context, v []float32, counts []int) ([]float32, error) {
	defer c.lock()()
	if len(counts) != c.size {
		return nil, c.fail(fmt.Errorf("mpi: ReduceScatter: %d counts for %d ranks", len(counts), c.size))
	}
	total := 0
	hdr := []int64{int64(len(v))}
	ccounts := make([]C.int, c.size)
	for r, n := range counts {
		if n < 0 {
			return nil, c.fail(fmt.Errorf("mpi: ReduceScatter: negative count in %v", counts))
		}
		total += n
		hdr = append(hdr, int64(n))
		ccounts[r] = C.int(n)
	}
	if total != len(v) {
		return nil, c.fail(fmt.Errorf("mpi: ReduceScatter: counts %v add up to %d, the buffer holds %d", counts, total, len(v)))
	}
	if err := c.agree(ctx, "ReduceScatter", kindReduceScatter, hdr...); err != nil {
		return nil, err
	}
	out := make([]float32, max(counts[c.rank], 1))
	in := v
	if len(in) == 0 {
		in = []float32{0}
	}
	if err := c.call(ctx, "ReduceScatter", func(req *C.MPI_Request) C.int {
		return C.MPI_Ireduce_scatter(unsafe.Pointer(&in[0]), unsafe.Pointer(&out[0]), &ccounts[0], C.dt_float(), C.op_sum(), C.world(), req)
	}, &in[0], &out[0], &ccounts[0]); err != nil {
		return nil, err
	}
	return out[:counts[c.rank]], nil
}

func (c *Comm) Barrier(ctx context.Context) error {
	defer c.lock()()
	if err := c.agree(ctx, "Barrier", kindBarrier); err != nil {
		return err
	}
	return c.call(ctx, "Barrier", func(req *C.MPI_Request) C.int { return C.MPI_Ibarrier(C.world(), req) })
}
