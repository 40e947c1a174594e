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

// benchAttention times f, an attention over a cache of ctx random rows of
// D values in dt (16-row blocks, as the models keep them), for one decode
// query after them and for a prefill of the last prefill rows (0: none),
// q holding qd values a query and out od.
func benchAttention(b *testing.B, dt kernels.DType, ctx, D, prefill, qd, od int,
	f func(c *attn.Cache, q []float32, queries []attn.Query, out []float32) error) {
	c, err := attn.NewCache(ctx/16+1, 16, D, dt)
	require.NoError(b, err)
	rng := rand.New(rand.NewPCG(1, 2))
	rows := make([]float32, ctx*D)
	for i := range rows {
		rows[i] = float32(rng.NormFloat64())
	}
	require.NoError(b, c.Append(0, rows))
	for _, n := range []int{1, prefill} {
		if n == 0 {
			continue
		}
		queries := make([]attn.Query, n)
		for i := range queries {
			queries[i] = attn.Query{Table: c.BlockTable(0), Len: ctx - n + i + 1}
		}
		q := make([]float32, n*qd)
		for i := range q {
			q[i] = float32(rng.NormFloat64())
		}
		out := make([]float32, n*od)
		b.Run(fmt.Sprintf("%v/ctx=%d/queries=%d", dt, ctx, n), func(b *testing.B) {
			for b.Loop() {
				if err := f(c, q, queries, out); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkGQA times grouped-query attention at Qwen3-30B-A3B's shapes (32
// query heads over 4 key/value heads of 128), bf16 and fp16 caches: one
// decode query after ctx rows, and a prefill of ctx queries.
func BenchmarkGQA(b *testing.B) {
	const heads, kvh, d = 32, 4, 128
	p := attn.GQAParams{Heads: heads, KVHeads: kvh, KeyDim: d, ValueDim: d, Scale: 0.088}
	for _, dt := range []kernels.DType{kernels.BF16, kernels.F16} {
		for _, ctx := range []int{576, 4096} {
			prefill := ctx
			if ctx > 1024 {
				prefill = 0
			}
			benchAttention(b, dt, ctx, kvh*2*d, prefill, heads*d, heads*d, func(c *attn.Cache, q []float32, queries []attn.Query, out []float32) error {
				return attn.GQA(context.Background(), c, q, queries, p, out)
			})
		}
	}
}

// BenchmarkMLA times MLA attention in the absorbed form at
// DeepSeek-V2-Lite's shapes (16 heads over a latent row of 512 + 64, the
// values its first 512 columns): one decode query after ctx rows, and a
// prefill of 512 queries.
func BenchmarkMLA(b *testing.B) {
	const heads, D, dv = 16, 576, 512
	p := attn.MLAParams{Heads: heads, ValueDim: dv, Scale: 0.06}
	for _, dt := range []kernels.DType{kernels.BF16, kernels.F16} {
		for _, ctx := range []int{576, 4096} {
			prefill := 512
			if ctx > 1024 {
				prefill = 0
			}
			benchAttention(b, dt, ctx, D, prefill, heads*D, heads*dv, func(c *attn.Cache, q []float32, queries []attn.Query, out []float32) error {
				return attn.MLA(context.Background(), c, q, queries, p, out, nil)
			})
		}
	}
}
