package attn

import (
	"context"
	"fmt"
	"math"

	"github.com/moex-project/moex/internal/errkind"
	"github.com/moex-project/moex/kernels"
)

// GQAParams are the shapes of grouped-query attention over a cache whose
// row is one token's keys, then its values: [KVHeads·KeyDim | KVHeads·ValueDim].
type GQAParams struct {
	// Heads query heads share KVHeads key/value heads: query head h reads
	// key/value head h / (Heads/KVHeads).
	Heads, KVHeads   int
	KeyDim, ValueDim int
	// Scale multiplies the scores (1/√KeyDim in the families moex runs).
	Scale float32
	// Window > 0: a query attends to its last Window rows (itself
	// included), as transformers' sliding-window mask; 0: to all of them.
	Window int
	// Sinks, one a query head (nil: none), are logits that join each
	// softmax's denominator and weigh no value (gpt-oss).
	Sinks []float32
	// Workers is the goroutines (0: GOMAXPROCS).
	Workers int
}

// GQA is grouped-query attention over a paged cache: for query token i and
// head h, with K and V the keys and values of head h's group in the rows
// [lo, queries[i].Len) of its sequence (lo = Len − Window with a window,
// else 0),
//
//	out[i, h] = softmax(Scale · q[i, h]·Kᵀ ∪ sink[h]) · V    [nq, Heads, ValueDim]
//
// q is [nq, Heads, KeyDim]. Scores, the softmax and the weighted sum are
// float64, each output value rounded once. Bad shapes, lengths or block
// tables give an error naming the query; a non-finite output an
// ErrNonFinite error.
func GQA(ctx context.Context, kv Blocks, q []float32, queries []Query, p GQAParams, out []float32) error {
	nq := len(queries)
	switch {
	case p.Heads < 1 || p.KVHeads < 1 || p.Heads%p.KVHeads != 0:
		return fmt.Errorf("attn: gqa: %d query heads over %d key/value heads", p.Heads, p.KVHeads)
	case p.KeyDim < 1 || p.ValueDim < 1 || kv.Dim() != p.KVHeads*(p.KeyDim+p.ValueDim):
		return fmt.Errorf("attn: gqa: cache rows have %d values, want %d key/value heads × (%d + %d)", kv.Dim(), p.KVHeads, p.KeyDim, p.ValueDim)
	case len(q) != nq*p.Heads*p.KeyDim:
		return fmt.Errorf("attn: gqa: q has %d values, want [%d queries, %d heads, %d]", len(q), nq, p.Heads, p.KeyDim)
	case len(out) != nq*p.Heads*p.ValueDim:
		return fmt.Errorf("attn: gqa: out has %d values, want %d", len(out), nq*p.Heads*p.ValueDim)
	case p.Sinks != nil && len(p.Sinks) != p.Heads:
		return fmt.Errorf("attn: gqa: %d sinks for %d heads", len(p.Sinks), p.Heads)
	case p.Window < 0:
		return fmt.Errorf("attn: gqa: window %d", p.Window)
	case math.IsNaN(float64(p.Scale)) || math.IsInf(float64(p.Scale), 0):
		return fmt.Errorf("attn: gqa: scale %v", p.Scale)
	}
	if err := checkQueries(kv, queries, "gqa"); err != nil {
		return err
	}
	for i, v := range q {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return errkind.Errorf(ErrNonFinite, "attn: gqa: q of query %d head %d holds %v", i/(p.Heads*p.KeyDim), i/p.KeyDim%p.Heads, v)
		}
	}
	err := kernels.Parallel(ctx, p.Workers, nq, func(i int) {
		attendGQA(kv, q[i*p.Heads*p.KeyDim:(i+1)*p.Heads*p.KeyDim], queries[i], p, out[i*p.Heads*p.ValueDim:(i+1)*p.Heads*p.ValueDim])
	})
	if err != nil {
		return err
	}
	for i, v := range out {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return errkind.Errorf(ErrNonFinite, "attn: gqa: query %d head %d: output is %v (a non-finite cache row, or scores that overflow)",
				i/(p.Heads*p.ValueDim), i/p.ValueDim%p.Heads, v)
		}
	}
	return nil
}

// attendGQA is one query's attention, every head: the scores over its
// rows, one softmax a head, then the values weighted, rows read twice.
func attendGQA(kv Blocks, q []float32, qr Query, p GQAParams, out []float32) {
	bs, D := kv.BlockSize(), kv.Dim()
	lo := 0
	if p.Window > 0 {
		lo = max(0, qr.Len-p.Window)
	}
	n, group := qr.Len-lo, p.Heads/p.KVHeads
	row := make([]float32, D)
	scores := make([]float64, p.Heads*n)
	each := func(fn func(j int, row []float32)) {
		for r := lo; r < qr.Len; r++ {
			kv.Block(int(qr.Table[r/bs])).RowF32(r%bs, row)
			fn(r-lo, row)
		}
	}
	each(func(j int, row []float32) {
		for h := 0; h < p.Heads; h++ {
			k := row[h/group*p.KeyDim:][:p.KeyDim]
			qh := q[h*p.KeyDim:][:p.KeyDim]
			var s float64
			for x, v := range qh {
				s += float64(v) * float64(k[x])
			}
			scores[h*n+j] = s * float64(p.Scale)
		}
	})
	for h := 0; h < p.Heads; h++ {
		sh := scores[h*n : (h+1)*n]
		top := math.Inf(-1)
		if p.Sinks != nil {
			top = float64(p.Sinks[h])
		}
		for _, s := range sh {
			top = math.Max(top, s)
		}
		var sum float64
		if p.Sinks != nil {
			sum = math.Exp(float64(p.Sinks[h]) - top)
		}
		for j, s := range sh {
			e := math.Exp(s - top)
			sh[j] = e
			sum += e
		}
		for j := range sh {
			sh[j] /= sum
		}
	}
	acc := make([]float64, p.Heads*p.ValueDim)
	vals := p.KVHeads * p.KeyDim
	each(func(j int, row []float32) {
		for h := 0; h < p.Heads; h++ {
			w := scores[h*n+j]
			v := row[vals+h/group*p.ValueDim:][:p.ValueDim]
			a := acc[h*p.ValueDim:][:p.ValueDim]
			for x, y := range v {
				a[x] += w * float64(y)
			}
		}
	})
	for i, v := range acc {
		out[i] = float32(v)
	}
}
