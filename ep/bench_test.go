package ep_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/moex-project/moex/ep"
)

// randomRouting picks k distinct experts per token, ascending.
func randomRouting(rng *rand.Rand, tokens, k, experts int) ([]int32, []float32) {
	ids := make([]int32, 0, tokens*k)
	w := make([]float32, tokens*k)
	for t := 0; t < tokens; t++ {
		perm := rng.Perm(experts)[:k]
		sorted := make([]int32, k)
		for i, e := range perm {
			sorted[i] = int32(e)
		}
		for i := 1; i < k; i++ {
			for j := i; j > 0 && sorted[j] < sorted[j-1]; j-- {
				sorted[j], sorted[j-1] = sorted[j-1], sorted[j]
			}
		}
		ids = append(ids, sorted...)
	}
	for i := range w {
		w[i] = rng.Float32()
	}
	return ids, w
}

// BenchmarkDispatchCombine: the all-to-all traffic of a DeepSeek-V2-Lite EP
// step (hidden 2048, top-6 of 64 experts, contiguous placement), dispatch
// plus combine with identity experts, against a memcpy of the same bytes.
func BenchmarkDispatchCombine(b *testing.B) {
	const H, K, E = 2048, 6, 64
	for _, R := range []int{1, 2, 4, 8} {
		for _, T := range []int{16, 128, 1024} {
			rng := rand.New(rand.NewPCG(uint64(R), uint64(T)))
			xs := make([][]float32, R)
			ids := make([][]int32, R)
			ws := make([][]float32, R)
			for r := range xs {
				xs[r] = make([]float32, T*H)
				ids[r], ws[r] = randomRouting(rng, T, K, E)
			}
			place, _ := ep.Contiguous(E, R)
			bytes := ep.RoundTripBytes(R*T, H, K)
			b.Run(fmt.Sprintf("ranks=%d/tokens=%d", R, T), func(b *testing.B) {
				comms, _ := ep.NewLocal(R)
				exs := make([]*ep.Exchanger, R)
				for r := range exs {
					exs[r] = new(ep.Exchanger)
				}
				b.SetBytes(bytes)
				for b.Loop() {
					if err := ep.RoundTrip(context.Background(), comms, exs, place, xs, ids, ws, H, K); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(R*T), "ns/token")
			})
			b.Run(fmt.Sprintf("ranks=%d/tokens=%d/memcpy", R, T), func(b *testing.B) {
				src := make([]byte, bytes)
				dst := make([]byte, bytes)
				b.SetBytes(bytes)
				for b.Loop() {
					copy(dst, src)
				}
			})
		}
	}
}
