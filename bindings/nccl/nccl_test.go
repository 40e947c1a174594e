//go:build cgo

package nccl

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// stubLibrary builds testdata/stub_nccl.c into a libnccl.so.2 of its own.
func stubLibrary(t *testing.T, defines ...string) string {
	t.Helper()
	dir := t.TempDir()
	lib := filepath.Join(dir, "libnccl.so.2")
	args := append([]string{"-shared", "-fPIC", "-O1", "-o", lib}, defines...)
	out, err := exec.Command("gcc", append(args, filepath.Join("testdata", "stub_nccl.c"))...).CombinedOutput()
	if err != nil {
		t.Skipf("no C compiler for the stub library: %v %s", err, out)
	}
	return lib
}

func readLog(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, os.Remove(path))
	return strings.Split(strings.TrimSpace(string(data)), "\n")
}

// TestShimAgainstStub drives every entry point through the stub library:
// argument order, the grouping of the all-to-all, error strings.
func TestShimAgainstStub(t *testing.T) {
	err := Load(filepath.Join(t.TempDir(), "missing", "libnccl.so.2"))
	require.ErrorIs(t, err, ErrLibraryNotFound)
	require.ErrorContains(t, err, "libnccl.so.2")

	lib := stubLibrary(t)
	logPath := filepath.Join(t.TempDir(), "calls.log")
	t.Setenv("NCCL_STUB_LOG", logPath)
	require.NoError(t, Load(lib))
	require.NoError(t, Load(lib), "a second load of the same library is fine")

	id, err := GetUniqueID()
	require.NoError(t, err)
	require.Equal(t, byte(1), id[0])
	require.Equal(t, byte((127*3+1)%256), id[127])
	c, err := InitRank(id, 4, 2)
	require.NoError(t, err)
	require.Equal(t, []string{"ncclGetUniqueId", "ncclCommInitRank nranks=4 rank=2 id0=1 id127=126"}, readLog(t, logPath))

	require.NoError(t, c.AllReduce(0x1000, 0x2000, 10, Float32, Max, 0x99))
	require.NoError(t, c.AllGather(0x3000, 0x4000, 5, BFloat16, 0))
	require.NoError(t, c.ReduceScatter(0x5000, 0x6000, 7, Float32, Sum, 0x98))
	require.Equal(t, []string{
		"ncclAllReduce send=0x1000 recv=0x2000 count=10 dtype=7 op=2 comm=1 stream=0x99",
		"ncclAllGather send=0x3000 recv=0x4000 count=5 dtype=9 comm=1 stream=0",
		"ncclReduceScatter send=0x5000 recv=0x6000 count=7 dtype=7 op=0 comm=1 stream=0x98",
	}, readLog(t, logPath))

	// All-to-all: one group of sends and receives, empty pairs skipped.
	require.NoError(t, c.AllToAllV(0x10000, []int{2, 0, 3, 1}, []int{0, 2, 2, 5}, 0x20000, []int{1, 4, 0, 2}, []int{0, 1, 5, 5},
		Float32, 4, 0))
	require.Equal(t, []string{
		"ncclGroupStart",
		"ncclSend buf=0x10000 count=2 dtype=7 peer=0",
		"ncclRecv buf=0x20000 count=1 dtype=7 peer=0",
		"ncclRecv buf=0x20004 count=4 dtype=7 peer=1",
		"ncclSend buf=0x10008 count=3 dtype=7 peer=2",
		"ncclSend buf=0x10014 count=1 dtype=7 peer=3",
		"ncclRecv buf=0x20014 count=2 dtype=7 peer=3",
		"ncclGroupEnd",
	}, readLog(t, logPath))
	require.ErrorContains(t, c.AllToAllV(0, []int{1}, []int{0}, 0, []int{1}, []int{0}, Float32, 4, 0), "needs 4 counts")

	// Errors carry NCCL's own string; a failed send still closes the group.
	t.Setenv("NCCL_STUB_FAIL", "ncclAllGather")
	err = c.AllGather(1, 2, 3, Float32, 0)
	require.ErrorContains(t, err, "nccl: ncclAllGather: stub internal error (ncclResult 3)")
	t.Setenv("NCCL_STUB_FAIL", "ncclSend")
	err = c.AllToAllV(0, []int{1, 1, 1, 1}, []int{0, 1, 2, 3}, 0, []int{0, 0, 0, 0}, []int{0, 0, 0, 0}, Float32, 4, 0)
	require.ErrorContains(t, err, "ncclSend: stub internal error")
	lines := readLog(t, logPath)
	require.Equal(t, "ncclGroupEnd", lines[len(lines)-1])
	t.Setenv("NCCL_STUB_FAIL", "")

	require.NoError(t, c.AsyncError())
	require.NoError(t, c.Abort())

	require.NoError(t, c.Abort(), "a second abort does nothing")
	require.NoError(t, c.Close(), "nor does closing an aborted communicator")
	require.Equal(t, []string{"ncclCommGetAsyncError comm=1", "ncclCommAbort comm=1"}, readLog(t, logPath))

	// Await: finished work returns; an asynchronous error, or a peer that
	// never arrives (the context's deadline), aborts the communicator.
	fresh := func() *Comm {
		c, err := InitRank(id, 4, 2)
		require.NoError(t, err)
		readLog(t, logPath)
		return c
	}
	c = fresh()
	polls := 0
	require.NoError(t, c.Await(context.Background(), func() (bool, error) { polls++; return polls == 3, nil }))
	require.Equal(t, 3, polls)
	require.Equal(t, []string{"ncclCommGetAsyncError comm=1", "ncclCommGetAsyncError comm=1", "ncclCommGetAsyncError comm=1"}, readLog(t, logPath))
	never := func() (bool, error) { return false, nil }
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	err = c.Await(ctx, never)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "nccl: rank 2: collective not finished: context deadline exceeded; communicator aborted")
	lines = readLog(t, logPath)
	require.Equal(t, "ncclCommAbort comm=1", lines[len(lines)-1])
	c = fresh()
	t.Setenv("NCCL_STUB_ASYNC", "3")
	err = c.Await(context.Background(), never)
	require.EqualError(t, err, "nccl: asynchronous operation: stub internal error (ncclResult 3); communicator aborted")
	require.Equal(t, []string{"ncclCommGetAsyncError comm=1", "ncclCommAbort comm=1"}, readLog(t, logPath))
	t.Setenv("NCCL_STUB_ASYNC", "")
	c = fresh()
	require.ErrorContains(t, c.Await(context.Background(), func() (bool, error) { return false, errors.New("stream query failed") }),
		"stream query failed; communicator aborted")
	require.Equal(t, []string{"ncclCommGetAsyncError comm=1", "ncclCommAbort comm=1"}, readLog(t, logPath))

	// A non-blocking init: polled until the ranks have met; a peer that
	// never comes ends it at the deadline, aborted.
	t.Setenv("NCCL_STUB_PENDING", "3")
	c, err = InitRankContext(context.Background(), id, 4, 2, nil)
	require.NoError(t, err)
	lines = readLog(t, logPath)
	require.Equal(t, "ncclCommInitRankConfig nranks=4 rank=2 id0=1 size=24 magic=0xcafebeef version=21400 blocking=0", lines[0])
	require.Equal(t, []string{"ncclCommGetAsyncError comm=1", "ncclCommGetAsyncError comm=1", "ncclCommGetAsyncError comm=1", "ncclCommGetAsyncError comm=1"}, lines[1:])
	// Its calls may return ncclInProgress, which Await then waits out.
	t.Setenv("NCCL_STUB_FAIL", "ncclGroupEnd")
	t.Setenv("NCCL_STUB_FAIL_CODE", "7")
	require.NoError(t, c.AllToAllV(0, []int{1, 1, 1, 1}, []int{0, 1, 2, 3}, 0, []int{0, 0, 0, 0}, []int{0, 0, 0, 0}, Float32, 4, 0))
	// Queued waits out ncclInProgress without asking the stream: what a
	// stream capture can wait for.
	t.Setenv("NCCL_STUB_FAIL", "")
	readLog(t, logPath)
	require.NoError(t, c.Queued(context.Background()))
	require.Equal(t, []string{"ncclCommGetAsyncError comm=1"}, readLog(t, logPath))
	t.Setenv("NCCL_STUB_ASYNC", "7")
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	err = c.Queued(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "nccl: rank 2: collective not queued: context deadline exceeded; communicator aborted")
	t.Setenv("NCCL_STUB_ASYNC", "")
	c, err = InitRankContext(context.Background(), id, 4, 2, nil)
	require.NoError(t, err)
	readLog(t, logPath)
	t.Setenv("NCCL_STUB_ASYNC", "3")
	require.EqualError(t, c.WaitQueued(context.Background()), "nccl: asynchronous operation: stub internal error (ncclResult 3)")
	require.NotContains(t, readLog(t, logPath), "ncclCommAbort comm=1", "WaitQueued leaves the abort to its caller")
	require.EqualError(t, c.Queued(context.Background()), "nccl: asynchronous operation: stub internal error (ncclResult 3); communicator aborted")
	t.Setenv("NCCL_STUB_ASYNC", "")
	readLog(t, logPath)
	t.Setenv("NCCL_STUB_FAIL", "ncclGroupEnd")
	blocking := fresh()
	require.NoError(t, blocking.Queued(context.Background()), "a blocking communicator has queued its work on return")
	require.ErrorContains(t, blocking.AllToAllV(0, []int{1, 1, 1, 1}, []int{0, 1, 2, 3}, 0, []int{0, 0, 0, 0}, []int{0, 0, 0, 0}, Float32, 4, 0),
		"ncclGroupEnd: stub: other (ncclResult 7)", "a blocking communicator never answers ncclInProgress")
	t.Setenv("NCCL_STUB_FAIL", "")
	t.Setenv("NCCL_STUB_FAIL_CODE", "")
	t.Setenv("NCCL_STUB_ASYNC", "7")
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	queries := 0
	err = c.Await(ctx, func() (bool, error) { queries++; return true, nil })
	require.ErrorContains(t, err, "collective not finished", "the stream is idle, NCCL is still queuing")
	require.Zero(t, queries, "the stream is not asked while NCCL is still queuing: it may be idle before the work is on it")
	t.Setenv("NCCL_STUB_ASYNC", "")
	readLog(t, logPath)

	t.Setenv("NCCL_STUB_PENDING", "-1")
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	_, err = InitRankContext(ctx, id, 4, 2, nil)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.EqualError(t, err, "nccl: rank 2 of 4: communicator not formed: context deadline exceeded; communicator aborted")
	lines = readLog(t, logPath)
	require.Equal(t, "ncclCommAbort comm=1", lines[len(lines)-1])
	t.Setenv("NCCL_STUB_PENDING", "")
	t.Setenv("NCCL_STUB_FAIL", "ncclCommInitRankConfig")
	_, err = InitRankContext(context.Background(), id, 4, 2, nil)
	require.EqualError(t, err, "nccl: ncclCommInitRankConfig: stub internal error (ncclResult 3); communicator aborted")
	t.Setenv("NCCL_STUB_FAIL", "")

	_, err = InitRank(id, 4, 4)
	require.ErrorContains(t, err, "rank 4 of 4")
	_, err = InitRankContext(context.Background(), id, 4, -1, nil)
	require.ErrorContains(t, err, "rank -1 of 4")
	require.ErrorContains(t, Load("/elsewhere/libnccl.so.2"), "is already loaded")
}

// TestInitRankWithoutConfig: with an NCCL older than 2.14 (no
// ncclCommInitRankConfig) InitRankContext runs the blocking init, and still
// returns at the deadline. The library loads once per process, so the test
// runs itself in a child process.
func TestInitRankWithoutConfig(t *testing.T) {
	if lib := os.Getenv("NCCL_STUB_CHILD"); lib != "" {
		require.NoError(t, Load(lib))
		// The init runs on a thread of its own, which must be bound too.
		var binds, unbinds atomic.Int32
		bind := func() (func(), error) { binds.Add(1); return func() { unbinds.Add(1) }, nil }
		c, err := InitRankContext(context.Background(), UniqueID{1}, 2, 1, bind)
		require.NoError(t, err)
		require.Equal(t, 1, c.Rank())
		require.Equal(t, []string{"ncclCommInitRank nranks=2 rank=1 id0=1 id127=0"}, readLog(t, os.Getenv("NCCL_STUB_LOG")))
		require.Equal(t, int32(2), binds.Load(), "the caller's thread (for the config call) and the init's")
		require.Equal(t, int32(2), unbinds.Load())
		t.Setenv("NCCL_STUB_INIT_SLEEP_MS", "2000")
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err = InitRankContext(ctx, UniqueID{1}, 2, 1, bind)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.ErrorContains(t, err, "nccl: rank 1 of 2: communicator not formed (this NCCL cannot abort an init")
		require.Less(t, time.Since(start), time.Second)
		return
	}
	lib := stubLibrary(t, "-DSTUB_NO_CONFIG")
	cmd := exec.Command(os.Args[0], "-test.run", "^TestInitRankWithoutConfig$", "-test.count", "1")
	cmd.Env = append(os.Environ(), "NCCL_STUB_CHILD="+lib, "NCCL_STUB_LOG="+filepath.Join(t.TempDir(), "calls.log"))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "PASS")
}
