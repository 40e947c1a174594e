package attn_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/kernels"
)

// sameBits requires got and want to be equal bit for bit.
func sameBits(t *testing.T, want, got []float32, name string) {
	t.Helper()
	require.Len(t, got, len(want), name)
	for i := range want {
		if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
			require.Failf(t, "bits differ", "%s: value %d: %v widened, %v in place", name, i, want[i], got[i])
		}
	}
}

// randomCache is a cache of n random rows of D values in dt, in blocks of
// bs rows, for sequence 0.
func randomCache(t *testing.T, rng *rand.Rand, dt kernels.DType, n, bs, D int) *attn.Cache {
	c, err := attn.NewCache(n/bs+2, bs, D, dt)
	require.NoError(t, err)
	rows := make([]float32, n*D)
	for i := range rows {
		rows[i] = float32(rng.NormFloat64())
	}
	require.NoError(t, c.Append(0, rows))
	return c
}

// TestInPlaceSameBits: both attentions give the same bits reading their
// caches in place as widening them, on the shapes that take the in-place
// kernels: every cache dtype, blocks of 16 and of 5 rows (runs cut at
// every block), a decode query and a prefill, grouped-query attention with
// 1, 3 and 8 query heads a key/value head (tiles of rows not whole 4s), a
// window and sinks, MLA over chunks split by head groups of 4 (weighed
// into the output) and of 6 (a scratch).
func TestInPlaceSameBits(t *testing.T) {
	if !kernels.InPlaceAttention(kernels.F16, 128, 128) {
		t.Skip("no in-place attention kernels on this machine")
	}
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(11, 12))
	run := func(f func() []float32) (widened, inPlace []float32) {
		inPlace = f()
		restore := attn.WidenOnly()
		defer restore()
		return f(), inPlace
	}
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.F16} {
		for _, bs := range []int{16, 5} {
			for _, g := range []struct{ heads, kvh, d, window int }{{8, 1, 128, 0}, {12, 4, 64, 7}, {4, 4, 256, 0}, {16, 2, 128, 300}} {
				const n = 331
				D := g.kvh * 2 * g.d
				c := randomCache(t, rng, dt, n, bs, D)
				var sinks []float32
				if g.window > 0 {
					sinks = make([]float32, g.heads)
					for i := range sinks {
						sinks[i] = float32(rng.NormFloat64())
					}
				}
				p := attn.GQAParams{Heads: g.heads, KVHeads: g.kvh, KeyDim: g.d, ValueDim: g.d, Scale: 0.1, Window: g.window, Sinks: sinks}
				for _, nq := range []int{1, 40} {
					queries := make([]attn.Query, nq)
					for i := range queries {
						queries[i] = attn.Query{Table: c.BlockTable(0), Len: n - nq + i + 1}
					}
					q := make([]float32, nq*g.heads*g.d)
					for i := range q {
						q[i] = float32(rng.NormFloat64())
					}
					widened, inPlace := run(func() []float32 {
						out := make([]float32, nq*g.heads*g.d)
						require.NoError(t, attn.GQA(ctx, c, q, queries, p, out))
						return out
					})
					sameBits(t, widened, inPlace, fmt.Sprintf("gqa %v blocks of %d, %+v, %d queries", dt, bs, g, nq))
				}
			}
			for _, heads := range []int{16, 6} {
				const n, D, dv = 203, 576, 512
				c := randomCache(t, rng, dt, n, bs, D)
				for _, nq := range []int{1, 9} {
					queries := make([]attn.Query, nq)
					for i := range queries {
						queries[i] = attn.Query{Table: c.BlockTable(0), Len: n - nq + i + 1}
					}
					q := make([]float32, nq*heads*D)
					for i := range q {
						q[i] = float32(rng.NormFloat64())
					}
					p := attn.MLAParams{Heads: heads, ValueDim: dv, Scale: 0.05, SplitRows: 64}
					widened, inPlace := run(func() []float32 {
						out := make([]float32, nq*heads*dv)
						require.NoError(t, attn.MLA(ctx, c, q, queries, p, out, nil))
						return out
					})
					sameBits(t, widened, inPlace, fmt.Sprintf("mla %v blocks of %d, %d heads, %d queries", dt, bs, heads, nq))
				}
			}
		}
	}
}
