//go:build cuda || cudaemu

package dpattngpu

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// Attention computes MLA decode on a device for latent caches
// (attn.Core): each cache gets a copy there, kept in sync block by
// block from what the cache reports changed (a decode step writes one row
// per sequence: one block each), and the MLA decode kernels (split-KV, then
// the log-sum-exp merge) run over it. Safe for concurrent use: ranks with
// caches of their own may share it.
type Attention struct {
	d cuda.Launcher
	// SplitRows is the split-KV chunk length; 0: attn.DefaultSplitRows.
	SplitRows int

	mu      sync.Mutex
	mirrors map[*attn.Cache]*mirror

	proj   *projector // made by Projections
	blocks map[*attn.MLABlock]*blockOnDevice
	tmp    *cuda.ScratchPool // the eager decode's temporaries

	// With graphs enabled, each call is padded to a bucket of queries
	// (powers of two) and of KV splits (powers of two), the bucket's decode
	// captured on first use and replayed whenever the step's vote allows;
	// eager launches otherwise (and for a bucket whose capture failed).
	// Padding queries repeat the first query and are dropped; padding
	// splits are empty and add exact zeros in the merge, so a replay gives
	// the eager bits. Each bucket keeps buffers of its own for the core's
	// life. Ranks sharing the core each pass the same vote; the last one
	// stands, which is harmless either way.
	cuda.GraphMode
}

type mirror struct {
	mu     sync.Mutex
	buf    cuda.Buffer
	seen   []uint64
	graphs map[attnKey]*attnGraph
	steps  map[stepKey]*stepBucket
	dead   atomic.Bool // freed (Forget, Close): its users get a new one
}

// attnKey names a captured decode: the query bucket, the split bucket and
// the shape the kernels were given.
type attnKey struct {
	queries, splits, splitRows, heads, dv int
	scale                                 float32
}

// attnGraph is MLA decode for a bucket of queries and splits on fixed
// buffers, captured as a cuda.Graph.
type attnGraph struct {
	q, table, lens, partO, partL, o, lse cuda.Buffer
	width                                int // block-table entries per query
	graph                                cuda.Graph
	bs                                   *cuda.Buffers
}

var (
	_ moe.GraphVoter   = (*Attention)(nil)
	_ moe.GraphCounter = (*Attention)(nil)
)

var _ attn.Core = (*Attention)(nil)

// NewAttention makes the attention core of a device.
func NewAttention(d cuda.Launcher) *Attention {
	return &Attention{d: d, mirrors: map[*attn.Cache]*mirror{}, tmp: cuda.NewScratchPool(d)}
}

// Close frees the device copies of the caches and of the projections,
// after the steps running on them; a second Close does nothing.
func (a *Attention) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.proj != nil {
		a.proj.close()
	}
	for blk, b := range a.blocks {
		b.free(a.d)
		delete(a.blocks, blk)
	}
	a.tmp.Free()
	for c, m := range a.mirrors {
		m.mu.Lock() // after a step still running on it
		a.free(m)
		m.mu.Unlock()
		delete(a.mirrors, c)
	}
	return nil
}

// Forget frees c's device copy and the graphs and buffers of its buckets
// (a cache the caller is done with); c gets a new copy if used again.
func (a *Attention) Forget(c *attn.Cache) {
	a.mu.Lock()
	m := a.mirrors[c]
	delete(a.mirrors, c)
	a.mu.Unlock()
	if m != nil {
		m.mu.Lock() // after any step still running on it
		defer m.mu.Unlock()
		a.free(m)
	}
}

// lockMirror returns c's device copy, locked: a live one (a copy freed
// between the lookup and the lock is looked up again).
func (a *Attention) lockMirror(c *attn.Cache) (*mirror, error) {
	for {
		m, err := a.mirrorOf(c)
		if err != nil {
			return nil, err
		}
		m.mu.Lock()
		if !m.dead.Load() {
			return m, nil
		}
		m.mu.Unlock()
	}
}

// free releases a mirror's memory, graphs and buckets; its lock is held.
func (a *Attention) free(m *mirror) {
	m.dead.Store(true)
	for _, g := range m.graphs {
		if g != nil { // nil: a bucket that could not be captured
			g.close()
		}
	}
	for _, s := range m.steps {
		if s.graph != nil {
			s.graph.Close()
		}
		s.bs.Free()
	}
	m.graphs, m.steps = nil, nil
	a.d.Free(m.buf)
}

func (a *Attention) mirrorOf(c *attn.Cache) (*mirror, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if m := a.mirrors[c]; m != nil {
		return m, nil
	}
	if d := c.DType(); d != kernels.F32 && d != kernels.BF16 {
		return nil, fmt.Errorf("cuda: attention: the cache is %v: the device kernels read F32 or BF16 caches", d)
	}
	b, err := a.d.Alloc(c.BytesTotal())
	if err != nil {
		return nil, fmt.Errorf("cuda: attention: a device copy of the %d-byte cache: %w", c.BytesTotal(), err)
	}
	m := &mirror{buf: b, seen: make([]uint64, c.NumBlocks())}
	a.mirrors[c] = m
	return m, nil
}

// Attend computes out [queries, heads, dv] of MLA over c's device copy
// after bringing it up to date.
func (a *Attention) Attend(ctx context.Context, c *attn.Cache, q []float32, queries []attn.Query, p attn.MLAParams, out []float32) error {
	return a.attend(ctx, c, q, queries, MLAInput{Heads: p.Heads, DV: p.ValueDim, Scale: p.Scale}, out)
}

// AttendGQA computes out [queries, heads, value] of grouped-query
// attention (attn.GQA's contract) over c's device copy after bringing it
// up to date; it runs eagerly (no graph replay yet).
func (a *Attention) AttendGQA(ctx context.Context, c *attn.Cache, q []float32, queries []attn.Query, p attn.GQAParams, out []float32) error {
	return a.attend(ctx, c, q, queries, MLAInput{Heads: p.Heads, DV: p.ValueDim, Scale: p.Scale, KVHeads: p.KVHeads, KeyDim: p.KeyDim,
		ValueOff: p.KVHeads * p.KeyDim, Window: p.Window, Sinks: p.Sinks}, out)
}

// attend is Attend's and AttendGQA's work: shape's head fields set, the
// rest filled in here.
func (a *Attention) attend(ctx context.Context, c *attn.Cache, q []float32, queries []attn.Query, shape MLAInput, out []float32) error {
	heads, dv, scale := shape.Heads, shape.DV, shape.Scale
	if err := ctx.Err(); err != nil {
		return err
	}
	m, err := a.lockMirror(c)
	if err != nil {
		return err
	}
	defer m.mu.Unlock()
	if err := c.Changed(m.seen, func(block int, data []byte) error {
		return a.d.ToDeviceAt(m.buf, int64(block)*int64(len(data)), unsafe.Pointer(&data[0]), int64(len(data)))
	}); err != nil {
		return err
	}
	B := len(queries)
	maxBlocks := 1
	for _, qr := range queries {
		maxBlocks = max(maxBlocks, len(qr.Table))
	}
	in := shape
	in.Q, in.BlockSize, in.D, in.BlockTable, in.MaxBlocks = q, c.BlockSize(), c.Dim(), make([]int32, B*maxBlocks), maxBlocks
	in.SeqLens, in.Heads, in.DV, in.SplitRows, in.Scale = make([]int32, B), heads, dv, a.SplitRows, scale
	if in.SplitRows == 0 {
		in.SplitRows = attn.DefaultSplitRows
	}
	for i, qr := range queries {
		copy(in.BlockTable[i*maxBlocks:], qr.Table)
		in.SeqLens[i] = int32(qr.Len)
	}
	if err := in.check(c.NumBlocks()); err != nil {
		return err
	}
	if len(out) != B*heads*dv {
		return fmt.Errorf("cuda: attention: out has %d values, want %d × %d × %d", len(out), B, heads, dv)
	}
	if a.Replaying() && B > 0 && in.KVHeads == 0 {
		if ok, err := a.replay(ctx, m, c, in, out); ok || err != nil {
			a.CountReplay()
			return err
		}
	}
	a.CountEager()
	sc := a.tmp.Get()
	defer a.tmp.Put(sc)
	o, _, err := mlaDecodeIn(a.d, sc, m.buf, c.DType() == kernels.BF16, in)
	if err != nil {
		return err
	}
	copy(out, o)
	return nil
}

// replay runs in on the graph of its bucket, capturing it on first use,
// and says whether it did: a bucket that cannot be captured (no memory for
// its buffers, say) is remembered and left to the eager path. The mirror is
// locked.
func (a *Attention) replay(ctx context.Context, m *mirror, c *attn.Cache, in MLAInput, out []float32) (bool, error) {
	B := len(in.SeqLens)
	maxLen := 1
	for _, l := range in.SeqLens {
		maxLen = max(maxLen, int(l))
	}
	key := attnKey{queries: cuda.Pow2(B), splits: cuda.Pow2((maxLen + in.SplitRows - 1) / in.SplitRows), splitRows: in.SplitRows,
		heads: in.Heads, dv: in.DV, scale: in.Scale}
	g, seen := m.graphs[key]
	if !seen {
		var err error
		if g, err = a.capture(m, c, in, key); err != nil {
			g = nil // eager from now on for this bucket
		}
		if m.graphs == nil {
			m.graphs = map[attnKey]*attnGraph{}
		}
		m.graphs[key] = g
	}
	if g == nil {
		return false, nil
	}
	// Inputs padded to the bucket: copies of the first query, dropped.
	q := make([]float32, key.queries*in.Heads*in.D)
	copy(q, in.Q)
	table := make([]int32, key.queries*g.width)
	lens := make([]int32, key.queries)
	for i := range lens {
		j := i // the query whose table and length row i takes
		if i >= B {
			j = 0
		}
		copy(table[i*g.width:(i+1)*g.width], in.BlockTable[j*in.MaxBlocks:(j+1)*in.MaxBlocks])
		lens[i] = in.SeqLens[j]
	}
	for _, f := range []func() error{
		func() error { return cuda.CopyIn(a.d, g.q, q) },
		func() error { return cuda.CopyIn(a.d, g.table, table) },
		func() error { return cuda.CopyIn(a.d, g.lens, lens) },
		func() error { return g.graph.Replay(ctx) },
		func() error { return cuda.Download(a.d, g.o, out) }, // the first B queries' rows
	} {
		if err := f(); err != nil {
			return true, err
		}
	}
	return true, nil
}

// capture makes the graph of a bucket over the mirror's cache.
func (a *Attention) capture(m *mirror, c *attn.Cache, in MLAInput, key attnKey) (*attnGraph, error) {
	g := &attnGraph{bs: cuda.NewBuffers(a.d)}
	// Enough table entries for key.splits splits of SplitRows rows.
	// (A query of at most that many rows reads no entry past them.)
	g.width = min(c.NumBlocks(), (key.splits*in.SplitRows+in.BlockSize-1)/in.BlockSize)
	Q, S := key.queries, key.splits
	al := g.bs.Alloc
	g.q, g.table, g.lens = al(int64(Q*in.Heads*in.D*4)), al(int64(Q*g.width*4)), al(int64(Q*4))
	g.partO, g.partL = al(int64(Q*in.Heads*S*in.DV*4)), al(int64(Q*in.Heads*S*4))
	g.o, g.lse = al(int64(Q*in.Heads*in.DV*4)), al(int64(Q*in.Heads*4))
	if g.bs.Err() != nil {
		g.close()
		return nil, g.bs.Err()
	}
	bf16 := c.DType() == kernels.BF16
	graph, err := a.Capture(a.d, fmt.Sprintf("cuda: attention bucket %+v", key), func(d cuda.Launcher) error {
		return d.AttnDecode(cuda.AttnDecodeArgs{BF16: bf16, Q: g.q, Cache: m.buf, BlockTable: g.table, SeqLens: g.lens, Batch: Q, Heads: in.Heads, Dim: in.D, ValueDim: in.DV, BlockSize: in.BlockSize, MaxBlocks: g.width, SplitRows: in.SplitRows, Splits: S, Scale: in.Scale, PartO: g.partO, PartL: g.partL, Out: g.o, LSE: g.lse})
	})
	if err != nil {
		g.close()
		return nil, err
	}
	g.graph = graph
	return g, nil
}

func (g *attnGraph) close() {
	if g.graph != nil {
		g.graph.Close()
	}
	g.bs.Free()
}
