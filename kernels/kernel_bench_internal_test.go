package kernels

import (
	"fmt"
	"testing"
)

// BenchmarkKernelL1 times one micro-kernel on data that stays in L1: the
// kernel's own throughput, without memory effects.
func BenchmarkKernelL1(b *testing.B) {
	for _, s := range simds {
		for _, mr := range []int{1, s.maxMR} {
			b.Run(fmt.Sprintf("%s/F32/mr=%d", s.name, mr), func(b *testing.B) {
				const K = 512
				var a [maxKernelRows]*float32
				rows := make([]float32, maxKernelRows*K)
				for i := range a {
					a[i] = &rows[i*K]
				}
				w := make([]float32, 4*K)
				m, _ := NewF32(4, K, w)
				var bp [4]*byte
				for n := range bp {
					bp[n] = m.rowPtr(n)
				}
				var out [4 * maxKernelRows]float32
				var lane laneAcc
				for b.Loop() {
					s.kern[F32][mr](&a, &bp, K, &lane, 2, &out)
				}
				b.ReportMetric(float64(2*mr*4*K)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}
