package kernels_test

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/kernels"
)

// TestParallelEveryIndexOnce: from many goroutines at once, with calls
// nested inside others, each call runs each of its indices exactly once
// and returns only after all of them have run, whether it holds the
// pooled helpers or starts its own.
func TestParallelEveryIndexOnce(t *testing.T) {
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			for round := range 40 {
				n := 1 + (g*7+round*13)%50
				counts := make([]atomic.Int32, n)
				err := kernels.Parallel(context.Background(), 1+round%4, n, func(i int) {
					counts[i].Add(1)
					if i%9 == 0 { // a nested call
						inner := make([]atomic.Int32, 5)
						assert.NoError(t, kernels.Parallel(context.Background(), 2, 5, func(k int) { inner[k].Add(1) }))
						for k := range inner {
							assert.Equal(t, int32(1), inner[k].Load())
						}
					}
				})
				assert.NoError(t, err)
				for i := range counts {
					assert.Equal(t, int32(1), counts[i].Load(), "goroutine %d round %d index %d of %d", g, round, i, n)
				}
			}
		})
	}
	wg.Wait()
}

// helpers counts the goroutines running Parallel's pooled helpers.
func helpers() int {
	buf := make([]byte, 1<<20)
	return strings.Count(string(buf[:runtime.Stack(buf, true)]), "created by github.com/moex-project/moex/kernels.(*parPool).dispatch")
}

// TestParallelHelpersEnd: the helpers kept between calls end once idle
// (so a process, or a test checking for leaks, keeps no goroutine of
// Parallel's), and later calls start them again.
func TestParallelHelpersEnd(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	for range 2 {
		var sum atomic.Int64
		require.NoError(t, kernels.Parallel(context.Background(), 4, 64, func(i int) { sum.Add(int64(i)) }))
		require.Equal(t, int64(64*63/2), sum.Load())
		require.Equal(t, 3, helpers(), "helpers kept after a call on 4 workers")
		deadline := time.Now().Add(5 * time.Second)
		for helpers() > 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		require.Zero(t, helpers(), "Parallel's helpers did not end")
	}
}

// TestParallelContext: a context that ends stops the handing out of
// indices; the call returns its error after the items in progress end.
func TestParallelContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var ran, running atomic.Int32
	err := kernels.Parallel(ctx, 2, 1000, func(i int) {
		running.Add(1)
		defer running.Add(-1)
		if ran.Add(1) == 10 {
			cancel()
		}
		time.Sleep(100 * time.Microsecond)
	})
	require.ErrorIs(t, err, context.Canceled)
	assert.Less(t, ran.Load(), int32(1000))
	assert.Zero(t, running.Load(), "an item was still running")
}
