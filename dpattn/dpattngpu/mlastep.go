//go:build cuda || cudaemu

package dpattngpu

import (
	"context"
	"fmt"
	"unsafe"

	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// The MLA block's decode step with every activation in device memory: the
// projections on the resident weights of the core's projector, RMSNorm and
// RoPE, the new latent rows written into the cache's device copy, the
// absorbed queries, MLA decode, the value lift and o_proj, then the
// residual. No host copy between its kernels, so a bucket of queries and
// KV splits is captured once as a graph and replayed, as the attention
// graphs are; the new rows are read back afterwards into the host cache
// (LatentCache.Fill) so both copies agree.

// stepKey names a step's buffers and graph: the block, the query bucket
// and the split bucket.
type stepKey struct {
	blk                        *attn.MLABlock
	queries, splits, splitRows int
}

// stepBucket is a decode step of Q queries over at most S splits of the
// cache on fixed buffers.
type stepBucket struct {
	Q, S, splitRows, width int
	idRows, headRows       int
	// Inputs, staged before each run.
	x, pos, slots, table, lens cuda.Buffer
	// The step's work.
	xb, qa, qab, q, kv, qNope, qLat, qAbs   cuda.Buffer
	partO, partL, o, lse, ob, vhm, vtm, out cuda.Buffer
	// Output: the block's output plus x, [Q, hidden].
	hidden                                            cuda.Buffer
	idSorted, idExp, headSorted, headExp, headMap, id cuda.Buffer
	graph                                             cuda.Graph
	noGraph                                           bool
	bs                                                *cuda.Buffers
}

// blockOnDevice is a block's weights on the device (resident in the
// projector) and its norm weights and rotary frequencies.
type blockOnDevice struct {
	w                              attn.MLAWeights
	qProj, qA, qB, kvA, wUKT, wUV  cuda.Buffer
	oProj                          cuda.Buffer
	qANorm, kvANorm, freq          cuda.Buffer
	hidden, heads, qRank, L, R, qd int
	nope, vd                       int
}

// blockOf uploads blk's weights on first use.
func (a *Attention) blockOf(blk *attn.MLABlock) (*blockOnDevice, error) {
	a.mu.Lock()
	b := a.blocks[blk]
	a.mu.Unlock()
	if b != nil {
		return b, nil
	}
	c := blk.Cfg
	if c.Heads < 1 || c.Hidden < 1 || c.KVLoraRank < 1 || c.VDim < 1 {
		return nil, fmt.Errorf("cuda: mla step: %d heads, hidden %d, kv_lora_rank %d, v_head_dim %d", c.Heads, c.Hidden,
			c.KVLoraRank, c.VDim)
	}
	w := blk.Weights()
	b = &blockOnDevice{w: w, hidden: c.Hidden, heads: c.Heads, L: c.KVLoraRank, R: c.RopeDim, qd: c.NopeDim + c.RopeDim,
		nope: c.NopeDim, vd: c.VDim}
	for name, k := range map[string]int{"hidden": c.Hidden, "kv_lora_rank": c.KVLoraRank, "qk_nope_head_dim": c.NopeDim,
		"heads·v_head_dim": c.Heads * c.VDim} {
		if k%16 != 0 {
			return nil, fmt.Errorf("cuda: mla step: %s %d is not a multiple of 16 (the device GEMM's k)", name, k)
		}
	}
	if c.RopeDim%2 != 0 || c.RopeDim > cuda.MaxRope {
		return nil, fmt.Errorf("cuda: mla step: rope dims %d (want even, ≤ %d)", c.RopeDim, cuda.MaxRope)
	}
	p := a.Projections().(*projector)
	one := func(m *kernels.Matrix) (cuda.Buffer, error) { return p.stack(m, []kernels.Matrix{*m}) }
	var err error
	set := func(dst *cuda.Buffer, f func() (cuda.Buffer, error)) {
		if err == nil {
			*dst, err = f()
		}
	}
	if w.QProj != nil {
		set(&b.qProj, func() (cuda.Buffer, error) { return one(w.QProj) })
	} else {
		b.qRank = w.QA.Rows
		if b.qRank%16 != 0 {
			return nil, fmt.Errorf("cuda: mla step: q_lora_rank %d is not a multiple of 16", b.qRank)
		}
		set(&b.qA, func() (cuda.Buffer, error) { return one(w.QA) })
		set(&b.qB, func() (cuda.Buffer, error) { return one(w.QB) })
		set(&b.qANorm, func() (cuda.Buffer, error) { return cuda.Upload(a.d, w.QANorm) })
	}
	set(&b.kvA, func() (cuda.Buffer, error) { return one(w.KVA) })
	set(&b.oProj, func() (cuda.Buffer, error) { return one(w.OProj) })
	set(&b.wUKT, func() (cuda.Buffer, error) { return p.stack(&w.WUKT[0], w.WUKT) })
	set(&b.wUV, func() (cuda.Buffer, error) { return p.stack(&w.WUV[0], w.WUV) })
	set(&b.kvANorm, func() (cuda.Buffer, error) { return cuda.Upload(a.d, w.KVANorm) })
	set(&b.freq, func() (cuda.Buffer, error) { return cuda.Upload(a.d, w.RopeFreq) })
	if err != nil {
		for _, x := range []cuda.Buffer{b.qANorm, b.kvANorm, b.freq} {
			if !x.IsZero() {
				a.d.Free(x)
			}
		}
		return nil, fmt.Errorf("cuda: mla step: uploading the block: %w", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if won := a.blocks[blk]; won != nil { // another rank uploaded it meanwhile
		b.free(a.d)
		return won, nil
	}
	if a.blocks == nil {
		a.blocks = map[*attn.MLABlock]*blockOnDevice{}
	}
	a.blocks[blk] = b
	return b, nil
}

func (b *blockOnDevice) free(d cuda.Launcher) {
	for _, x := range []cuda.Buffer{b.qANorm, b.kvANorm, b.freq} {
		if !x.IsZero() {
			d.Free(x)
		}
	}
}

// newStepBucket allocates the buffers of Q queries and S splits.
func (a *Attention) newStepBucket(b *blockOnDevice, c *attn.Cache, Q, S, splitRows int) (*stepBucket, error) {
	s := &stepBucket{Q: Q, S: S, splitRows: splitRows, bs: cuda.NewBuffers(a.d)}
	s.width = min(c.NumBlocks(), (S*splitRows+c.BlockSize()-1)/c.BlockSize())
	H, nh, L, R, qd := b.hidden, b.heads, b.L, b.R, b.qd
	layPairs, blocks := cuda.DenseLayout(Q)
	s.idRows = len(layPairs)
	per := (Q + cuda.GEMMBlock - 1) / cuda.GEMMBlock // blocks per head
	s.headRows = nh * per * cuda.GEMMBlock
	headSorted := make([]int32, s.headRows)
	headExp := make([]int32, nh*per)
	headMap := make([]int32, Q*nh)
	for h := 0; h < nh; h++ {
		for i := 0; i < per*cuda.GEMMBlock; i++ {
			headSorted[h*per*cuda.GEMMBlock+i] = int32(Q * nh) // the sentinel: padding
			if i < Q {
				headSorted[h*per*cuda.GEMMBlock+i] = int32(i*nh + h)
				headMap[i*nh+h] = int32(h*per*cuda.GEMMBlock + i)
			}
		}
		for k := 0; k < per; k++ {
			headExp[h*per+k] = int32(h)
		}
	}
	ident := make([]int32, Q)
	for i := range ident {
		ident[i] = int32(i)
	}
	al := s.bs.Alloc
	s.x, s.pos, s.slots, s.table, s.lens = al(int64(Q*H*4)), al(int64(Q*4)), al(int64(Q*4)), al(int64(Q*s.width*4)), al(int64(Q*4))
	s.xb = al(int64(Q * H * 2))
	if b.qRank > 0 {
		s.qa, s.qab = al(int64(s.idRows*b.qRank*4)), al(int64(Q*b.qRank*2))
	}
	s.q, s.kv = al(int64(s.idRows*nh*qd*4)), al(int64(s.idRows*(L+R)*4))
	s.qNope, s.qLat, s.qAbs = al(int64(Q*nh*b.nope*2)), al(int64(s.headRows*L*4)), al(int64(Q*nh*(L+R)*4))
	s.partO, s.partL = al(int64(Q*nh*S*L*4)), al(int64(Q*nh*S*4))
	s.o, s.lse, s.ob = al(int64(Q*nh*L*4)), al(int64(Q*nh*4)), al(int64(Q*nh*L*2))
	s.vhm, s.vtm = al(int64(s.headRows*b.vd*4)), al(int64(Q*nh*b.vd*2))
	s.out, s.hidden = al(int64(s.idRows*H*4)), al(int64(Q*H*4))
	s.idSorted, s.idExp = s.bs.Put(cuda.Upload(a.d, layPairs)), s.bs.Put(cuda.Upload(a.d, blocks))
	s.headSorted, s.headExp = s.bs.Put(cuda.Upload(a.d, headSorted)), s.bs.Put(cuda.Upload(a.d, headExp))
	s.headMap, s.id = s.bs.Put(cuda.Upload(a.d, headMap)), s.bs.Put(cuda.Upload(a.d, ident))
	if s.bs.Err() != nil {
		s.bs.Free()
		return nil, fmt.Errorf("cuda: mla step of %d queries, %d splits: %w", Q, S, s.bs.Err())
	}
	return s, nil
}

// enqueue launches the step on s's buffers, on l (the device or a
// recorder of it), over the cache's device copy.
func (a *Attention) enqueueStep(l cuda.Launcher, b *blockOnDevice, s *stepBucket, cache cuda.Buffer, c *attn.Cache) error {
	H, nh, L, R, qd, Q := b.hidden, b.heads, b.L, b.R, b.qd, s.Q
	D := L + R
	eps := b.w.Eps
	proj := func(in cuda.Buffer, w cuda.Buffer, N, K int, out cuda.Buffer) error {
		return l.GroupedGEMM(cuda.GEMMArgs{A: in, Epilogue: cuda.Epilogue{}, Sorted: s.idSorted, BlockExpert: s.idExp, PaddedRows: s.idRows, TopK: 1, Pairs: Q, GatherA: true, N: N, K: K}, cuda.BF16Weights(w), cuda.Buffer{}, out)
	}
	heads := func(in cuda.Buffer, w cuda.Buffer, N, K int, out cuda.Buffer) error {
		return l.GroupedGEMM(cuda.GEMMArgs{A: in, Epilogue: cuda.Epilogue{}, Sorted: s.headSorted, BlockExpert: s.headExp, PaddedRows: s.headRows, TopK: 1, Pairs: Q * nh, GatherA: true, N: N, K: K}, cuda.BF16Weights(w), cuda.Buffer{}, out)
	}
	steps := []func() error{func() error { return l.F32ToBF16(s.x, s.xb, Q*H) }}
	if b.qRank == 0 {
		steps = append(steps, func() error { return proj(s.xb, b.qProj, nh*qd, H, s.q) })
	} else {
		r := b.qRank
		steps = append(steps,
			func() error { return proj(s.xb, b.qA, r, H, s.qa) },
			func() error { return l.RMSNorm(s.qa, Q, r, 0, r, b.qANorm, eps) },
			func() error { return l.F32ToBF16(s.qa, s.qab, Q*r) },
			func() error { return proj(s.qab, b.qB, nh*qd, r, s.q) })
	}
	steps = append(steps,
		// The latent rows: normalised, the rope part rotated, into the cache.
		func() error { return proj(s.xb, b.kvA, D, H, s.kv) },
		func() error { return l.RMSNorm(s.kv, Q, D, 0, L, b.kvANorm, eps) },
		func() error { return l.Rope(s.kv, Q, D, L, R, 1, s.pos, b.freq) },
		func() error {
			return l.CopyRows(cuda.CopyRowsArgs{Src: s.kv, SrcStride: D, SrcCol: 0, SrcMap: cuda.Buffer{}, Dst: cache, DstBF16: c.DType() == kernels.BF16, DstStride: D, DstCol: 0, DstMap: s.slots, Rows: Q, Width: D})
		},
		// Absorbed queries: each head's nope part through W_UKᵀ, the rope
		// part rotated.
		func() error {
			return l.CopyRows(cuda.CopyRowsArgs{Src: s.q, SrcStride: qd, SrcCol: 0, SrcMap: cuda.Buffer{}, Dst: s.qNope, DstBF16: true, DstStride: b.nope, DstCol: 0, DstMap: cuda.Buffer{}, Rows: Q * nh, Width: b.nope})
		},
		func() error { return heads(s.qNope, b.wUKT, L, b.nope, s.qLat) },
		func() error {
			return l.CopyRows(cuda.CopyRowsArgs{Src: s.qLat, SrcStride: L, SrcCol: 0, SrcMap: s.headMap, Dst: s.qAbs, DstBF16: false, DstStride: D, DstCol: 0, DstMap: cuda.Buffer{}, Rows: Q * nh, Width: L})
		},
		func() error {
			return l.CopyRows(cuda.CopyRowsArgs{Src: s.q, SrcStride: qd, SrcCol: b.nope, SrcMap: cuda.Buffer{}, Dst: s.qAbs, DstBF16: false, DstStride: D, DstCol: L, DstMap: cuda.Buffer{}, Rows: Q * nh, Width: R})
		},
		func() error { return l.Rope(s.qAbs, Q*nh, D, L, R, nh, s.pos, b.freq) },
		func() error {
			return l.AttnDecode(cuda.AttnDecodeArgs{BF16: c.DType() == kernels.BF16, Q: s.qAbs, Cache: cache, BlockTable: s.table, SeqLens: s.lens, Batch: Q, Heads: nh, Dim: D, ValueDim: L, BlockSize: c.BlockSize(), MaxBlocks: s.width, SplitRows: s.splitRows, Splits: s.S, Scale: b.w.Scale, PartO: s.partO, PartL: s.partL, Out: s.o, LSE: s.lse})
		},
		// Each head's latent output lifted by W_UV, heads side by side, o_proj.
		func() error { return l.F32ToBF16(s.o, s.ob, Q*nh*L) },
		func() error { return heads(s.ob, b.wUV, b.vd, L, s.vhm) },
		func() error {
			return l.CopyRows(cuda.CopyRowsArgs{Src: s.vhm, SrcStride: b.vd, SrcCol: 0, SrcMap: s.headMap, Dst: s.vtm, DstBF16: true, DstStride: b.vd, DstCol: 0, DstMap: cuda.Buffer{}, Rows: Q * nh, Width: b.vd})
		},
		func() error { return proj(s.vtm, b.oProj, H, nh*b.vd, s.out) },
		// The residual: hidden = out + x, as the decode loop adds it.
		func() error { return l.Combine(s.out, s.id, Q, 1, H, s.x, s.hidden) },
	)
	for _, f := range steps {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

// stepRun is one staged step: its bucket, the cache's copy and the rows
// reserved for the new tokens.
type stepRun struct {
	b     *blockOnDevice
	s     *stepBucket
	m     *mirror
	c     *attn.Cache
	seqs  []int
	lens  map[int]int // the sequences' lengths before the step
	slots []int32
	done  bool
}

// prepareStep reserves the new tokens' cache rows, brings the cache's
// device copy up to date and stages the inputs of the step's bucket. The
// mirror is locked on return: release unlocks it, and takes the reserved
// rows back unless finish has run.
func (a *Attention) prepareStep(ctx context.Context, blk *attn.MLABlock, c *attn.Cache, seqs []int, x []float32) (*stepRun, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	cfg := blk.Cfg
	T, H := len(seqs), cfg.Hidden
	if len(x) != T*H {
		return nil, fmt.Errorf("cuda: mla step: x has %d values, want %d tokens × %d", len(x), T, H)
	}
	if T == 0 {
		return nil, fmt.Errorf("cuda: mla step: no tokens")
	}
	if c.Dim() != cfg.KVLoraRank+cfg.RopeDim {
		return nil, fmt.Errorf("cuda: mla step: cache rows have %d values, want kv_lora_rank + rope = %d", c.Dim(), cfg.KVLoraRank+cfg.RopeDim)
	}
	if err := moe.CheckFinite(x, H); err != nil {
		return nil, err
	}
	b, err := a.blockOf(blk)
	if err != nil {
		return nil, err
	}
	splitRows := a.SplitRows
	if splitRows == 0 {
		splitRows = attn.DefaultSplitRows
	}
	m, err := a.lockMirror(c)
	if err != nil {
		return nil, err
	}
	r := &stepRun{b: b, m: m, c: c, seqs: seqs, lens: map[int]int{}}
	ok := false
	defer func() {
		if !ok { // an error, or a panic on its way up
			r.release()
		}
	}()
	if err := a.stage(r, blk, x, splitRows); err != nil {
		return nil, err
	}
	ok = true
	return r, nil
}

// stage fills in r: the bucket (made first, so that a failure there leaves
// the cache alone), the cache's device copy brought up to date, the rows
// reserved, the inputs staged.
func (a *Attention) stage(r *stepRun, blk *attn.MLABlock, x []float32, splitRows int) error {
	c, m, b := r.c, r.m, r.b
	T, H := len(r.seqs), b.hidden
	// Positions: a sequence's tokens follow each other.
	pos := make([]int32, T)
	maxLen := 1
	added := map[int]int{}
	for t, seq := range r.seqs {
		if _, ok := r.lens[seq]; !ok {
			r.lens[seq] = c.Len(seq)
		}
		pos[t] = int32(r.lens[seq] + added[seq])
		added[seq]++
		maxLen = max(maxLen, int(pos[t])+1)
	}
	key := stepKey{blk: blk, queries: cuda.Pow2(T), splits: cuda.Pow2((maxLen + splitRows - 1) / splitRows), splitRows: splitRows}
	s := m.steps[key]
	if s == nil {
		var err error
		if s, err = a.newStepBucket(b, c, key.queries, key.splits, splitRows); err != nil {
			return err
		}
		if m.steps == nil {
			m.steps = map[stepKey]*stepBucket{}
		}
		m.steps[key] = s
	}
	r.s = s
	if err := c.Changed(m.seen, func(block int, data []byte) error {
		return a.d.ToDeviceAt(m.buf, int64(block)*int64(len(data)), unsafe.Pointer(&data[0]), int64(len(data)))
	}); err != nil {
		return err
	}
	r.slots = make([]int32, T)
	tables := make([][]int32, T)
	for t, seq := range r.seqs {
		sl, err := c.Reserve(seq, 1)
		if err != nil {
			return err
		}
		r.slots[t] = sl[0]
		tables[t] = c.BlockTable(seq)
	}
	Q := s.Q
	// Padding rows: zero hidden states, no cache row written, and the last
	// token's table and length (their outputs are dropped).
	xp := make([]float32, Q*H)
	copy(xp, x)
	ps, ss, ls := make([]int32, Q), make([]int32, Q), make([]int32, Q)
	table := make([]int32, Q*s.width)
	for i := 0; i < Q; i++ {
		j := min(i, T-1)
		ps[i], ls[i] = pos[j], pos[j]+1
		ss[i] = -1
		if i < T {
			ss[i] = r.slots[i]
		}
		copy(table[i*s.width:(i+1)*s.width], tables[j])
	}
	for _, f := range []func() error{
		func() error { return cuda.CopyIn(a.d, s.x, xp) },
		func() error { return cuda.CopyIn(a.d, s.pos, ps) },
		func() error { return cuda.CopyIn(a.d, s.slots, ss) },
		func() error { return cuda.CopyIn(a.d, s.table, table) },
		func() error { return cuda.CopyIn(a.d, s.lens, ls) },
	} {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

// finish reads the new latent rows back into the host cache: the step is
// done.
func (r *stepRun) finish(d cuda.Launcher) error {
	D := r.c.Dim()
	rows := make([]float32, len(r.seqs)*D)
	if err := cuda.Download(d, r.s.kv, rows); err != nil {
		return err
	}
	if err := r.c.Fill(r.slots, rows, r.m.seen); err != nil {
		return err
	}
	r.done = true
	return nil
}

// release unlocks the mirror; a step that did not finish gives its
// reserved rows back.
func (r *stepRun) release() {
	if !r.done {
		for seq, n := range r.lens {
			if r.c.Len(seq) > n {
				_ = r.c.Truncate(seq, n) // n < its length (one writer per sequence): cannot fail
			}
		}
	}
	r.m.mu.Unlock()
}

// Step runs the block's decode step for one new token of each of seqs,
// hidden states x [len(seqs), hidden], entirely on the device, and writes
// the block's output plus x (the MoE layer's input) to out. Each token's
// latent row goes into the cache (and its device copy); it attends over
// its sequence. With graphs enabled and the step's vote allowing, the
// step's bucket replays its graph. A step that fails leaves the cache's
// sequences as they were. Nothing else may write seqs' rows meanwhile (one
// writer per sequence, as a serving loop has).
func (a *Attention) Step(ctx context.Context, blk *attn.MLABlock, c *attn.Cache, seqs []int, x, out []float32) error {
	if len(out) != len(x) {
		return fmt.Errorf("cuda: mla step: out has %d values, x %d", len(out), len(x))
	}
	if len(seqs) == 0 && len(x) == 0 {
		return nil
	}
	r, err := a.prepareStep(ctx, blk, c, seqs, x)
	if err != nil {
		return err
	}
	defer r.release()
	s := r.s
	enqueue := func(l cuda.Launcher) error { return a.enqueueStep(l, r.b, s, r.m.buf, c) }
	var graph cuda.Graph
	if a.Replaying() {
		if !s.noGraph && s.graph == nil {
			s.graph, err = a.Capture(a.d, fmt.Sprintf("cuda: mla step of %d queries, %d splits", s.Q, s.S), enqueue)
			s.noGraph = err != nil
		}
		graph = s.graph
	}
	if err := a.Run(ctx, a.d, graph, enqueue); err != nil {
		return err
	}
	if err := cuda.Download(a.d, s.hidden, out); err != nil {
		return err
	}
	return r.finish(a.d)
}
