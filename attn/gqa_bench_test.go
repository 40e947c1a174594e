package attn_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/kernels"
)

// BenchmarkGQA times grouped-query attention at Qwen3-30B-A3B's shapes (32
// query heads over 4 key/value heads of 128, a bf16 cache): one decode
// query after ctx rows, and a prefill of ctx queries.
func BenchmarkGQA(b *testing.B) {
	const heads, kvh, d = 32, 4, 128
	for _, dt := range []kernels.DType{kernels.BF16, kernels.F16} {
		for _, ctx := range []int{576, 4096} {
			D := kvh * 2 * d
			c, err := attn.NewCache(ctx/16+1, 16, D, dt)
			require.NoError(b, err)
			rng := rand.New(rand.NewPCG(1, 2))
			rows := make([]float32, ctx*D)
			for i := range rows {
				rows[i] = float32(rng.NormFloat64())
			}
			require.NoError(b, c.Append(0, rows))
			p := attn.GQAParams{Heads: heads, KVHeads: kvh, KeyDim: d, ValueDim: d, Scale: 0.088}
			for _, prefill := range []bool{false, true} {
				n := 1
				if prefill {
					if ctx > 1024 {
						continue
					}
					n = ctx
				}
				queries := make([]attn.Query, n)
				for i := range queries {
					queries[i] = attn.Query{Table: c.BlockTable(0), Len: ctx - n + i + 1}
				}
				q := make([]float32, n*heads*d)
				for i := range q {
					q[i] = float32(rng.NormFloat64())
				}
				out := make([]float32, n*heads*d)
				b.Run(fmt.Sprintf("%v/ctx=%d/queries=%d", dt, ctx, n), func(b *testing.B) {
					for b.Loop() {
						if err := attn.GQA(context.Background(), c, q, queries, p, out); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}
