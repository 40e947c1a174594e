package kernels_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/moex-project/moex/kernels"
)

// unmapped is the address of a page that was mapped and no longer is.
func unmapped(t *testing.T) *byte {
	b, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	p := &b[0]
	require.NoError(t, unix.Munmap(b))
	return p
}

func TestParallelFault(t *testing.T) {
	p := unmapped(t)
	for _, workers := range []int{1, 2, 4} {
		var sum byte
		err := kernels.Parallel(context.Background(), workers, 8, func(i int) {
			if i == 5 {
				sum += *(*byte)(unsafe.Add(unsafe.Pointer(p), 100))
			}
		})
		var f *kernels.FaultError
		require.True(t, errors.As(err, &f), "workers %d: %v", workers, err)
		assert.Equal(t, uintptr(unsafe.Pointer(p))+100, f.Addr)
		assert.Contains(t, err.Error(), "faulted")
	}
	// The serial path leaves the caller's setting as it was: a fault
	// after it is a crash again (not tested: it would end the test), and
	// calls without a fault still return nil.
	require.NoError(t, kernels.Parallel(context.Background(), 1, 3, func(int) {}))
}

// TestParallelPanicsPassOn: other panics stay panics (on the caller's
// goroutine, with one worker: a worker goroutine's would end the test
// binary).
func TestParallelPanicsPassOn(t *testing.T) {
	assert.PanicsWithValue(t, "boom", func() {
		_ = kernels.Parallel(context.Background(), 1, 4, func(i int) {
			if i == 2 {
				panic("boom")
			}
		})
	})
	// A nil dereference is a bug, not a mapping: it stays a panic.
	assert.Panics(t, func() {
		_ = kernels.Parallel(context.Background(), 1, 4, func(i int) {
			var p *int
			if i == 1 {
				_ = *p
			}
		})
	})
}

// goid is the calling goroutine's id, from its stack's header.
func goid() string {
	var buf [64]byte
	s := string(buf[:runtime.Stack(buf[:], false)])
	return strings.Fields(s)[1]
}

// TestParallelCallerPanics: with several workers the caller runs a share
// of the items itself; a panic there reaches the caller only after the
// other workers have stopped (none still running an item).
func TestParallelCallerPanics(t *testing.T) {
	caller := goid()
	var running atomic.Int32
	assert.PanicsWithValue(t, "boom", func() {
		_ = kernels.Parallel(context.Background(), 2, 64, func(i int) {
			running.Add(1)
			defer running.Add(-1)
			if goid() == caller {
				time.Sleep(time.Millisecond) // let the other worker be in an item
				panic("boom")
			}
			time.Sleep(2 * time.Millisecond)
		})
		t.Error("Parallel returned")
	})
	assert.Zero(t, running.Load(), "a worker was still running an item")
}
