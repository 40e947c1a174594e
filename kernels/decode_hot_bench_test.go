package kernels_test

import (
	"context"
	"testing"

	"github.com/moex-project/moex/kernels"
)

// BenchmarkDecodeHot times one activation row against a matrix small
// enough to stay in L2 (256 × 2048), on one worker, for the int8-dot
// kernels of the kinds a decode step streams (Q6_K-like, UINT4, INT8 on
// fp16 scales as Q8_0, MXFP4): the kernels' own rate, with no wait on
// DRAM. Against BenchmarkDecodeExperts' DRAM-bound figures it says how
// close a kind's kernel is to being the bound rather than the memory:
//
//	go test -run '^$' -bench DecodeHot ./kernels
func BenchmarkDecodeHot(b *testing.B) {
	const N, K = 256, 2048
	v := make([]float32, N*K)
	for i := range v {
		v[i] = float32(i%13-6) / 40
	}
	a := make([]float32, K)
	for i := range a {
		a[i] = float32(i%7) - 3
	}
	out := make([]float32, N)
	for _, c := range []struct {
		name string
		dt   kernels.DType
	}{{"q6k", q6K}, {"uint4", kernels.UINT4}, {"int8", kernels.INT8}, {"mxfp4", kernels.MXFP4}} {
		var q kernels.Matrix
		var err error
		if c.dt == q6K {
			q, err = kQuantLike(true, v, N, K)
		} else {
			q, err = kernels.Quantize(c.dt, v, N, K)
		}
		if err != nil {
			b.Fatal(err)
		}
		W, err := kernels.Int8Dot.Pack(q)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(W.Bytes())
			for b.Loop() {
				if err := kernels.GroupedGEMM(context.Background(), 1, a, []kernels.GEMMGroup{{B: W, Rows: []int32{0}, Out: out}}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
