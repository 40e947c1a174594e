//go:build cgo

package nccl

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

// ErrLibraryNotFound: libnccl.so.2 (or the path given) could not be loaded.
var ErrLibraryNotFound = errors.New("nccl: library not found")

// DefaultLibrary is the library Load opens without a path.
const DefaultLibrary = "libnccl.so.2"

var (
	loadMu   sync.Mutex
	loaded   string
	loadErr  error
	attempts = map[string]error{}
)

// Load opens the NCCL library at path (DefaultLibrary when empty) with
// dlopen; the first successful load is kept for the process. Without the
// library it returns an error wrapping ErrLibraryNotFound.
func Load(path string) error {
	if path == "" {
		path = DefaultLibrary
	}
	loadMu.Lock()
	defer loadMu.Unlock()
	if loaded != "" {
		if loaded == path {
			return nil
		}
		return fmt.Errorf("nccl: %s is already loaded; cannot load %s too", loaded, path)
	}
	if err, ok := attempts[path]; ok {
		return err
	}
	// dlerror's message is per thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var msg [512]C.char
	if C.moex_nccl_open(cpath, &msg[0], C.size_t(len(msg))) != 0 {
		loadErr = fmt.Errorf("%w: %s", ErrLibraryNotFound, C.GoString(&msg[0]))
		attempts[path] = loadErr
		return loadErr
	}
	loaded = path
	return nil
}

func ensure() error {
	loadMu.Lock()
	ok := loaded != ""
	loadMu.Unlock()
	if ok {
		return nil
	}
	return Load("")
}

// resultError turns an ncclResult_t into an error carrying NCCL's string.
func resultError(call string, r C.int) error {
	if r == 0 {
		return nil
	}
	return fmt.Errorf("nccl: %s: %s (ncclResult %d)", call, C.GoString(C.moex_nccl_error_string(r)), int(r))
}

// GetUniqueID makes a new communicator id (rank 0 calls it).
func GetUniqueID() (UniqueID, error) {
	if err := ensure(); err != nil {
		return UniqueID{}, err
	}
	var id C.moexNcclUniqueId
	if err := resultError("ncclGetUniqueId", C.moex_nccl_get_unique_id(&id)); err != nil {
		return UniqueID{}, err
	}
	var out UniqueID
	copy(out[:], unsafe.Slice((*byte)(unsafe.Pointer(&id.internal[0])), UniqueIDBytes))
	return out, nil
}

// Comm is an NCCL communicator. Buffers are device addresses; streams are
// cudaStream_t values (0: the default stream).
type Comm struct {
	c           C.moexNcclComm
	rank, size  int
	aborted     bool // ncclCommAbort freed c: Close and Abort do nothing more
	closed      bool // ncclCommDestroy freed c
	nonblocking bool // made by InitRankContext: calls may return ncclInProgress
}

// inProgress is ncclInProgress.
const inProgress = C.MOEX_NCCL_IN_PROGRESS

// DType is an NCCL data type.
type DType int

// Data types.
const (
	Int8     DType = C.MOEX_NCCL_INT8
	Int32    DType = C.MOEX_NCCL_INT32
	Int64    DType = C.MOEX_NCCL_INT64
	Float16  DType = C.MOEX_NCCL_FLOAT16
	Float32  DType = C.MOEX_NCCL_FLOAT32
	BFloat16 DType = C.MOEX_NCCL_BFLOAT16
)

// RedOp is an NCCL reduction.
type RedOp int

// Reductions.
const (
	Sum RedOp = C.MOEX_NCCL_SUM
	Max RedOp = C.MOEX_NCCL_MAX
	Min RedOp = C.MOEX_NCCL_MIN
)

// initArgs loads the library, checks rank and size and gives id as C's.
func initArgs(id UniqueID, size, rank int) (C.moexNcclUniqueId, error) {
	var cid C.moexNcclUniqueId
	if err := ensure(); err != nil {
		return cid, err
	}
	if size < 1 || rank < 0 || rank >= size {
		return cid, fmt.Errorf("nccl: rank %d of %d", rank, size)
	}
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&cid.internal[0])), UniqueIDBytes), id[:])
	return cid, nil
}

// InitRank joins the communicator of id as rank of size ranks.
func InitRank(id UniqueID, size, rank int) (*Comm, error) {
	cid, err := initArgs(id, size, rank)
	if err != nil {
		return nil, err
	}
	var c C.moexNcclComm
	if err := resultError("ncclCommInitRank", C.moex_nccl_comm_init_rank(&c, C.int(size), cid, C.int(rank))); err != nil {
		return nil, err
	}
	return &Comm{c: c, rank: rank, size: size}, nil
}

// InitRankContext joins the communicator of id as rank of size ranks like
// InitRank, but gives up when ctx ends before every rank has joined (a
// peer that died before init): the communicator is made non-blocking
// (ncclCommInitRankConfig, NCCL ≥ 2.14), its forming is polled, and on
// ctx's end it is aborted and the error names the rank and the cause.
// With an older library the blocking init runs on a thread of its own,
// which stays blocked after a timeout until the process exits.
//
// bind (nil: none) makes the rank's GPU current on the calling thread and
// returns the undo; NCCL takes its device from the thread that calls it.
//
// Calls on a non-blocking communicator may return before NCCL has queued
// their work (ncclInProgress): follow each one with Await before the next
// NCCL call, as HostComm does.
func InitRankContext(ctx context.Context, id UniqueID, size, rank int, bind func() (func(), error)) (*Comm, error) {
	cid, err := initArgs(id, size, rank)
	if err != nil {
		return nil, err
	}
	if bind == nil {
		bind = func() (func(), error) { return func() {}, nil }
	}
	runtime.LockOSThread()
	unbind, err := bind()
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	var c C.moexNcclComm
	r := C.moex_nccl_comm_init_rank_config(&c, C.int(size), cid, C.int(rank), 0)
	unbind()
	runtime.UnlockOSThread()
	if r == C.MOEX_NCCL_NO_CONFIG {
		return initRankThread(ctx, id, size, rank, bind)
	}
	comm := &Comm{c: c, rank: rank, size: size, nonblocking: true}
	if r != 0 && r != inProgress {
		err := resultError("ncclCommInitRankConfig", r)
		if c != nil {
			return nil, comm.abortWith(err)
		}
		return nil, err
	}
	notFormed := func(cause error) error {
		return fmt.Errorf("nccl: rank %d of %d: communicator not formed: %w", rank, size, cause)
	}
	err = poll(ctx, func() (bool, error) {
		state, err := comm.asyncState()
		switch {
		case err != nil:
			return false, err
		case state == inProgress:
			return false, nil
		}
		return true, resultError("ncclCommInitRankConfig", state)
	})
	if err != nil {
		if ctx.Err() != nil {
			err = notFormed(context.Cause(ctx))
		}
		return nil, comm.abortWith(err)
	}
	return comm, nil
}

// initRankThread is InitRankContext over a library without
// ncclCommInitRankConfig.
func initRankThread(ctx context.Context, id UniqueID, size, rank int, bind func() (func(), error)) (*Comm, error) {
	type result struct {
		c   *Comm
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		unbind, err := bind()
		if err != nil {
			done <- result{nil, err}
			return
		}
		c, err := InitRank(id, size, rank)
		unbind() // before the answer: the caller may look at the thread's state at once
		done <- result{c, err}
	}()
	select {
	case r := <-done:
		return r.c, r.err
	case <-ctx.Done():
		go func() { // a communicator formed too late is not used
			if r := <-done; r.c != nil {
				r.c.Close()
			}
		}()
		return nil, fmt.Errorf("nccl: rank %d of %d: communicator not formed (this NCCL cannot abort an init; its thread stays blocked): %w",
			rank, size, context.Cause(ctx))
	}
}

func (c *Comm) Rank() int { return c.rank }
func (c *Comm) Size() int { return c.size }

// Close frees the communicator after its work is done (ncclCommDestroy);
// a second Close, or one after Abort, does nothing.
func (c *Comm) Close() error {
	if c.aborted || c.closed {
		return nil // ncclCommAbort freed it, or a Close before
	}
	c.closed = true
	return resultError("ncclCommDestroy", C.moex_nccl_comm_destroy(c.c))
}

// Abort frees the communicator at once, cancelling its pending work: the
// way out when a peer does not arrive.
func (c *Comm) Abort() error {
	if c.aborted {
		return nil
	}
	c.aborted = true
	return resultError("ncclCommAbort", C.moex_nccl_comm_abort(c.c))
}

// AsyncError reports an error raised by in-flight operations (none while
// a non-blocking communicator's work is still in progress).
func (c *Comm) AsyncError() error {
	state, err := c.asyncState()
	if err != nil || state == inProgress {
		return err
	}
	return resultError("asynchronous operation", state)
}

// asyncState is ncclCommGetAsyncError's state: 0, ncclInProgress or an
// error code.
func (c *Comm) asyncState() (C.int, error) {
	var e C.int
	if err := resultError("ncclCommGetAsyncError", C.moex_nccl_comm_get_async_error(c.c, &e)); err != nil {
		return 0, err
	}
	return e, nil
}

// result is resultError for a call on c: on a non-blocking communicator
// ncclInProgress means the call goes on in the background, which Await
// waits for.
func (c *Comm) result(call string, r C.int) error {
	if r == inProgress && c.nonblocking {
		return nil
	}
	return resultError(call, r)
}

// AllReduce reduces count elements of send into recv on every rank.
func (c *Comm) AllReduce(send, recv uintptr, count int, dt DType, op RedOp, stream uintptr) error {
	return c.result("ncclAllReduce", C.moex_nccl_all_reduce(C.uintptr_t(send), C.uintptr_t(recv), C.size_t(count), C.int(dt), C.int(op), c.c, C.uintptr_t(stream)))
}

// AllGather gathers count elements from every rank into recv (size·count).
func (c *Comm) AllGather(send, recv uintptr, count int, dt DType, stream uintptr) error {
	return c.result("ncclAllGather", C.moex_nccl_all_gather(C.uintptr_t(send), C.uintptr_t(recv), C.size_t(count), C.int(dt), c.c, C.uintptr_t(stream)))
}

// ReduceScatter reduces size·count elements and leaves count on each rank.
func (c *Comm) ReduceScatter(send, recv uintptr, count int, dt DType, op RedOp, stream uintptr) error {
	return c.result("ncclReduceScatter", C.moex_nccl_reduce_scatter(C.uintptr_t(send), C.uintptr_t(recv), C.size_t(count), C.int(dt), C.int(op), c.c, C.uintptr_t(stream)))
}

// AllToAllV sends sendCounts[r] elements from send + sendOffsets[r] to
// rank r and receives recvCounts[r] elements into recv + recvOffsets[r],
// as one group of ncclSend/ncclRecv (offsets and counts in elements of
// elemBytes bytes).
func (c *Comm) AllToAllV(send uintptr, sendCounts, sendOffsets []int, recv uintptr, recvCounts, recvOffsets []int,
	dt DType, elemBytes int, stream uintptr) error {
	if len(sendCounts) != c.size || len(sendOffsets) != c.size || len(recvCounts) != c.size || len(recvOffsets) != c.size {
		return fmt.Errorf("nccl: all-to-all of %d ranks needs %d counts and offsets each way", c.size, c.size)
	}
	if err := c.result("ncclGroupStart", C.moex_nccl_group_start()); err != nil {
		return err
	}
	var first error
	for r := 0; r < c.size; r++ {
		if sendCounts[r] > 0 && first == nil {
			first = c.result("ncclSend", C.moex_nccl_send(C.uintptr_t(send+uintptr(sendOffsets[r]*elemBytes)), C.size_t(sendCounts[r]),
				C.int(dt), C.int(r), c.c, C.uintptr_t(stream)))
		}
		if recvCounts[r] > 0 && first == nil {
			first = c.result("ncclRecv", C.moex_nccl_recv(C.uintptr_t(recv+uintptr(recvOffsets[r]*elemBytes)), C.size_t(recvCounts[r]),
				C.int(dt), C.int(r), c.c, C.uintptr_t(stream)))
		}
	}
	if err := c.result("ncclGroupEnd", C.moex_nccl_group_end()); err != nil && first == nil {
		first = err
	}
	return first
}
