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

// BenchmarkMLA times MLA attention in the absorbed form at
// DeepSeek-V2-Lite's shapes (16 heads over a latent row of 512 + 64, the
// values its first 512 columns), a cache of 16-row blocks as the models
// keep: one decode query after ctx rows, and a prefill of 512 queries.
func BenchmarkMLA(b *testing.B) {
	const heads, D, dv = 16, 576, 512
	for _, dt := range []kernels.DType{kernels.BF16, kernels.F16} {
		for _, ctx := range []int{576, 4096} {
			c, err := attn.NewCache(ctx/16+1, 16, D, dt)
			require.NoError(b, err)
			rng := rand.New(rand.NewPCG(1, 2))
			rows := make([]float32, ctx*D)
			for i := range rows {
				rows[i] = float32(rng.NormFloat64())
			}
			require.NoError(b, c.Append(0, rows))
			p := attn.MLAParams{Heads: heads, ValueDim: dv, Scale: 0.06}
			for _, n := range []int{1, 512} {
				if n > 1 && ctx > 1024 {
					continue
				}
				queries := make([]attn.Query, n)
				for i := range queries {
					queries[i] = attn.Query{Table: c.BlockTable(0), Len: ctx - n + i + 1}
				}
				q := make([]float32, n*heads*D)
				for i := range q {
					q[i] = float32(rng.NormFloat64())
				}
				out := make([]float32, n*heads*dv)
				b.Run(fmt.Sprintf("%v/ctx=%d/queries=%d", dt, ctx, n), func(b *testing.B) {
					for b.Loop() {
						if err := attn.MLA(context.Background(), c, q, queries, p, out, nil); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}
