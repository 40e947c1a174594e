package kernels_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"

	"github.com/moex-project/moex/internal/openblas"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/kernels/kerneltest"
)

func init() {
	if openblas.Available {
		baselines["openblas"] = openblas.Sgemm
	}
}

// gemmShapes are DeepSeek-V2-Lite expert projections, C[M,N] = A[M,K]·B[N,K]ᵀ.
var gemmShapes = []struct {
	name    string
	m, n, k int
}{
	{"gate_up_M16", 16, 2816, 2048}, {"gate_up_M64", 64, 2816, 2048}, {"gate_up_M256", 256, 2816, 2048},
	{"down_M16", 16, 2048, 1408}, {"down_M64", 64, 2048, 1408}, {"down_M256", 256, 2048, 1408},
}

// sgemmFunc is a baseline: c = a·bᵀ on the given number of threads.
type sgemmFunc func(m, n, k int, a, b, c []float32, threads int)

// baselines are the libraries moex is compared with in the same run; the
// openblas build tag adds OpenBLAS.
var baselines = map[string]sgemmFunc{
	"gonum": func(m, n, k int, a, b, c []float32, threads int) {
		prev := runtime.GOMAXPROCS(threads)
		gonum.Implementation{}.Sgemm(blas.NoTrans, blas.Trans, m, n, k, 1, a, k, b, k, 0, c, n)
		runtime.GOMAXPROCS(prev)
	},
}

// BenchmarkSGEMM times moex's GEMM on every implementation and dtype and the
// baselines on f32, at the same shapes and thread counts, in one run:
//
//	go test -run '^$' -bench SGEMM ./kernels            (add -tags openblas for OpenBLAS)
func BenchmarkSGEMM(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	for _, s := range gemmShapes {
		a := make([]float32, s.m*s.k)
		for i := range a {
			a[i] = 2*rng.Float32() - 1
		}
		rows := make([]int32, s.m)
		for i := range rows {
			rows[i] = int32(i)
		}
		flops := 2 * float64(s.m) * float64(s.n) * float64(s.k)
		for _, threads := range []int{1, 2} {
			for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
				rowMajor, _ := kerneltest.Weights(rng, dt, s.n, s.k)
				for _, impl := range kernels.Implementations() {
					for _, layout := range []string{"", "-rows"} {
						w := kernels.Pack(rowMajor)
						if layout != "" {
							w = rowMajor
						}
						b.Run(fmt.Sprintf("%s/moex-%s-%v%s/threads=%d", s.name, impl, dt, layout, threads), func(b *testing.B) {
							restore, err := kernels.Use(impl)
							if err != nil {
								b.Fatal(err)
							}
							defer restore()
							groups := []kernels.GEMMGroup{{B: w, Rows: rows, Out: make([]float32, s.m*s.n)}}
							for b.Loop() {
								if err := kernels.GroupedGEMM(context.Background(), threads, a, groups); err != nil {
									b.Fatal(err)
								}
							}
							b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
						})
					}
				}
			}
			bf := make([]float32, s.n*s.k)
			for i := range bf {
				bf[i] = 2*rng.Float32() - 1
			}
			c := make([]float32, s.m*s.n)
			for name, f := range baselines {
				b.Run(fmt.Sprintf("%s/%s-F32/threads=%d", s.name, name, threads), func(b *testing.B) {
					for b.Loop() {
						f(s.m, s.n, s.k, a, bf, c, threads)
					}
					b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				})
			}
		}
	}
}
