//go:build cuda || cudaemu

package moegpu

import (
	"fmt"

	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// The device MoE pipeline, written once: route (router GEMM and gate) →
// group by expert (the align kernel's dispatch layout) → run the groups (the
// fused SwiGLU GEMM and the weighted down GEMM) → combine (with the shared
// expert, or a shard's partial sum). Every user — MoE.Forward, Step,
// Stage (gather mode), SharedStage, Experts and GroupedFFN — sizes the same
// pieces for its row count and enqueues them on a device or a recorder of
// it. The grouped GEMMs are sized for the largest layout their pairs can
// make (blocks past the actual layout idle), so no piece reads a size back
// from the device between kernels: each sequence is capturable as a graph,
// and since a row's result does not depend on where the layout puts it, a
// replay gives the eager bits.

// stack is a stack of SwiGLU expert weights on the device: gate and up
// [n, inter, hidden], down [n, hidden, inter], for the experts lo … lo+n-1
// of the layer (a stack's own slots 0 … n-1 for Experts). Gate and up
// (one launch) share a format and down has its own (see uploadAs): they
// stay in their quantized bytes (with their scales) when every matrix of
// the projection(s) is FP8 in one block size, or of one integer-code dtype
// (MXFP4, INT4, UINT4, INT8; INT8's 5- and 6-bit codes in their bits) in
// one group size, all with offsets or none; other weights are held as
// bf16.
type stack struct {
	gate, up, down cuda.Weights
	lo, n          int
	hidden, inter  int
	// first and second are the projections' epilogues: the activation and
	// the gate and up biases, the down bias (gpt_oss). scaleInput: the
	// routing weight scales the expert's input, not its output (llama4).
	first, second cuda.Epilogue
	scaleInput    bool
}

// uploadStack uploads the experts' weights as a stack (of the layer's
// experts lo …), with their biases (all the experts' or none) and the
// activation act; scaleInput puts the routing weight on the input. bs
// keeps its buffers and the first error.
func uploadStack(bs *cuda.Buffers, experts []moe.Expert, lo, hidden, inter int, act kernels.Activation, scaleInput bool) stack {
	st := stack{lo: lo, n: len(experts), hidden: hidden, inter: inter, scaleInput: scaleInput}
	st.first.Act = act
	if len(experts) > 0 && experts[0].GateBias != nil {
		var gb, ub, db []float32
		for _, x := range experts {
			gb, ub, db = append(gb, x.GateBias...), append(ub, x.UpBias...), append(db, x.DownBias...)
		}
		d := bs.Device()
		st.first.Bias, st.first.Bias2 = bs.Put(cuda.Upload(d, gb)), bs.Put(cuda.Upload(d, ub))
		st.second.Bias = bs.Put(cuda.Upload(d, db))
	}
	mats := func(pick func(x *moe.Expert) kernels.Matrix) []kernels.Matrix {
		out := make([]kernels.Matrix, len(experts))
		for i := range experts {
			out[i] = pick(&experts[i])
		}
		return out
	}
	gate := mats(func(x *moe.Expert) kernels.Matrix { return x.Gate })
	up := mats(func(x *moe.Expert) kernels.Matrix { return x.Up })
	down := mats(func(x *moe.Expert) kernels.Matrix { return x.Down })
	// Each projection is its own launch: gate and up (one launch, one
	// format) and down may be stored differently, as in GGUF's Q4_K_M
	// (Q4_K gate and up, Q6_K down).
	first := uploadAs(bs, gate, up)
	st.gate, st.up = first[0], first[1]
	st.down = uploadAs(bs, down)[0]
	return st
}

// uploadAs uploads each of ms (projections that share their format) as
// they are stored where all their matrices are of one FP8 block size or
// one integer-code format, else widened to bf16.
func uploadAs(bs *cuda.Buffers, ms ...[]kernels.Matrix) []cuda.Weights {
	ws := make([]cuda.Weights, len(ms))
	var put func(bs *cuda.Buffers, ms []kernels.Matrix) cuda.Weights
	switch {
	case fp8Stack(ms...):
		put = uploadFP8
	case codeStack(ms...):
		// The format, the super-blocks and the scales' bytes once for them
		// all (one launch's gate and up must agree): each reads every code
		// or scale.
		f, super := codeFormat(ms...), superSize(ms...)
		form := scaleForm(f, super, ms...)
		put = func(bs *cuda.Buffers, ms []kernels.Matrix) cuda.Weights { return uploadCodes(bs, ms, f, super, form) }
	default:
		put = uploadBF16
	}
	for i, m := range ms {
		ws[i] = put(bs, m)
	}
	return ws
}

// codeFormat is the device format of a code stack (see codeStack): its
// dtype's, or for INT8 codes that all fit one (see cuda.NarrowFormat) 5 or
// 6 bits, as GGUF's Q5_x and Q6_K blocks hold them.
func codeFormat(groups ...[]kernels.Matrix) cuda.WeightFormat {
	m0 := groups[0][0]
	f := map[kernels.DType]cuda.WeightFormat{kernels.MXFP4: cuda.MXFP4, kernels.INT4: cuda.INT4, kernels.UINT4: cuda.UINT4, kernels.INT8: cuda.INT8}[m0.DType]
	if f != cuda.INT8 {
		return f
	}
	for _, ms := range groups { // rows of one length: the kernels' row bytes
		for _, m := range ms {
			if m.Cols != m0.Cols {
				return cuda.INT8
			}
		}
	}
	lo, hi := 0, 0
	for _, ms := range groups {
		for _, m := range ms {
			data, _, _, _, _ := m.CodeData()
			for _, c := range data {
				lo, hi = min(lo, int(int8(c))), max(hi, int(int8(c)))
			}
		}
	}
	narrow, _ := cuda.NarrowFormat(lo, hi, m0.Cols, m0.HasOffsets()) // INT8 where none fits
	return narrow
}

// fp8Stack says whether every matrix is FP8 in one block size.
func fp8Stack(groups ...[]kernels.Matrix) bool {
	br, bc := -1, -1
	for _, ms := range groups {
		for _, m := range ms {
			if m.DType != kernels.F8E4M3 {
				return false
			}
			r, c := m.BlockSize()
			if br >= 0 && (r != br || c != bc) {
				return false
			}
			br, bc = r, c
		}
	}
	return br > 0
}

// codeStack says whether every matrix is of one integer-code dtype and
// group size, all with offsets or all without.
func codeStack(groups ...[]kernels.Matrix) bool {
	var dt kernels.DType
	g, offs := -1, false
	for _, ms := range groups {
		for _, m := range ms {
			switch m.DType {
			case kernels.MXFP4, kernels.INT4, kernels.UINT4, kernels.INT8:
			default:
				return false
			}
			o := m.HasOffsets()
			if dt != 0 && (m.DType != dt || m.GroupSize() != g || o != offs) {
				return false
			}
			dt, g, offs = m.DType, m.GroupSize(), o
		}
	}
	return g > 0
}

// uploadCodes uploads integer-code matrices as they are stored, in format
// f (see codeFormat): the codes, the scales and the offsets (if any) of
// each, stacked; as the K-quants' factors (cuda.Weights' Super) in
// super-blocks of super groups (see superSize), or in form (see
// scaleForm).
func uploadCodes(bs *cuda.Buffers, ms []kernels.Matrix, f cuda.WeightFormat, super int, form scaleHeld) cuda.Weights {
	var w []uint8
	var sc, off []float32
	var fac []int8
	var group int
	for _, m := range ms {
		data, scales, offsets, g, _ := m.CodeData()
		if f == cuda.INT5 || f == cuda.UINT5 || f == cuda.INT6 {
			data = cuda.NarrowCodes(f, data, m.Cols)
		}
		w, group = append(w, data...), g
		if super == 0 {
			sc, off = append(sc, scales...), append(off, offsets...)
			continue
		}
		_, d, nd, f, mins, _ := m.SuperScales()
		sc, off = append(sc, d...), append(off, nd...)
		for i, v := range f {
			fac = append(fac, v)
			if mins != nil {
				fac = append(fac, mins[i])
			}
		}
	}
	d := bs.Device()
	wt := cuda.Weights{Format: f, W: bs.Put(cuda.Upload(d, w)), BlockRows: 1, BlockCols: group, Super: super}
	switch form { // scaleForm checked that every value converts
	case e8Scales: // the format's bytes
		b, _ := cuda.E8Scales(sc)
		wt.Scales, wt.E8 = bs.Put(cuda.Upload(d, b)), true
	case halfScales:
		hs, _ := cuda.HalfScales(sc)
		wt.Scales, wt.Half = bs.Put(cuda.Upload(d, hs)), true
		if off != nil {
			ho, _ := cuda.HalfScales(off)
			wt.Offsets = bs.Put(cuda.Upload(d, ho))
		}
	default:
		wt.Scales = bs.Put(cuda.Upload(d, sc))
		if off != nil {
			wt.Offsets = bs.Put(cuda.Upload(d, off))
		}
	}
	if super > 0 {
		wt.Factors = bs.Put(cuda.Upload(d, fac))
	}
	return wt
}

// superSize is the groups of a super-block of the K-quant factors when
// every matrix has them, in super-blocks of one size of at least 2 (a
// super-block of one group holds more bytes than the group's fp32
// scale); 0 otherwise.
func superSize(groups ...[]kernels.Matrix) int {
	per := 0
	for _, ms := range groups {
		for _, m := range ms {
			p, _, _, _, _, ok := m.SuperScales()
			if !ok || p < 2 || per > 0 && p != per {
				return 0
			}
			per = p
		}
	}
	return per
}

// scaleHeld is how a code stack's scales are held on the device.
type scaleHeld uint8

const (
	fp32Scales scaleHeld = iota
	e8Scales             // MXFP4's E8M0 bytes
	halfScales           // fp16, scales and offsets
)

// scaleForm is how the scales of code stacks in format f (K-quant factors
// in super-blocks of super groups, 0: none) are held on the device: as
// MXFP4's E8M0 bytes when every scale is an E8M0 power of two (see
// cuda.E8Scales), as fp16 when every scale and offset is an fp16 value
// (see cuda.HalfScales), else fp32. The stacks of one launch share it.
func scaleForm(f cuda.WeightFormat, super int, groups ...[]kernels.Matrix) scaleHeld {
	if super > 0 {
		return fp32Scales // the factors' d and −dmin
	}
	e8, h := f == cuda.MXFP4, true
	for _, ms := range groups {
		for _, m := range ms {
			if !e8 && !h {
				return fp32Scales
			}
			scales, offsets := m.CodeScales()
			if e8 {
				_, e8 = cuda.E8Scales(scales)
			}
			if h {
				_, okS := cuda.HalfScales(scales)
				_, okO := cuda.HalfScales(offsets)
				h = okS && okO
			}
		}
	}
	switch {
	case e8:
		return e8Scales
	case h:
		return halfScales
	}
	return fp32Scales
}

func uploadBF16(bs *cuda.Buffers, ms []kernels.Matrix) cuda.Weights {
	var w []uint16
	for _, m := range ms {
		w = append(w, cuda.BF16Rows(m)...)
	}
	return cuda.BF16Weights(bs.Put(cuda.Upload(bs.Device(), w)))
}

// uploadFP8 uploads FP8 matrices as they are stored: the bytes and the
// block scales of each, stacked.
func uploadFP8(bs *cuda.Buffers, ms []kernels.Matrix) cuda.Weights {
	var w []uint8
	var sc []float32
	var br, bc int
	for _, m := range ms {
		data, scales, r, c, _ := m.FP8Data()
		w, sc, br, bc = append(w, data...), append(sc, scales...), r, c
	}
	d := bs.Device()
	return cuda.Weights{Format: cuda.FP8, W: bs.Put(cuda.Upload(d, w)), Scales: bs.Put(cuda.Upload(d, sc)), BlockRows: br, BlockCols: bc}
}

// dense is the grouped GEMM's layout of rows rows in one group: a dense
// GEMM (the router, a shared expert) on the grouped kernels.
type dense struct {
	rows, padded       int
	sorted, blockGroup cuda.Buffer
}

func newDense(a cuda.Allocator, rows int) dense {
	sorted, groups := cuda.DenseLayout(rows)
	return dense{rows: rows, padded: len(sorted), sorted: cuda.Stage(a, sorted), blockGroup: cuda.Stage(a, groups)}
}

// ffnRun is one grouped FFN of a stack over tokens·topK (token, slot)
// pairs: the dispatch layout, the SwiGLU activations and the weighted
// outputs, out [padded rows, hidden] in layout order (rowsOf: the row of
// each pair, -1 for a pair of an expert outside the stack).
type ffnRun struct {
	st                                   *stack
	tokens, topK, blocks                 int
	counts, offsets, sorted, blockExpert cuda.Buffer
	rowsOf, h, hb, out                   cuda.Buffer
}

func newFFNRun(a cuda.Allocator, st *stack, tokens, topK int) *ffnRun {
	n := tokens * topK
	r := &ffnRun{st: st, tokens: tokens, topK: topK,
		blocks: (n + st.n*(cuda.GEMMBlock-1)) / cuda.GEMMBlock} // the padded total never needs more
	rows := r.blocks * cuda.GEMMBlock
	r.counts, r.offsets = a.Alloc(int64(st.n*4)), a.Alloc(int64((st.n+1)*4))
	r.sorted, r.blockExpert, r.rowsOf = a.Alloc(int64(max(rows, 1)*4)), a.Alloc(int64(max(r.blocks, 1)*4)), a.Alloc(int64(max(n, 1)*4))
	r.h, r.hb = a.Alloc(int64(max(rows, 1)*st.inter*4)), a.Alloc(int64(max(rows, 1)*st.inter*2))
	r.out = a.Alloc(int64(max(rows, 1) * st.hidden * 4))
	return r
}

// enqueue lays out the pairs of ids [tokens, topK] (expert ids of the
// layer) over the stack's experts and runs them on xb (bf16 [tokens,
// hidden]), each output row scaled by its pair's weight in scale (fp32
// [tokens·topK]; a zero Buffer: 1), or each pair's input where the stack
// says so.
func (r *ffnRun) enqueue(l cuda.Launcher, xb, ids, scale cuda.Buffer) error {
	st, n := r.st, r.tokens*r.topK
	rows := r.blocks * cuda.GEMMBlock
	if err := l.Align(cuda.AlignArgs{IDs: ids, N: n, Lo: st.lo, Experts: st.n, Block: cuda.GEMMBlock, MaxBlocks: r.blocks, Counts: r.counts, Offsets: r.offsets, Sorted: r.sorted, BlockExpert: r.blockExpert, Rows: r.rowsOf}); err != nil {
		return err
	}
	first := st.first
	if st.scaleInput {
		first.InScale, scale = scale, cuda.Buffer{}
	}
	if err := l.GroupedSwiGLU(cuda.GEMMArgs{A: xb, Epilogue: first, Sorted: r.sorted, BlockExpert: r.blockExpert, PaddedRows: rows, TopK: r.topK, Pairs: n, N: st.inter, K: st.hidden}, st.gate, st.up, r.h); err != nil {
		return err
	}
	if err := l.F32ToBF16(r.h, r.hb, rows*st.inter); err != nil {
		return err
	}
	return l.GroupedGEMM(cuda.GEMMArgs{A: r.hb, Epilogue: st.second, Sorted: r.sorted, BlockExpert: r.blockExpert, PaddedRows: rows, TopK: r.topK, Pairs: n, GatherA: false, N: st.hidden, K: st.inter}, st.down, scale, r.out)
}

// sharedRun is the shared expert (a stack of one) over rows rows: out
// [padded rows, hidden], each row scaled by scale (qwen2_moe's gate; a
// zero Buffer for none).
type sharedRun struct {
	st         *stack
	lay        dense
	h, hb, out cuda.Buffer
	scale      cuda.Buffer
}

// newSharedRun sizes the shared expert over lay's rows (the layout of a
// stage's router, or one of its own).
func newSharedRun(a cuda.Allocator, st *stack, lay dense, gated bool) *sharedRun {
	rows := lay.rows
	r := &sharedRun{st: st, lay: lay}
	p := max(r.lay.padded, 1)
	r.h, r.hb, r.out = a.Alloc(int64(p*st.inter*4)), a.Alloc(int64(p*st.inter*2)), a.Alloc(int64(p*st.hidden*4))
	if gated {
		r.scale = a.Alloc(int64(max(rows, 1) * 4))
	}
	return r
}

func (r *sharedRun) enqueue(l cuda.Launcher, xb cuda.Buffer) error {
	st, lay := r.st, r.lay
	if err := l.GroupedSwiGLU(cuda.GEMMArgs{A: xb, Epilogue: st.first, Sorted: lay.sorted, BlockExpert: lay.blockGroup, PaddedRows: lay.padded, TopK: 1, Pairs: lay.rows, N: st.inter, K: st.hidden}, st.gate, st.up, r.h); err != nil {
		return err
	}
	if err := l.F32ToBF16(r.h, r.hb, lay.padded*st.inter); err != nil {
		return err
	}
	return l.GroupedGEMM(cuda.GEMMArgs{A: r.hb, Epilogue: st.second, Sorted: lay.sorted, BlockExpert: lay.blockGroup, PaddedRows: lay.padded, TopK: 1, Pairs: lay.rows, GatherA: false, N: st.hidden, K: st.inter}, st.down, r.scale, r.out)
}

// A Stage is the MoE pipeline for Tokens tokens on fixed device buffers:
// In (fp32 [Tokens, hidden]) rounded to bf16, the router GEMM and the gate,
// the layout over the experts the MoE holds, the grouped FFN, and the
// combine into Out (fp32 [Tokens, hidden]): each token's sum over the held
// experts in ascending id, plus the shared expert unless the stage is
// partial. Enqueue launches it on the device or records it into a graph.
type Stage struct {
	m                 *MoE
	tokens            int
	in, xb, logits    cuda.Buffer
	ids, weights, out cuda.Buffer
	router            dense
	ffn               *ffnRun
	shared            *sharedRun // nil when partial or without a shared expert
}

// NewStage sizes a stage for tokens tokens (≥ 1) on a's buffers. A
// partial stage leaves the shared expert out: a shard's share of gather
// mode, whose sums over the ranks make the routed output; a whole stage
// needs a MoE that holds every expert.
func (m *MoE) NewStage(a cuda.Allocator, tokens int, partial bool) (*Stage, error) {
	if tokens < 1 {
		return nil, fmt.Errorf("cuda: moe: a stage of %d tokens", tokens)
	}
	if !partial {
		if err := m.whole(); err != nil {
			return nil, err
		}
	}
	c := m.cfg
	H, E, K := c.Hidden, c.NumExperts, c.TopK
	s := &Stage{m: m, tokens: tokens}
	s.in, s.xb = a.Alloc(int64(tokens*H*4)), a.Alloc(int64(tokens*H*2))
	s.router = newDense(a, tokens)
	s.logits = a.Alloc(int64(s.router.padded * E * 4))
	s.ids, s.weights = a.Alloc(int64(tokens*K*4)), a.Alloc(int64(tokens*K*4))
	s.ffn = newFFNRun(a, &m.routed, tokens, K)
	if m.shared != nil && !partial {
		s.shared = newSharedRun(a, m.shared, s.router, m.sharedGate != nil) // the router's layout: the same rows
	}
	s.out = a.Alloc(int64(tokens * H * 4))
	if err := a.Err(); err != nil {
		return nil, fmt.Errorf("cuda: moe: buffers for %d tokens: %w", tokens, err)
	}
	return s, nil
}

// Tokens is the stage's row count.
func (s *Stage) Tokens() int { return s.tokens }

// In is the stage's input, fp32 [Tokens, hidden].
func (s *Stage) In() cuda.Buffer { return s.in }

// Out is the stage's output, fp32 [Tokens, hidden].
func (s *Stage) Out() cuda.Buffer { return s.out }

// Enqueue launches the stage's kernels on l (the device, or a recorder of
// it): no copy and no host synchronisation between them.
func (s *Stage) Enqueue(l cuda.Launcher) error {
	m, c, T := s.m, s.m.cfg, s.tokens
	H, E, K := c.Hidden, c.NumExperts, c.TopK
	if err := l.F32ToBF16(s.in, s.xb, T*H); err != nil {
		return err
	}
	// Router logits: one dense GEMM over every token, the logit bias its
	// epilogue's (the dense layout's one group).
	if err := l.GroupedGEMM(cuda.GEMMArgs{A: s.xb, Epilogue: cuda.Epilogue{Bias: m.logitBias}, Sorted: s.router.sorted, BlockExpert: s.router.blockGroup, PaddedRows: s.router.padded, TopK: 1, Pairs: T, GatherA: true, N: E, K: H}, cuda.BF16Weights(m.router), cuda.Buffer{}, s.logits); err != nil {
		return err
	}
	if err := l.Gate(c.GateKernelArgs(), s.logits, m.bias, s.ids, s.weights, T); err != nil {
		return err
	}
	if err := s.ffn.enqueue(l, s.xb, s.ids, s.weights); err != nil {
		return err
	}
	shared := cuda.Buffer{}
	if s.shared != nil {
		if err := s.shared.enqueue(l, s.xb); err != nil {
			return err
		}
		shared = s.shared.out
	}
	// Every token's sum over the held experts (zero for none) in ascending
	// expert id, then the shared expert.
	return l.Combine(s.ffn.out, s.ffn.rowsOf, T, K, H, shared, s.out)
}

// sharedScale stages qwen2_moe's shared-expert gate of x's rows (the rows
// past them zero) into the stage's scale buffer; nothing for other
// families.
func (m *MoE) sharedScale(r *sharedRun, x []float32) error {
	if m.sharedGate == nil || r == nil {
		return nil
	}
	return cuda.CopyIn(m.dev, r.scale, moe.SharedGate(*m.sharedGate, x, nil, make([]float32, r.lay.rows)))
}

// A SharedStage is the shared expert of a MoE over Rows rows on fixed
// buffers, added to a routed sum: Out = routed + shared(In), for gather
// mode, where the routed sum comes back from the other ranks.
type SharedStage struct {
	m            *MoE
	rows         int
	in, inb, out cuda.Buffer
	ident        cuda.Buffer // rows 0 … Rows-1: the combine's layout
	run          *sharedRun
}

// NewSharedStage sizes the shared expert's stage for rows rows on a's
// buffers; nil for a layer without a shared expert.
func (m *MoE) NewSharedStage(a cuda.Allocator, rows int) (*SharedStage, error) {
	if m.shared == nil {
		return nil, nil
	}
	H := m.cfg.Hidden
	s := &SharedStage{m: m, rows: rows}
	s.in, s.inb, s.out = a.Alloc(int64(rows*H*4)), a.Alloc(int64(rows*H*2)), a.Alloc(int64(rows*H*4))
	ident := make([]int32, rows)
	for i := range ident {
		ident[i] = int32(i)
	}
	s.ident = cuda.Stage(a, ident)
	s.run = newSharedRun(a, m.shared, newDense(a, rows), m.sharedGate != nil)
	if err := a.Err(); err != nil {
		return nil, fmt.Errorf("cuda: moe: shared expert's buffers for %d rows: %w", rows, err)
	}
	return s, nil
}

// In is the shared expert's input, fp32 [Rows, hidden].
func (s *SharedStage) In() cuda.Buffer { return s.in }

// Out is routed plus the shared expert, fp32 [Rows, hidden].
func (s *SharedStage) Out() cuda.Buffer { return s.out }

// Gate stages qwen2_moe's shared-expert gate of x [t ≤ Rows, hidden] (the
// host rows the stage's input holds); nothing for other families.
func (s *SharedStage) Gate(x []float32) error { return s.m.sharedScale(s.run, x) }

// Enqueue launches Out = routed + shared(In) on l, routed fp32 [Rows,
// hidden].
func (s *SharedStage) Enqueue(l cuda.Launcher, routed cuda.Buffer) error {
	H := s.m.cfg.Hidden
	if err := l.F32ToBF16(s.in, s.inb, s.rows*H); err != nil {
		return err
	}
	if err := s.run.enqueue(l, s.inb); err != nil {
		return err
	}
	// y = the routed experts' sum + the shared expert, as on the CPU.
	return l.Combine(routed, s.ident, s.rows, 1, H, s.run.out, s.out)
}
