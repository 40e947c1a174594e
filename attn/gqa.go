package attn

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	"github.com/moex-project/moex/internal/buffers"
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
// q is [nq, Heads, KeyDim]. Scores and the weighted sums are fp32 in the
// kernels' fixed orders, the softmax's maximum and sum float64 (see
// attendGQA); a query's bits depend on nothing but its own q, rows and
// range. Bad shapes, lengths or block
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
	if i := kernels.NonFinite(q); i >= 0 {
		return errkind.Errorf(ErrNonFinite, "attn: gqa: q of query %d head %d holds %v", i/(p.Heads*p.KeyDim), i/p.KeyDim%p.Heads, q[i])
	}
	items := gqaItems(queries, p)
	errs := make([]error, len(items))
	err := kernels.Parallel(ctx, p.Workers, len(items), func(k int) {
		errs[k] = attendGQA(kv, q, queries, items[k], p, out)
	})
	if err == nil {
		err = firstError(errs)
	}
	if err != nil {
		return err
	}
	if i := kernels.NonFinite(out); i >= 0 {
		return errkind.Errorf(ErrNonFinite, "attn: gqa: query %d head %d: output is %v (a non-finite cache row, or scores that overflow)",
			i/(p.Heads*p.ValueDim), i/p.ValueDim%p.Heads, out[i])
	}
	return nil
}

// gqaTileRows is the query rows (queries × the heads of one key/value
// head) a tile of grouped-query attention holds: its keys and values are
// widened once for them all.
const gqaTileRows = 64

// gqaChunkRows is the rows of one step of grouped-query attention's online
// softmax: chunks of the sequence aligned to multiples of it, whatever the
// cache's block size, the tile or the query's range, so that none of
// these changes a bit. 256 rows (a key/value head's chunk 256 KiB in fp32
// at a head dimension of 128) took 9 % less time than 64 at 576 rows
// (BenchmarkGQA, decode and prefill).
const gqaChunkRows = 256

// gqaItem is one unit of grouped-query attention's work: queries [q0, q1),
// consecutive and of one sequence (one block table), and their heads that
// read key/value head g.
type gqaItem struct{ q0, q1, g int }

// gqaItems splits the queries into tiles of one sequence's consecutive
// queries, at most gqaTileRows query rows each, times the key/value heads.
// A tile changes no output's bits (see attendGQA).
func gqaItems(queries []Query, p GQAParams) []gqaItem {
	per := max(1, gqaTileRows/(p.Heads/p.KVHeads))
	var items []gqaItem
	for q0 := 0; q0 < len(queries); {
		q1 := q0 + 1
		for q1 < len(queries) && q1-q0 < per && sameTable(queries[q1].Table, queries[q0].Table) {
			q1++
		}
		for g := 0; g < p.KVHeads; g++ {
			items = append(items, gqaItem{q0, q1, g})
		}
		q0 = q1
	}
	return items
}

// sameTable: a and b are one block table (setTables gives a sequence's
// queries one slice).
func sameTable(a, b []int32) bool {
	return len(a) > 0 && len(b) > 0 && &a[0] == &b[0]
}

type gqaAttnScratch struct {
	q, k, scores, probs, part, o []float32
	m, l, e                      []float64
	lo, hi                       []int
	values                       kernels.Matrix
	runs, next                   []blockRun
}

var gqaAttnPool = sync.Pool{New: func() any { return new(gqaAttnScratch) }}

// attendGQA computes item it: for each of its queries and each query head
// of its key/value head, an online softmax over the chunks of rows its
// queries read (gqaChunkRows, aligned). Per chunk: the scores q·k, each an
// fp32 dot product in the kernels' fixed order (kernels.ScoreRows on the
// keys where they lie, on AVX-512; elsewhere kernels.Down over the keys
// widened to fp32 once for the tile: the same bits); the running maximum
// and sum in float64, the probabilities rounded to fp32; the values
// weighted by an fp32 FMA chain over the chunk's rows in ascending order
// (kernels.WeighRows, or one GEMM over the values packed) and added to the
// output row. Rows
// outside a query's range weigh exactly zero and chunks outside it are
// skipped, so a query's bits depend neither on its tile nor on the cache's
// block size. Sinks join each denominator at the end.
func attendGQA(kv Blocks, q []float32, queries []Query, it gqaItem, p GQAParams, out []float32) error {
	group := p.Heads / p.KVHeads
	kd, vd := p.KeyDim, p.ValueDim
	nQ := it.q1 - it.q0
	M := nQ * group
	sc := gqaAttnPool.Get().(*gqaAttnScratch)
	defer gqaAttnPool.Put(sc)
	M4 := (M + 3) &^ 3 // the in-place kernels' rows: whole 4s
	qs := buffers.Grow(&sc.q, M4*kd)
	clear(qs[M*kd:])
	o := buffers.Grow(&sc.o, M*vd)
	part := buffers.Grow(&sc.part, M4*vd)
	scores := buffers.Grow(&sc.scores, M4*gqaChunkRows)
	probs := buffers.Grow(&sc.probs, M4*gqaChunkRows)
	m := buffers.Grow(&sc.m, M)
	ebuf := buffers.Grow(&sc.e, gqaChunkRows)
	l := buffers.Grow(&sc.l, M)
	lo := buffers.Grow(&sc.lo, nQ)
	hi := buffers.Grow(&sc.hi, nQ)
	clear(o)
	clear(l)
	rowLo, rowHi := math.MaxInt, 0
	for i := range nQ {
		qr := queries[it.q0+i]
		lo[i], hi[i] = 0, qr.Len
		if p.Window > 0 {
			lo[i] = max(0, qr.Len-p.Window)
		}
		rowLo, rowHi = min(rowLo, lo[i]), max(rowHi, hi[i])
		src := q[((it.q0+i)*p.Heads+it.g*group)*kd:][:group*kd]
		copy(qs[i*group*kd:], src)
	}
	for r := range m {
		m[r] = math.Inf(-1)
	}
	table := queries[it.q0].Table
	scale := float64(p.Scale)
	kOff, vOff := it.g*kd, p.KVHeads*kd+it.g*vd
	chunk := func(r int) int { return min((r/gqaChunkRows+1)*gqaChunkRows, rowHi) - r }
	inPlace := false
	cur, next := sc.runs[:0], sc.next[:0] // the chunk's runs of rows in a block, and the next chunk's
	if rowLo < rowHi {
		next = chunkRuns(kv, table, rowLo, chunk(rowLo), next)
		prefetchRuns(next, kOff, kd, vOff, vd)
		inPlace = !widenOnly.Load() && kernels.InPlaceAttention(next[0].blk.DType, kd, vd)
	}
	defer func() { // the blocks' matrices, which hold the cache, let go
		clear(cur[:cap(cur)])
		clear(next[:cap(next)])
		sc.runs, sc.next = cur[:0], next[:0]
	}()
	// runs calls f on each run of the chunk.
	runs := func(f func(blk kernels.Matrix, b0, cnt, j int) error) error {
		for _, u := range cur {
			if err := f(u.blk, u.b0, u.cnt, u.j); err != nil {
				return err
			}
		}
		return nil
	}
	var vals kernels.Matrix
	for r := rowLo; r < rowHi; {
		n := chunk(r)
		cur, next = next, cur[:0]
		var err error
		if inPlace { // scores[row, j] = q[row]·key j, the keys read where they lie
			err = runs(func(blk kernels.Matrix, b0, cnt, j int) error {
				return blk.ScoreRows(scores[j:], n, qs, kd, M, b0, cnt, kOff)
			})
		} else { // the keys widened, the values packed as a GEMM's weights
			kbuf := buffers.Grow(&sc.k, gqaChunkRows*kd)
			vals = kernels.NewPackedF32(vd, n, sc.values)
			sc.values = vals
			err = runs(func(blk kernels.Matrix, b0, cnt, j int) error {
				blk.SpanRowsF32(b0, cnt, kOff, kd, kbuf[j*kd:])
				return vals.PackRows(blk, b0, cnt, vOff, j)
			})
			if err == nil {
				keys, _ := kernels.NewF32(n, kd, kbuf[:n*kd])
				kernels.Down(scores[:M*n], qs[:M*kd], keys, nil, 0, n)
			}
		}
		if err != nil {
			return err
		}
		if r+n < rowHi { // the next chunk's rows come in while this one's are weighed
			next = chunkRuns(kv, table, r+n, chunk(r+n), next)
			prefetchRuns(next, kOff, kd, vOff, vd)
		}
		used := false
		for i := range nQ {
			j0, j1 := max(lo[i]-r, 0), min(hi[i]-r, n) // this query's rows in the chunk
			for hh := range group {
				row := i*group + hh
				ph := probs[row*n : (row+1)*n]
				if j0 >= j1 || m[row] != m[row] { // outside its range, or poisoned
					clear(ph)
					continue
				}
				used = true
				sh := scores[row*n : (row+1)*n]
				top, finite := m[row], true
				if scale != 0 { // the products are exact: the extreme score's is the largest
					mx, mn, ok := kernels.MaxMin(sh[j0:j1])
					ext := mx
					if scale < 0 {
						ext = mn
					}
					finite = ok
					top = max(top, float64(ext)*scale)
				} else {
					for _, v := range sh[j0:j1] {
						f := float64(v) * scale
						if f > top {
							top = f
						}
						finite = finite && f-f == 0
					}
				}
				if !finite { // a non-finite key: the row's output is NaN, which GQA reports
					m[row] = math.NaN()
					clear(ph)
					continue
				}
				if top > m[row] { // rescale what came before
					c := math.Exp(m[row] - top)
					l[row] *= c
					scaleRow(o[row*vd:(row+1)*vd], float32(c))
					m[row] = top
				}
				clear(ph[:j0])
				clear(ph[j1:])
				es := ebuf[:j1-j0]
				kernels.ExpShifted(es, sh[j0:j1], scale, m[row])
				l[row] += sum4(es)
				for j, e := range es {
					ph[j0+j] = float32(e)
				}
			}
		}
		if used {
			if inPlace { // the chain from zero over the chunk's rows, as GEMMRows'
				clear(part)
				if err := runs(func(blk kernels.Matrix, b0, cnt, j int) error {
					return blk.WeighRows(part, vd, probs[j:], n, M, b0, cnt, vOff, false)
				}); err != nil {
					return err
				}
			} else {
				kernels.GEMMRows(part[:M*vd], probs[:M*n], nil, vals, nil, 0, vd)
			}
			for x, v := range part[:M*vd] {
				o[x] += v
			}
		}
		r += n
	}
	for i := range nQ {
		for hh := range group {
			row, h := i*group+hh, it.g*group+hh
			dst := out[((it.q0+i)*p.Heads+h)*vd:][:vd]
			if m[row] != m[row] { // a non-finite score
				for x := range dst {
					dst[x] = float32(math.NaN())
				}
				continue
			}
			sum := l[row]
			if p.Sinks != nil { // a logit in the denominator alone
				s := float64(p.Sinks[h])
				if s > m[row] {
					c := math.Exp(m[row] - s)
					sum, m[row] = sum*c+1, s
					scaleRow(o[row*vd:(row+1)*vd], float32(c))
				} else {
					sum += math.Exp(s - m[row])
				}
			}
			inv := float32(1 / sum)
			for x, v := range o[row*vd : (row+1)*vd] {
				dst[x] = v * inv
			}
		}
	}
	return nil
}

// blockRun is rows [b0, b0+cnt) of a cache block, rows [j, j+cnt) of a
// chunk.
type blockRun struct {
	blk        kernels.Matrix
	b0, cnt, j int
}

// chunkRuns appends to dst the runs of rows [r, r+n) of a sequence (its
// block table), one a block.
func chunkRuns(kv Blocks, table []int32, r, n int, dst []blockRun) []blockRun {
	bs := kv.BlockSize()
	for j := 0; j < n; {
		b0 := (r + j) % bs
		cnt := min(bs-b0, n-j)
		dst = append(dst, blockRun{kv.Block(int(table[(r+j)/bs])), b0, cnt, j})
		j += cnt
	}
	return dst
}

// prefetchRuns asks for the keys (columns [kOff, kOff+kd)) and values
// ([vOff, vOff+vd)) of runs to be brought into the caches: a head's runs
// in a cache row are short and far apart, so that read one by one each
// waits on memory (a decode step of GQA at 576 rows took 264 µs with the
// cache out of L3, 154 µs in it).
func prefetchRuns(runs []blockRun, kOff, kd, vOff, vd int) {
	for _, u := range runs {
		u.blk.PrefetchRows(u.b0, u.cnt, kOff, kd)
		u.blk.PrefetchRows(u.b0, u.cnt, vOff, vd)
	}
}

// widenOnly makes both attentions widen the cache where they could read
// it in place (a test's switch: the two ways must give the same bits).
var widenOnly atomic.Bool

// firstError is the first non-nil of errs, or nil.
func firstError(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// scaleRow multiplies o by c, in place.
func scaleRow(o []float32, c float32) {
	for x := range o {
		o[x] *= c
	}
}

// sum4 is the sum of es in four interleaved chains (es[i] in chain i % 4),
// then (c0 + c1) + (c2 + c3): a fixed order, four additions in flight.
func sum4(es []float64) float64 {
	var c0, c1, c2, c3 float64
	i := 0
	for ; i+4 <= len(es); i += 4 {
		c0 += es[i]
		c1 += es[i+1]
		c2 += es[i+2]
		c3 += es[i+3]
	}
	switch len(es) - i {
	case 3:
		c2 += es[i+2]
		fallthrough
	case 2:
		c1 += es[i+1]
		fallthrough
	case 1:
		c0 += es[i]
	}
	return (c0 + c1) + (c2 + c3)
}
