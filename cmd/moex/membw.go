package main

import (
	"runtime"
	"runtime/debug"
	"sync"
	"time"

	"github.com/moex-project/moex/internal/hugepage"
	"github.com/moex-project/moex/kernels"
)

// memoryBandwidth measures the machine's read bandwidth in GB/s: every
// thread reads its share of a 512 MiB buffer with kernels.ReadBytes (on
// AVX-512 a four-accumulator loop of 64-byte loads). Best of five passes.
func memoryBandwidth() float64 {
	const size = 512 << 20
	buf := make([]byte, size)
	hugepage.Advise(buf) // as the weights are: a TLB miss per 4 KiB would undercount
	for i := 0; i < size; i += 4096 {
		buf[i] = 0 // fault the pages in
	}
	threads := runtime.GOMAXPROCS(0)
	best := 0.0
	for pass := 0; pass < 5; pass++ {
		var wg sync.WaitGroup
		start := time.Now()
		for t := 0; t < threads; t++ {
			part := buf[t*size/threads : (t+1)*size/threads]
			wg.Go(func() {
				if kernels.ReadBytes(part) != 0 {
					panic("unreachable: the buffer is all zeros")
				}
			})
		}
		wg.Wait()
		best = max(best, size/time.Since(start).Seconds()/1e9)
	}
	// The buffer handed back to the OS now, not by the runtime's
	// background scavenger while the next case is timed: on two cores
	// that made the case after a probe up to 1.8× slower.
	debug.FreeOSMemory()
	return best
}
