package attn

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/moex-project/moex/internal/buffers"
	"github.com/moex-project/moex/internal/errkind"
	"github.com/moex-project/moex/internal/memlimit"
	"github.com/moex-project/moex/kernels"
)

// Query is one query token of MLA attention: the block table of its
// sequence and how many cached rows it attends to (decode: the sequence
// length; extend: its causal position + 1).
type Query struct {
	Table []int32
	Len   int
}

// DefaultSplitRows is the split-KV chunk length, in cached rows, when
// MLAParams.SplitRows (or a device path's) is 0: long sequences are split
// into chunks of it, attended in parallel and merged by log-sum-exp.
const DefaultSplitRows = 512

// MLAParams are MLA attention's shapes and tuning: Heads query heads,
// values the first ValueDim columns of the cached rows, the softmax Scale;
// Workers goroutines (0: GOMAXPROCS) and the split-KV chunk length
// SplitRows (0: DefaultSplitRows; results depend on it only by rounding).
type MLAParams struct {
	Heads, ValueDim int
	Scale           float32
	Workers         int
	SplitRows       int
}

// MLA is MLA attention in the absorbed form over a paged latent cache: for
// query token i and head h, with K the first queries[i].Len cached rows of
// its sequence and V their first dv columns,
//
//	out[i, h] = softmax(Scale · q[i, h]·Kᵀ) · V      [nq, Heads, ValueDim]
//	lse[i, h] = ln Σ exp(Scale · q[i, h]·Kᵀ)          [nq, Heads] (lse may be nil)
//
// q is [nq, heads, dim]. Long sequences are split into chunks computed in
// parallel and merged by log-sum-exp. Accumulation is fp32. Bad shapes,
// lengths or block-table entries give an error naming the query.
func MLA(ctx context.Context, kv Blocks, q []float32, queries []Query, p MLAParams, out, lse []float32) error {
	heads, dv, scale := p.Heads, p.ValueDim, p.Scale
	D := kv.Dim()
	nq := len(queries)
	switch {
	case heads < 1:
		return fmt.Errorf("attn: mla: %d heads", heads)
	case dv < 1 || dv > D:
		return fmt.Errorf("attn: mla: dv %d must be in [1, %d]", dv, D)
	case len(q) != nq*heads*D:
		return fmt.Errorf("attn: mla: q has %d values, want [%d queries, %d heads, %d] = %d", len(q), nq, heads, D, nq*heads*D)
	case len(out) != nq*heads*dv:
		return fmt.Errorf("attn: mla: out has %d values, want %d", len(out), nq*heads*dv)
	case lse != nil && len(lse) != nq*heads:
		return fmt.Errorf("attn: mla: lse has %d values, want %d", len(lse), nq*heads)
	case math.IsNaN(float64(scale)) || math.IsInf(float64(scale), 0):
		return fmt.Errorf("attn: mla: scale %v", scale)
	}
	if err := checkQueries(kv, queries, "mla"); err != nil {
		return err
	}
	if i := kernels.NonFinite(q); i >= 0 {
		return fmt.Errorf("attn: mla: q of query %d head %d holds %v", i/(heads*D), i/D%heads, q[i])
	}
	split := p.SplitRows
	if split <= 0 {
		split = DefaultSplitRows
	}
	// Each chunk's work item, partial output and log-sum-exp: Σ ⌈len/split⌉
	// slots, so a long prompt attended at once grows with its length
	// squared; checked before any is made.
	total := 0.0
	for _, qr := range queries {
		total += float64((qr.Len + split - 1) / split)
	}
	if err := memlimit.Check(fmt.Sprintf("attn: mla: %d queries in %.0f chunks of %d rows", nq, total, split),
		total*(float64(heads)*float64(4*dv+8)+32)); err != nil {
		return err
	}
	// Work items: (query, chunk of rows, group of heads). A few items (a
	// decode step) are split by heads too, in groups of at least 4, so
	// that every worker has some; a head's bits do not depend on its group.
	chunks := int(total)
	groups := 1
	workers := p.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	for chunks*groups < 4*workers && heads%(2*groups) == 0 && heads/(2*groups) >= 4 {
		groups *= 2
	}
	per := heads / groups
	type item struct{ q, r0, r1, slot, h0 int }
	items := make([]item, 0, chunks*groups)
	chunksOf := make([]int, nq)
	firstSlot := make([]int, nq)
	slots := 0
	for i, qr := range queries {
		if i%4096 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		firstSlot[i] = slots
		for r := 0; r < qr.Len; r += split {
			for h0 := 0; h0 < heads; h0 += per {
				items = append(items, item{i, r, min(r+split, qr.Len), slots, h0})
			}
			slots++
			chunksOf[i]++
		}
	}
	sc := mlaPool.Get().(*mlaScratch)
	defer mlaPool.Put(sc)
	partO := buffers.Grow(&sc.o, slots*heads*dv) // every slot written by its chunk
	partL := buffers.Grow(&sc.l, slots*heads)
	errs := make([]error, len(items))
	err := kernels.Parallel(ctx, p.Workers, len(items), func(k int) {
		it := items[k]
		h0, h1 := it.h0, it.h0+per
		errs[k] = attendChunk(kv, q[(it.q*heads+h0)*D:(it.q*heads+h1)*D], queries[it.q].Table, it.r0, it.r1, per, dv, scale,
			partO[(it.slot*heads+h0)*dv:(it.slot*heads+h1)*dv], partL[it.slot*heads+h0:it.slot*heads+h1])
	})
	if err == nil {
		err = firstError(errs)
	}
	if err != nil {
		return err
	}
	// Merge each query's chunks by log-sum-exp.
	for i := range queries {
		if i%4096 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		s0, n := firstSlot[i], chunksOf[i]
		for h := 0; h < heads; h++ {
			m := math.Inf(-1)
			for c := 0; c < n; c++ {
				m = math.Max(m, partL[(s0+c)*heads+h])
			}
			var sum float64
			for c := 0; c < n; c++ {
				sum += math.Exp(partL[(s0+c)*heads+h] - m)
			}
			total := m + math.Log(sum)
			o := out[(i*heads+h)*dv : (i*heads+h+1)*dv]
			clear(o)
			for c := 0; c < n; c++ {
				w := float32(math.Exp(partL[(s0+c)*heads+h] - total))
				po := partO[((s0+c)*heads+h)*dv:][:dv]
				for j := range o {
					o[j] += float32(w * po[j])
				}
			}
			if lse != nil {
				lse[i*heads+h] = float32(total)
			}
		}
	}
	return checkOutput(kv, queries, out, heads, dv)
}

// checkQueries checks that every query attends to at least one row and
// that its block table covers them with blocks of kv. Each table's entries
// are checked once, as far as its longest query reads: the queries of a
// prompt share one table, and checking it query by query would cost the
// prompt's length squared.
func checkQueries(kv Blocks, queries []Query, what string) error {
	bs := kv.BlockSize()
	checked := map[*int32]int{}
	for i, qr := range queries {
		if qr.Len < 1 {
			return fmt.Errorf("attn: %s: query %d attends to %d rows, need at least 1", what, i, qr.Len)
		}
		nb := (qr.Len + bs - 1) / bs
		if nb > len(qr.Table) {
			return fmt.Errorf("attn: %s: query %d needs %d rows (%d blocks), its block table has %d entries", what, i, qr.Len, nb, len(qr.Table))
		}
		head := &qr.Table[0]
		done := checked[head]
		for j := done; j < nb; j++ {
			if b := qr.Table[j]; b < 0 || int(b) >= kv.NumBlocks() {
				return fmt.Errorf("attn: %s: query %d: block table entry %d is %d, out of range [0, %d)", what, i, j, b, kv.NumBlocks())
			}
		}
		checked[head] = max(done, nb)
	}
	return nil
}

// checkOutput returns an ErrNonFinite error for the first query whose
// output holds NaN or ±Inf, naming the cache block and row of its first
// non-finite value, or saying that its rows are finite (the scores or sums
// overflowed).
func checkOutput(kv Blocks, queries []Query, out []float32, heads, dv int) error {
	if i := kernels.NonFinite(out); i >= 0 {
		v := out[i]
		qi, h := i/(heads*dv), i/dv%heads
		qr := queries[qi]
		bs, D := kv.BlockSize(), kv.Dim()
		row := make([]float32, D)
		for r := 0; r < qr.Len; r++ {
			blk := int(qr.Table[r/bs])
			kv.Block(blk).RowF32(r%bs, row)
			for c, x := range row {
				if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
					return errkind.Errorf(ErrNonFinite, "attn: mla: query %d head %d: output is %v: the latent cache holds %v at block %d row %d column %d (the query's row %d)",
						qi, h, v, x, blk, r%bs, c, r)
				}
			}
		}
		return errkind.Errorf(ErrNonFinite, "attn: mla: query %d head %d: output is %v from finite q and cache rows: the scores overflow fp32 (scale or values too large)", qi, h, v)
	}
	return nil
}

// Decode attends every step: its working memory is pooled, since fresh
// buffers each step were fresh pages to fault in (on a 2-core VM the
// attention stage took 2.5× as long until a garbage collection happened to
// recycle them).
type (
	mlaScratch struct {
		o []float32
		l []float64
	}
	chunkScratch struct {
		q, scores, probs, part []float32
		m, l                   []float64
		values                 kernels.Matrix
	}
)

var (
	mlaPool   = sync.Pool{New: func() any { return new(mlaScratch) }}
	chunkPool = sync.Pool{New: func() any { return new(chunkScratch) }}
)

// attendChunk computes one query's attention over cached rows [r0, r1)
// for heads heads (q [heads, D]): o [heads, dv] normalised within the
// chunk and lse [heads] of the chunk, with an online softmax over the
// blocks: each block's scores (the heads' dot products with its rows, in
// the kernels' order), the running maximum and sum rescaled once per
// block, and the block's values weighted by the FMA chain of a GEMM of the
// heads' probabilities with its rows' first dv columns, added to o. On
// AVX-512 the rows are read where they lie (kernels' ScoreRows and
// WeighRows, the same bits); elsewhere widened into a packed copy.
func attendChunk(kv Blocks, q []float32, table []int32, r0, r1, heads, dv int, scale float32, o []float32, lse []float64) error {
	bs, D := kv.BlockSize(), kv.Dim()
	sc := chunkPool.Get().(*chunkScratch)
	defer chunkPool.Put(sc)
	M4 := (heads + 3) &^ 3 // the in-place kernels' rows: whole 4s
	scores := buffers.Grow(&sc.scores, M4*bs)
	probs := buffers.Grow(&sc.probs, M4*bs)
	part := buffers.Grow(&sc.part, M4*dv)
	m := buffers.Grow(&sc.m, heads)
	l := buffers.Grow(&sc.l, heads)
	for h := range m {
		m[h] = math.Inf(-1)
	}
	clear(l)
	clear(o)
	inPlace := r0 < r1 && !widenOnly.Load() && kernels.InPlaceAttention(kv.Block(int(table[r0/bs])).DType, D, dv)
	qs := q
	if inPlace && M4 > heads { // q's rows padded to whole 4s
		qs = buffers.Grow(&sc.q, M4*D)
		copy(qs, q)
		clear(qs[heads*D:])
	}
	values := sc.values
	defer func() { sc.values = values }()
	for r := r0; r < r1; {
		blk := kv.Block(int(table[r/bs]))
		lo := r % bs
		hi := min(bs, lo+(r1-r))
		n := hi - lo
		if inPlace { // scores[h, lo+j] = q[h]·row j
			if err := blk.ScoreRows(scores[lo:], bs, qs, D, heads, lo, n, 0); err != nil {
				return err
			}
		} else {
			kernels.Down(scores, q, blk, nil, lo, hi)
		}
		for h := 0; h < heads; h++ {
			sh := scores[h*bs+lo : h*bs+hi]
			top := m[h]
			if mx, mn, ok := kernels.MaxMin(sh); ok && scale != 0 {
				// scale·v rounds monotonically: its extreme is the extreme v's
				ext := mx
				if scale < 0 {
					ext = mn
				}
				top = math.Max(top, float64(scale*ext))
			} else {
				for _, v := range sh {
					top = math.Max(top, float64(scale*v))
				}
			}
			if top > m[h] { // rescale what came before
				c := math.Exp(m[h] - top)
				l[h] *= c
				oh := o[h*dv : (h+1)*dv]
				cf := float32(c)
				for x := range oh {
					oh[x] *= cf
				}
				m[h] = top
			}
			ph := probs[h*n : (h+1)*n]
			for j, v := range sh {
				e := math.Exp(float64(scale*v) - m[h])
				l[h] += e
				ph[j] = float32(e)
			}
		}
		// o[h, x] += Σ_j probs[h, j] · row j [x], an FMA chain over the
		// block's rows from zero, added in one rounding.
		switch {
		case inPlace && heads == M4: // added to o by the kernel
			if err := blk.WeighRows(o, dv, probs, n, heads, lo, n, 0, true); err != nil {
				return err
			}
		case inPlace:
			clear(part)
			if err := blk.WeighRows(part, dv, probs, n, heads, lo, n, 0, false); err != nil {
				return err
			}
		default:
			values = kernels.PackColumns(blk, lo, hi, dv, values)
			kernels.GEMMRows(part[:heads*dv], probs[:heads*n], nil, values, nil, 0, dv)
		}
		if !inPlace || heads != M4 {
			for x, v := range part[:heads*dv] {
				o[x] += v
			}
		}
		r += n
	}
	for h := 0; h < heads; h++ {
		inv := float32(1 / l[h])
		oh := o[h*dv : (h+1)*dv]
		for x := range oh {
			oh[x] *= inv
		}
		lse[h] = m[h] + math.Log(l[h])
	}
	return nil
}
