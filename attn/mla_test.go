package attn_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/internal/memlimit"
	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// fillCache appends random rows for sequences of the given lengths, in an
// interleaved order so that block tables are scattered, and returns the
// rows as the cache holds them (widened).
func fillCache(t *testing.T, c *attn.Cache, rng *rand.Rand, lens []int) [][][]float64 {
	t.Helper()
	D := c.Dim()
	rows := make([][][]float64, len(lens))
	for done := false; !done; {
		done = true
		for s, L := range lens {
			have := len(rows[s])
			if have == L {
				continue
			}
			done = false
			n := min(L-have, 1+rng.IntN(100))
			v := make([]float32, n*D)
			for i := range v {
				v[i] = float32(rng.NormFloat64())
			}
			require.NoError(t, c.Append(s, v))
			for i := 0; i < n; i++ {
				r := make([]float64, D)
				for x := range r {
					r[x] = float64(v[i*D+x])
				}
				rows[s] = append(rows[s], r)
			}
		}
	}
	// Read back what the cache stores (bf16 rounds).
	for s := range lens {
		table := c.BlockTable(s)
		for i := range rows[s] {
			blk := c.Block(int(table[i/c.BlockSize()]))
			for x := range rows[s][i] {
				rows[s][i][x] = float64(blk.At(i%c.BlockSize(), x))
			}
		}
	}
	return rows
}

func TestMLADecodeMatchesReference(t *testing.T) {
	const heads, D, dv = 16, 576, 512
	scale := 1 / math.Sqrt(192.0)
	lens := []int{1, 64, 65, 3000, 129, 7}
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
		for _, impl := range kernels.Implementations() {
			t.Run(fmt.Sprintf("%v/%s", dt, impl), func(t *testing.T) {
				restore, err := kernels.Use(impl)
				require.NoError(t, err)
				defer restore()
				rng := rand.New(rand.NewPCG(7, uint64(dt)))
				c, err := attn.NewCache(80, 64, D, dt)
				require.NoError(t, err)
				rows := fillCache(t, c, rng, lens)
				q := make([]float32, len(lens)*heads*D)
				for i := range q {
					q[i] = float32(rng.NormFloat64())
				}
				queries := make([]attn.Query, len(lens))
				for s, L := range lens {
					queries[s] = attn.Query{Table: c.BlockTable(s), Len: L}
				}
				out := make([]float32, len(lens)*heads*dv)
				lse := make([]float32, len(lens)*heads)
				require.NoError(t, attn.MLA(context.Background(), c, q, queries, attn.MLAParams{Heads: heads, ValueDim: dv, Scale: float32(scale), SplitRows: 256}, out, lse))
				for s := range lens {
					o, l := moetest.MLA(rows[s], q[s*heads*D:(s+1)*heads*D], heads, D, dv, float64(float32(scale)))
					require.LessOrEqual(t, moetest.RelErr(out[s*heads*dv:(s+1)*heads*dv], o), 1e-5, "sequence %d (len %d) out", s, lens[s])
					require.LessOrEqual(t, moetest.RelErr(lse[s*heads:(s+1)*heads], l), 1e-5, "sequence %d lse", s)
				}
				// The split changes only rounding.
				whole := make([]float32, len(out))
				require.NoError(t, attn.MLA(context.Background(), c, q, queries, attn.MLAParams{Heads: heads, ValueDim: dv, Scale: float32(scale), SplitRows: 1 << 20, Workers: 1}, whole, nil))
				require.LessOrEqual(t, relErrF32(out, whole), 1e-6)
			})
		}
	}
}

func relErrF32(a, b []float32) float64 {
	w := make([]float64, len(b))
	for i, v := range b {
		w[i] = float64(v)
	}
	return moetest.RelErr(a, w)
}

// TestMLAExtendIsCausal: several new tokens of one sequence, each
// attending to the rows up to its own position.
func TestMLAExtendIsCausal(t *testing.T) {
	const heads, D, dv = 4, 64, 48
	rng := rand.New(rand.NewPCG(3, 3))
	c, err := attn.NewCache(8, 16, D, kernels.F32)
	require.NoError(t, err)
	rows := fillCache(t, c, rng, []int{70})
	const S = 5 // the last five rows are the new tokens
	q := make([]float32, S*heads*D)
	for i := range q {
		q[i] = float32(rng.NormFloat64())
	}
	queries := make([]attn.Query, S)
	for j := range queries {
		queries[j] = attn.Query{Table: c.BlockTable(0), Len: 70 - S + j + 1}
	}
	out := make([]float32, S*heads*dv)
	require.NoError(t, attn.MLA(context.Background(), c, q, queries, attn.MLAParams{Heads: heads, ValueDim: dv, Scale: 0.125, SplitRows: 32}, out, nil))
	for j := 0; j < S; j++ {
		o, _ := moetest.MLA(rows[0][:70-S+j+1], q[j*heads*D:(j+1)*heads*D], heads, D, dv, 0.125)
		require.LessOrEqual(t, moetest.RelErr(out[j*heads*dv:(j+1)*heads*dv], o), 1e-5, "new token %d", j)
	}
}

func TestMLABadInput(t *testing.T) {
	c, err := attn.NewCache(4, 8, 16, kernels.F32)
	require.NoError(t, err)
	require.NoError(t, c.Append(0, make([]float32, 10*16)))
	table := c.BlockTable(0)
	q := make([]float32, 2*16)
	out := make([]float32, 2*17)
	ctx := context.Background()
	run := func(qs []attn.Query, q []float32, dv int) error {
		return attn.MLA(ctx, c, q, qs, attn.MLAParams{Heads: 2, ValueDim: dv, Scale: 1}, out[:2*dv*len(qs)], nil)
	}
	require.ErrorContains(t, run([]attn.Query{{table, 0}}, q, 8), "query 0 attends to 0 rows")
	require.ErrorContains(t, run([]attn.Query{{table, 17}}, q, 8), "query 0 needs 17 rows (3 blocks), its block table has 2 entries")
	require.ErrorContains(t, run([]attn.Query{{[]int32{0, -1}, 12}}, q, 8), "block table entry 1 is -1, out of range [0, 4)")
	require.ErrorContains(t, run([]attn.Query{{table, 5}}, q, 17), "dv 17 must be in [1, 16]")
	require.ErrorContains(t, run([]attn.Query{{table, 5}}, q[:5], 8), "q has 5 values")
	bad := append([]float32(nil), q...)
	bad[20] = float32(math.Inf(1))
	require.ErrorContains(t, run([]attn.Query{{table, 5}}, bad, 8), "q of query 0 head 1 holds +Inf")
}

func TestLatentCache(t *testing.T) {
	c, err := attn.NewCache(3, 4, 2, kernels.BF16)
	require.NoError(t, err)
	require.EqualValues(t, 3*4*2*2, c.BytesTotal())
	require.NoError(t, c.Append(1, make([]float32, 5*2))) // 2 blocks
	require.NoError(t, c.Append(2, make([]float32, 2*2))) // 1 block
	require.EqualValues(t, c.BytesTotal(), c.BytesUsed())
	err = c.Append(2, make([]float32, 3*2)) // needs a second block: none left
	require.ErrorContains(t, err, "cache exhausted: sequence 2 needs 1 more blocks, 0 of 3 are free")
	require.ErrorIs(t, err, attn.ErrCacheExhausted)
	require.Equal(t, 2, c.Len(2), "a failed append changes nothing")
	require.ErrorContains(t, c.Append(3, make([]float32, 3)), "not whole rows")
	freed := c.BlockTable(1)
	require.NoError(t, c.Free(1))
	require.ErrorContains(t, c.Free(1), "sequence 1 is not in the cache")
	require.EqualValues(t, 4*2*2, c.BytesUsed())
	require.NoError(t, c.Append(3, make([]float32, 8*2)))
	require.ElementsMatch(t, freed, c.BlockTable(3), "freed blocks are reused")
	require.Equal(t, 8, c.Len(3))
	_, err = attn.NewCache(1, 1, 1, kernels.F8E4M3)
	require.ErrorContains(t, err, "cache dtype F8_E4M3")
}

// TestLatentCacheShare: blocks shared out of a sequence outlive it, a
// sequence attached to them reads their rows and writes only blocks of its
// own, and a block is free only when its last reference goes.
func TestLatentCacheShare(t *testing.T) {
	c, err := attn.NewCache(6, 2, 1, kernels.F32)
	require.NoError(t, err)
	require.NoError(t, c.Append(1, []float32{1, 2, 3, 4, 5})) // blocks: [1 2] [3 4] [5 _]
	_, err = c.Share(1, 0, 3)
	require.EqualError(t, err, "attn: sharing blocks [0, 3) of sequence 1: it holds 2 whole blocks")
	shared, err := c.Share(1, 0, 2)
	require.NoError(t, err)
	require.Equal(t, c.BlockTable(1)[:2], shared)
	require.NoError(t, c.Free(1))
	require.Equal(t, 6-2, c.FreeBlocks(), "the shared blocks outlive their sequence; its third is free")
	for _, b := range shared {
		require.Equal(t, 1, c.Refs(int(b)))
	}

	require.NoError(t, c.Attach(2, shared))
	require.Equal(t, 4, c.Len(2))
	require.ErrorContains(t, c.Attach(2, shared), "sequence 2, which is in the cache already")
	require.NoError(t, c.Append(2, []float32{9}))
	table := c.BlockTable(2)
	require.Equal(t, shared, table[:2])
	require.NotContains(t, shared, table[2], "new rows go to a block of its own")
	for i, want := range []float32{1, 2, 3, 4} {
		require.Equal(t, want, c.Block(int(shared[i/2])).At(i%2, 0), "shared rows unchanged")
	}
	require.Equal(t, float32(9), c.Block(int(table[2])).At(0, 0))
	require.EqualError(t, c.Truncate(2, 3), "attn: truncating sequence 2 to 3 rows would cut into block "+
		fmt.Sprint(shared[1])+", which is shared")
	require.NoError(t, c.Truncate(2, 4), "back to the shared blocks: allowed")

	require.NoError(t, c.Release(shared))
	require.Equal(t, 6-2, c.FreeBlocks(), "still held by sequence 2")
	require.ErrorContains(t, c.Release(shared), "is shared 0 times, fewer than it is given")
	again, err := c.Share(2, 0, 1)
	require.NoError(t, err)
	require.ErrorContains(t, c.Release([]int32{again[0], again[0]}), "is shared 1 times, fewer than it is given")
	require.NoError(t, c.Release(again))
	require.ErrorContains(t, c.Release([]int32{6}), "block 6 out of range [0, 6)")
	free := c.FreeBlocks()
	require.ErrorContains(t, c.Attach(3, []int32{5}), "block 5 is shared 0 times")
	require.Equal(t, free, c.FreeBlocks(), "a refused attach changes nothing")
	require.NoError(t, c.Free(2))
	require.Equal(t, 6, c.FreeBlocks())
}

// TestLatentCacheReserve: rows reserved for a device and filled afterwards
// leave the cache as appending them would; their blocks are marked changed
// for other copies, not for the copy that wrote them; Truncate takes them
// back.
func TestLatentCacheReserve(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	rows := make([]float32, 7*3)
	for i := range rows {
		rows[i] = float32(rng.NormFloat64())
	}
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
		app, err := attn.NewCache(4, 4, 3, dt)
		require.NoError(t, err)
		res, err := attn.NewCache(4, 4, 3, dt)
		require.NoError(t, err)
		require.NoError(t, app.Append(5, rows[:2*3]))
		require.NoError(t, res.Append(5, rows[:2*3]))
		seen := make([]uint64, 4)
		synced := func() []int {
			var blocks []int
			require.NoError(t, res.Changed(seen, func(block int, _ []byte) error { blocks = append(blocks, block); return nil }))
			return blocks
		}
		require.Equal(t, []int{0}, synced())
		require.NoError(t, app.Append(5, rows[2*3:]))
		slots, err := res.Reserve(5, 5)
		require.NoError(t, err)
		require.Equal(t, []int32{2, 3, 4, 5, 6}, slots, "rows 2, 3 of block 0, then block 1")
		require.Equal(t, 7, res.Len(5))
		require.Equal(t, app.BlockTable(5), res.BlockTable(5))
		fresh := make([]uint64, 4) // a copy made now
		require.NoError(t, res.Fill(slots, rows[2*3:], seen))
		require.Empty(t, synced(), "the copy that wrote the rows is up to date")
		var blocks []int
		require.NoError(t, res.Changed(fresh, func(block int, _ []byte) error { blocks = append(blocks, block); return nil }))
		require.Equal(t, []int{0, 1}, blocks, "a new copy gets every block holding rows, the device-written one included")
		for b := 0; b < 2; b++ {
			want, got := app.Block(b), res.Block(b)
			for r := 0; r < 4; r++ {
				w, g := make([]float32, 3), make([]float32, 3)
				want.RowF32(r, w)
				got.RowF32(r, g)
				require.Equal(t, w, g, "%v block %d row %d", dt, b, r)
			}
		}
		_, err = res.Reserve(6, 9) // 3 blocks; 2 are free
		require.ErrorContains(t, err, "cache exhausted: sequence 6 needs 3 more blocks, 2 of 4 are free")
		require.Zero(t, res.Len(6))
		require.ErrorContains(t, res.Fill([]int32{1, 16}, rows[:6], nil), "slot 16 out of range [0, 16)")
		require.Equal(t, blockRows(app, 0), blockRows(res, 0), "a bad slot is found before any row is written")
		require.ErrorContains(t, res.Fill([]int32{1}, rows[:4], nil), "4 values for 1 rows of 3")
		require.ErrorContains(t, res.Fill([]int32{1}, rows[:3], make([]uint64, 3)), "3 block versions for a cache of 4 blocks")

		// Truncate: back to 3 rows frees block 1; to 0 removes the sequence.
		require.NoError(t, res.Truncate(5, 3))
		require.Equal(t, 3, res.Len(5))
		require.Equal(t, app.BlockTable(5)[:1], res.BlockTable(5))
		more, err := res.Reserve(7, 12) // three blocks: the freed one is back
		require.NoError(t, err)
		require.Len(t, more, 12)
		require.NoError(t, res.Truncate(7, 0))
		require.Zero(t, res.Len(7))
		require.ErrorContains(t, res.Truncate(5, 4), "truncating sequence 5 to 4 rows: it has 3")
		require.ErrorContains(t, res.Truncate(8, 0), "truncating sequence 8 to 0 rows: it has 0")
	}
}

// blockRows reads block b of c.
func blockRows(c *attn.Cache, b int) []float32 {
	m := c.Block(b)
	out := make([]float32, m.Rows*m.Cols)
	for r := 0; r < m.Rows; r++ {
		m.RowF32(r, out[r*m.Cols:(r+1)*m.Cols])
	}
	return out
}

// TestNonFiniteCache: rows with NaN or ±Inf (or, in a bf16 or fp16 cache,
// past its range) are refused and change nothing; an attention output that
// comes out non-finite is an ErrNonFinite error naming the cache block and
// row that hold the value, or saying that the rows were finite.
func TestNonFiniteCache(t *testing.T) {
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16, kernels.F16} {
		c, err := attn.NewCache(4, 4, 3, dt)
		require.NoError(t, err)
		require.NoError(t, c.Append(0, []float32{1, 2, 3}))
		rows := []float32{1, 2, 3, 4, float32(math.NaN()), 6}
		err = c.Append(0, rows)
		require.ErrorIs(t, err, attn.ErrNonFinite)
		require.EqualError(t, err, "attn: latent row 1 of sequence 0 holds NaN at column 1")
		require.Equal(t, 1, c.Len(0), "a refused append changes nothing")
		slots, err := c.Reserve(0, 1)
		require.NoError(t, err)
		require.EqualError(t, c.Fill(slots, []float32{0, float32(math.Inf(-1)), 0}, nil), "attn: latent row 0 of a fill holds -Inf at column 1")
		big := []float32{math.MaxFloat32, 0, 0}
		switch dt {
		case kernels.BF16:
			require.EqualError(t, c.Append(1, big), "attn: latent row 0 of sequence 1 holds 3.4028235e+38 at column 0, past bf16's range")
		case kernels.F16:
			// fp16's largest value is 65504; from 65520 up a value
			// rounds to infinity.
			require.EqualError(t, c.Append(1, []float32{0, -65520, 0}), "attn: latent row 0 of sequence 1 holds -65520 at column 1, past fp16's range")
			require.NoError(t, c.Append(1, []float32{65519, -65504, 0}))
			got := make([]float32, 3)
			c.Block(int(c.BlockTable(1)[0])).RowF32(0, got)
			require.Equal(t, []float32{65504, -65504, 0}, got)
		default:
			require.NoError(t, c.Append(1, big))
		}
	}

	// A cache filled behind the API's back (DenseBlocks, a caller's
	// memory): the output check names the block and row.
	const D, bs = 4, 2
	kv := attn.DenseBlocks{Data: make([]float32, 3*bs*D), NBlocks: 3, BlockRows: bs, Width: D}
	for i := range kv.Data {
		kv.Data[i] = 0.25
	}
	kv.Data[(2*bs+1)*D+3] = float32(math.NaN()) // block 2, row 1, column 3
	q := []float32{1, 1, 1, 1}
	out := make([]float32, D)
	mla := func(qs []attn.Query) error {
		return attn.MLA(context.Background(), kv, q, qs, attn.MLAParams{Heads: 1, ValueDim: D, Scale: 1}, out, nil)
	}
	require.NoError(t, mla([]attn.Query{{Table: []int32{0, 1}, Len: 4}}))
	err := mla([]attn.Query{{Table: []int32{0, 2}, Len: 4}})
	require.ErrorIs(t, err, attn.ErrNonFinite)
	require.EqualError(t, err, "attn: mla: query 0 head 0: output is NaN: the latent cache holds NaN at block 2 row 1 column 3 (the query's row 3)")
	// Finite rows whose scores overflow fp32.
	kv.Data[(2*bs+1)*D+3] = 0.25
	for i := range kv.Data[:bs*D] {
		kv.Data[i] = 1e30
	}
	q = []float32{1e30, 1e30, 1e30, 1e30}
	err = mla([]attn.Query{{Table: []int32{0, 2}, Len: 4}})
	require.ErrorIs(t, err, attn.ErrNonFinite)
	require.ErrorContains(t, err, "from finite q and cache rows: the scores overflow fp32")
}

// TestMLAMemoryChecked: the chunks' partial outputs grow with the queries'
// lengths; past the memory limit MLA refuses before allocating them.
func TestMLAMemoryChecked(t *testing.T) {
	const D, bs = 4, 16
	kv := attn.DenseBlocks{Data: make([]float32, bs*D), NBlocks: 1, BlockRows: bs, Width: D}
	queries := make([]attn.Query, 100)
	for i := range queries {
		queries[i] = attn.Query{Table: make([]int32, 5000/bs+1), Len: 5000} // every row in block 0
	}
	q := make([]float32, len(queries)*D)
	out := make([]float32, len(queries)*D)
	prev := memlimit.Set(1 << 20)
	defer memlimit.Set(prev)
	err := attn.MLA(context.Background(), kv, q, queries, attn.MLAParams{Heads: 1, ValueDim: D, Scale: 1, SplitRows: 1}, out, nil)
	require.ErrorIs(t, err, memlimit.ErrTooLarge)
	require.ErrorContains(t, err, "attn: mla: 100 queries in 500000 chunks of 1 rows")
	require.NoError(t, attn.MLA(context.Background(), kv, q, queries, attn.MLAParams{Heads: 1, ValueDim: D, Scale: 1}, out, nil))
}

// TestCacheSizeCheckedFirst: a cache too large for the machine is refused,
// naming its size, before it is allocated.
func TestCacheSizeCheckedFirst(t *testing.T) {
	_, err := attn.NewCache(1<<30, 64, 576, kernels.BF16)
	require.ErrorContains(t, err, "attn: a cache of 1073741824 blocks × 64 rows × 576 values needs 73740.0 GiB, more than the ")
	require.ErrorIs(t, err, moe.ErrTooLarge)
	_, err = attn.NewCache(4, 2, 4, kernels.INT8)
	require.EqualError(t, err, "attn: cache dtype INT8 (want F32, BF16 or F16)")
}
