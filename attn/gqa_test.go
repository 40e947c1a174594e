package attn_test

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/kernels"
)

// TestGQA: two sequences over blocks of 3 rows, in fp32, bf16 and fp16 caches,
// with and without a window and sinks, against the definition: the
// softmax of the scaled scores of the rows the query sees (and its sink),
// weighting the values of its group's head.
func TestGQA(t *testing.T) {
	const heads, kvh, dk, dv = 4, 2, 6, 5
	D := kvh * (dk + dv)
	rng := rand.New(rand.NewPCG(5, 6))
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.F16} {
		c, err := attn.NewCache(12, 3, D, dt)
		require.NoError(t, err)
		lens := []int{10, 4}
		for s, n := range lens {
			rows := make([]float32, n*D)
			for i := range rows {
				rows[i] = float32(rng.NormFloat64())
			}
			require.NoError(t, c.Append(s, rows))
		}
		rowOf := func(s, r int) []float32 {
			out := make([]float32, D)
			tab := c.BlockTable(s)
			c.Block(int(tab[r/3])).RowF32(r%3, out)
			return out
		}
		queries := []attn.Query{{Table: c.BlockTable(0), Len: 10}, {Table: c.BlockTable(0), Len: 6}, {Table: c.BlockTable(1), Len: 4}}
		q := make([]float32, len(queries)*heads*dk)
		for i := range q {
			q[i] = float32(rng.NormFloat64())
		}
		for _, window := range []int{0, 3} {
			for _, sinks := range [][]float32{nil, {0.5, -1, 2, 0}} {
				p := attn.GQAParams{Heads: heads, KVHeads: kvh, KeyDim: dk, ValueDim: dv, Scale: 0.4, Window: window, Sinks: sinks}
				out := make([]float32, len(queries)*heads*dv)
				require.NoError(t, attn.GQA(context.Background(), c, q, queries, p, out))
				for i, qr := range queries {
					seq := map[int]int{0: 0, 1: 0, 2: 1}[i]
					for h := 0; h < heads; h++ {
						g := h / (heads / kvh)
						lo := 0
						if window > 0 {
							lo = max(0, qr.Len-window)
						}
						var ws []float64
						den := 0.0
						for r := lo; r < qr.Len; r++ {
							row := rowOf(seq, r)
							s := 0.0
							for x := 0; x < dk; x++ {
								s += float64(q[(i*heads+h)*dk+x]) * float64(row[g*dk+x])
							}
							ws = append(ws, math.Exp(0.4*s))
							den += ws[len(ws)-1]
						}
						if sinks != nil {
							den += math.Exp(float64(sinks[h]))
						}
						for x := 0; x < dv; x++ {
							want := 0.0
							for j, r := 0, lo; r < qr.Len; j, r = j+1, r+1 {
								want += ws[j] / den * float64(rowOf(seq, r)[kvh*dk+g*dv+x])
							}
							require.InDelta(t, want, out[(i*heads+h)*dv+x], 1e-5, "%v window %d sinks %v query %d head %d", dt, window, sinks != nil, i, h)
						}
					}
				}
			}
		}
	}
}

// TestGQATiles: a prompt's queries attended together (tiles of several
// queries over one sequence's blocks, as a prefill runs them) give each
// query the bits it gets alone (as a decode step runs it), with windows
// and sinks, whatever the cache's block size, and stay within 1e-5 of the
// float64 definition.
func TestGQATiles(t *testing.T) {
	const heads, kvh, dk, dv, n = 8, 2, 40, 24, 300 // two chunks of the online softmax
	D := kvh * (dk + dv)
	rng := rand.New(rand.NewPCG(7, 8))
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
		c, err := attn.NewCache(20, 16, D, dt)
		require.NoError(t, err)
		rows := make([]float32, n*D)
		for i := range rows {
			rows[i] = float32(rng.NormFloat64())
		}
		require.NoError(t, c.Append(0, rows))
		c7, err := attn.NewCache(43, 7, D, dt) // the same rows in blocks of 7
		require.NoError(t, err)
		require.NoError(t, c7.Append(0, rows))
		queries7 := make([]attn.Query, n)
		for i := range queries7 {
			queries7[i] = attn.Query{Table: c7.BlockTable(0), Len: i + 1}
		}
		stored := make([]float32, n*D) // the rows as the cache holds them
		tab := c.BlockTable(0)
		for r := range n {
			c.Block(int(tab[r/16])).RowF32(r%16, stored[r*D:(r+1)*D])
		}
		queries := make([]attn.Query, n)
		for i := range queries {
			queries[i] = attn.Query{Table: tab, Len: i + 1}
		}
		q := make([]float32, n*heads*dk)
		for i := range q {
			q[i] = float32(rng.NormFloat64())
		}
		for _, window := range []int{0, 270} { // a window across the chunks' boundary
			for _, sinks := range [][]float32{nil, {0.5, -1, 2, 0, 9, -3, 1, 0.25}} {
				p := attn.GQAParams{Heads: heads, KVHeads: kvh, KeyDim: dk, ValueDim: dv, Scale: 0.15, Window: window, Sinks: sinks}
				all := make([]float32, n*heads*dv)
				require.NoError(t, attn.GQA(context.Background(), c, q, queries, p, all))
				in7 := make([]float32, n*heads*dv)
				require.NoError(t, attn.GQA(context.Background(), c7, q, queries7, p, in7))
				require.Equal(t, all, in7, "%v window %d: blocks of 16 and of 7", dt, window)
				for i := range queries {
					alone := make([]float32, heads*dv)
					require.NoError(t, attn.GQA(context.Background(), c, q[i*heads*dk:(i+1)*heads*dk], queries[i:i+1], p, alone))
					require.Equal(t, alone, all[i*heads*dv:(i+1)*heads*dv], "%v window %d query %d", dt, window, i)
					lo := 0
					if window > 0 {
						lo = max(0, i+1-window)
					}
					for h := range heads {
						g := h / (heads / kvh)
						ws := make([]float64, 0, i+1)
						top, den := math.Inf(-1), 0.0
						for r := lo; r <= i; r++ {
							s := 0.0
							for x := range dk {
								s += float64(q[(i*heads+h)*dk+x]) * float64(stored[r*D+g*dk+x])
							}
							ws = append(ws, 0.15*s)
							top = math.Max(top, 0.15*s)
						}
						if sinks != nil {
							top = math.Max(top, float64(sinks[h]))
							den += math.Exp(float64(sinks[h]) - top)
						}
						for j := range ws {
							ws[j] = math.Exp(ws[j] - top)
							den += ws[j]
						}
						for x := range dv {
							want := 0.0
							for j, r := 0, lo; r <= i; j, r = j+1, r+1 {
								want += ws[j] / den * float64(stored[r*D+kvh*dk+g*dv+x])
							}
							require.InDelta(t, want, all[(i*heads+h)*dv+x], 1e-5, "%v window %d query %d head %d", dt, window, i, h)
						}
					}
				}
			}
		}
	}
}

// TestGQAErrors: bad shapes and tables are errors naming them.
func TestGQAErrors(t *testing.T) {
	c, err := attn.NewCache(2, 2, 2*(4+4), kernels.F32)
	require.NoError(t, err)
	require.NoError(t, c.Append(0, make([]float32, 2*16)))
	ok := attn.GQAParams{Heads: 2, KVHeads: 2, KeyDim: 4, ValueDim: 4, Scale: 1}
	qs := []attn.Query{{Table: c.BlockTable(0), Len: 2}}
	q, out := make([]float32, 8), make([]float32, 8)
	require.NoError(t, attn.GQA(context.Background(), c, q, qs, ok, out))
	for _, tt := range []struct {
		name string
		p    func(p *attn.GQAParams)
		q    []attn.Query
		err  string
	}{
		{"heads", func(p *attn.GQAParams) { p.Heads = 3 }, qs, "3 query heads over 2 key/value heads"},
		{"row width", func(p *attn.GQAParams) { p.KeyDim = 3 }, qs, "cache rows have 16 values"},
		{"sinks", func(p *attn.GQAParams) { p.Sinks = []float32{1} }, qs, "1 sinks for 2 heads"},
		{"window", func(p *attn.GQAParams) { p.Window = -1 }, qs, "window -1"},
		{"scale", func(p *attn.GQAParams) { p.Scale = float32(math.Inf(1)) }, qs, "scale +Inf"},
		{"empty query", func(*attn.GQAParams) {}, []attn.Query{{Table: c.BlockTable(0), Len: 0}}, "query 0 attends to 0 rows"},
		{"short table", func(*attn.GQAParams) {}, []attn.Query{{Table: c.BlockTable(0), Len: 3}}, "query 0 needs 3 rows (2 blocks)"},
		{"bad block", func(*attn.GQAParams) {}, []attn.Query{{Table: []int32{7}, Len: 1}}, "block table entry 0 is 7"},
	} {
		p := ok
		tt.p(&p)
		require.ErrorContains(t, attn.GQA(context.Background(), c, q, tt.q, p, out), tt.err, tt.name)
	}
	q[3] = float32(math.NaN())
	require.ErrorIs(t, attn.GQA(context.Background(), c, q, qs, ok, out), attn.ErrNonFinite)
}

// TestGQANonFiniteScores: finite keys and queries whose scores overflow
// (to +Inf, or to NaN as +Inf and −Inf meet) make the queries that read
// them an ErrNonFinite error naming the first, with sinks or without,
// never a finite answer; queries whose window leaves the row out are
// unaffected.
func TestGQANonFiniteScores(t *testing.T) {
	const heads, kvh, d = 4, 2, 4
	D := kvh * 2 * d
	for _, key := range [][2]float32{{3e38, 0}, {3e38, -3e38}} {
		for _, sinks := range [][]float32{nil, {0, 1, 2, 3}} {
			c, err := attn.NewCache(4, 4, D, kernels.F32)
			require.NoError(t, err)
			rows := make([]float32, 6*D)
			for i := range rows {
				rows[i] = 0.1 * float32(i%7)
			}
			rows[1*D+d+2], rows[1*D+d+3] = key[0], key[1] // row 1, key/value head 1's key
			require.NoError(t, c.Append(0, rows))
			q := make([]float32, 2*heads*d)
			for i := range q {
				q[i] = 10
			}
			tab := c.BlockTable(0)
			out := make([]float32, 2*heads*d)
			p := attn.GQAParams{Heads: heads, KVHeads: kvh, KeyDim: d, ValueDim: d, Scale: 0.5, Sinks: sinks}
			err = attn.GQA(context.Background(), c, q, []attn.Query{{Table: tab, Len: 6}, {Table: tab, Len: 3}}, p, out)
			require.ErrorIs(t, err, attn.ErrNonFinite, "key %v sinks %v", key, sinks != nil)
			require.ErrorContains(t, err, "query 0 head 2", "heads 2 and 3 read key/value head 1")
			p.Window = 3 // rows 3…5 only: the row is outside
			require.NoError(t, attn.GQA(context.Background(), c, q[:heads*d], []attn.Query{{Table: tab, Len: 6}}, p, out[:heads*d]))
		}
	}
}
