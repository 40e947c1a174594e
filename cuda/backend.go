//go:build cuda || cudaemu

package cuda

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// Buffer is device memory: an address on the GPU (tag cuda) or a block of
// host memory standing for it (tag cudaemu).
type Buffer struct {
	id    uint64
	Bytes int64
}

// Launcher is what the launch code needs of a device: memory, copies and
// the kernels of kernels/cuda. The GPU (tag cuda) and the CPU emulation
// (tag cudaemu) implement it, so the same launch code runs on both.
type Launcher interface {
	Alloc(bytes int64) (Buffer, error)
	Free(b Buffer)
	ToDevice(dst Buffer, src unsafe.Pointer, n int64) error
	ToHost(dst unsafe.Pointer, src Buffer, n int64) error
	// ToDeviceAt copies n bytes from the host to dst at byte offset off.
	ToDeviceAt(dst Buffer, off int64, src unsafe.Pointer, n int64) error
	Gate(k moe.GateKernelArgs, logits, bias, ids, weights Buffer, tokens int) error
	// Align lays out the pairs of the experts lo … lo+experts-1 (a shard;
	// the others' rows are -1); blockExpert holds maxBlocks entries, -1
	// past the layout.
	Align(ids Buffer, n, lo, experts, block, maxBlocks int, counts, offsets, sorted, blockExpert, rows Buffer) error
	Combine(out, rows Buffer, tokens, topK, hidden int, shared, y Buffer) error
	GroupedGEMM(a, w, sorted, blockExpert Buffer, paddedRows, topK, pairs int, gatherA bool, N, K int, weights, c Buffer) error
	GroupedSwiGLU(a, gate, up, sorted, blockExpert Buffer, paddedRows, topK, pairs, N, K int, h Buffer) error
	F32ToBF16(src, dst Buffer, n int) error
	MLADecode(bf16 bool, q, cache, blockTable, seqlens Buffer, batch, heads, D, dv, blockSize, maxBlocks, splitRows,
		splits int, scale float32, partO, partL, out, lse Buffer) error
	// RMSNorm normalises x[r, col … col+width) in place, for rows rows of
	// stride values, with weight w (fp32 [width]).
	RMSNorm(x Buffer, rows, stride, col, width int, w Buffer, eps float64) error
	// Rope rotates x[r, col … col+width) in place for position
	// pos[r/perPos] (int32): DeepSeek's interleaved pairs in, halves out;
	// freq holds width/2 inverse frequencies and the cos/sin scale (fp64).
	Rope(x Buffer, rows, stride, col, width, perPos int, pos, freq Buffer) error
	// CopyRows copies, for i < rows, width values of row srcMap[i] of src
	// (from srcCol; rows of srcStride values) to row dstMap[i] of dst (from
	// dstCol; dstStride), as fp32 or rounded to bf16; a zero Buffer map is
	// the identity, a negative index skips the row.
	CopyRows(src Buffer, srcStride, srcCol int, srcMap, dst Buffer, dstBF16 bool, dstStride, dstCol int, dstMap Buffer,
		rows, width int) error
	// Collective enqueues op, the work of a communication library (NCCL)
	// on the device's stream, which it is given: after the kernels before
	// it, before those after. On a recorder it becomes a step of the graph.
	// op runs with the device held: it must not call the device itself.
	Collective(name string, op func(stream uintptr) error) error
	// Capture gives record a recorder of the device: the kernels record
	// launches on it make a Graph instead of running (copies are errors),
	// while other users of the device go on as usual.
	Capture(record func(rec Launcher) error) (Graph, error)
}

// gemmBlock is the row block of the grouped GEMM (kernels/cuda).
const gemmBlock = 64

// The launch shapes and limits of kernels/cuda/mla_prep.cu.
const (
	normThreads = 128
	ropeThreads = 64
	copyThreads = 128
	maxRope     = 512
)

func upload[T any](d Launcher, v []T) (Buffer, error) {
	var zero T
	n := int64(len(v)) * int64(unsafe.Sizeof(zero))
	b, err := d.Alloc(n)
	if err != nil || n == 0 {
		return b, err
	}
	return b, d.ToDevice(b, unsafe.Pointer(&v[0]), n)
}

// buffers tracks the device buffers of one call or object: the first
// error of their allocations and uploads, and one Free for all of them.
type buffers struct {
	d    Launcher
	bufs []Buffer
	err  error
}

// put keeps b (even when e is set: an upload's buffer may exist) and e.
func (s *buffers) put(b Buffer, e error) Buffer {
	if b.id != 0 {
		s.bufs = append(s.bufs, b)
	}
	if e != nil && s.err == nil {
		s.err = e
	}
	return b
}

func (s *buffers) alloc(bytes int64) Buffer { return s.put(s.d.Alloc(bytes)) }

func (s *buffers) free() {
	for _, b := range s.bufs {
		s.d.Free(b)
	}
	s.bufs = nil
}

// copyIn copies v into the device buffer b.
func copyIn[T any](d Launcher, b Buffer, v []T) error {
	var zero T
	n := int64(len(v)) * int64(unsafe.Sizeof(zero))
	if n == 0 {
		return nil
	}
	return d.ToDevice(b, unsafe.Pointer(&v[0]), n)
}

func download[T any](d Launcher, b Buffer, v []T) error {
	var zero T
	n := int64(len(v)) * int64(unsafe.Sizeof(zero))
	if n == 0 {
		return nil
	}
	return d.ToHost(unsafe.Pointer(&v[0]), b, n)
}

// bf16Rows widens m's rows and rounds them to bf16 bits.
func bf16Rows(m kernels.Matrix) []uint16 {
	out := make([]uint16, m.Rows*m.Cols)
	row := make([]float32, m.Cols)
	for r := 0; r < m.Rows; r++ {
		m.RowF32(r, row)
		for c, v := range row {
			out[r*m.Cols+c] = half.F32ToBF16(v)
		}
	}
	return out
}

// MoE is a MoE layer on a device: bf16 weights (experts stacked [E, N, K]),
// the routing, grouped GEMMs and combine of kernels/cuda.
type MoE struct {
	dev             Launcher
	cfg             *moe.Config
	router, bias    Buffer
	gate, up, down  Buffer
	sGate, sUp, sDn Buffer
	sharedGate      *kernels.Matrix // qwen2_moe: applied host-side as a row weight
	hasShared       bool
	lo, local       int         // the experts held: lo … lo+local-1 (all, but in a gather step)
	tmp             scratchPool // Forward's temporaries, kept between calls
}

// NewMoE uploads the layer's weights as bf16. The layer holds every expert
// (Forward, NewStep) or, for a GatherStep, a contiguous shard of them (as
// ep.Contiguous places them); hidden and the intermediate sizes must be
// multiples of 16.
func NewMoE(dev Launcher, l *moe.Layer) (*MoE, error) {
	c := l.Config
	if c.Hidden%16 != 0 || c.Inter%16 != 0 || c.SharedInter%16 != 0 {
		return nil, fmt.Errorf("cuda: moe: hidden %d and intermediate sizes %d, %d must be multiples of 16", c.Hidden, c.Inter, c.SharedInter)
	}
	m := &MoE{dev: dev, cfg: c, tmp: scratchPool{d: dev}}
	var err error
	if m.router, err = upload(dev, bf16Rows(l.Router.Weight())); err != nil {
		return nil, err
	}
	if b := l.Router.Bias(); b != nil {
		if m.bias, err = upload(dev, b); err != nil {
			return nil, err
		}
	}
	m.lo = -1
	for e := 0; e < c.NumExperts; e++ {
		if _, ok := l.Expert(e); ok {
			if m.lo < 0 {
				m.lo = e
			} else if e != m.lo+m.local {
				return nil, fmt.Errorf("cuda: moe: the layer holds experts %d and %d but not those between (a device shard is contiguous)",
					m.lo+m.local-1, e)
			}
			m.local++
		}
	}
	if m.local == 0 {
		return nil, fmt.Errorf("cuda: moe: the layer holds no expert")
	}
	var gate, up, down []uint16
	for e := m.lo; e < m.lo+m.local; e++ {
		x, _ := l.Expert(e)
		gate = append(gate, bf16Rows(x.Gate)...)
		up = append(up, bf16Rows(x.Up)...)
		down = append(down, bf16Rows(x.Down)...)
	}
	if m.gate, err = upload(dev, gate); err != nil {
		return nil, err
	}
	if m.up, err = upload(dev, up); err != nil {
		return nil, err
	}
	if m.down, err = upload(dev, down); err != nil {
		return nil, err
	}
	if s, g := l.SharedExpert(); s != nil {
		m.hasShared, m.sharedGate = true, g
		if m.sGate, err = upload(dev, bf16Rows(s.Gate)); err != nil {
			return nil, err
		}
		if m.sUp, err = upload(dev, bf16Rows(s.Up)); err != nil {
			return nil, err
		}
		if m.sDn, err = upload(dev, bf16Rows(s.Down)); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Close frees the weights.
func (m *MoE) Close() {
	for _, b := range []Buffer{m.router, m.bias, m.gate, m.up, m.down, m.sGate, m.sUp, m.sDn} {
		if b.Bytes > 0 {
			m.dev.Free(b)
		}
	}
	m.tmp.free()
}

// whole reports an error unless m holds every expert.
func (m *MoE) whole() error {
	if m.local != m.cfg.NumExperts {
		return fmt.Errorf("cuda: moe: the layer holds experts %d…%d of %d: a shard runs in a GatherStep", m.lo, m.lo+m.local-1, m.cfg.NumExperts)
	}
	return nil
}

// identityLayout routes every token to expert 0 once: the layout of the
// router and shared-expert GEMMs.
func identityLayout(tokens int) (*moe.Layout, []int32, error) {
	lay, err := moe.NewLayout(make([]int32, tokens), tokens, 1, 1, gemmBlock)
	if err != nil {
		return nil, nil, err
	}
	return lay, make([]int32, len(lay.Pairs)/gemmBlock), nil
}

// Forward computes y = MoE(x), x and y [tokens, hidden] on the host, with
// activations rounded to bf16 on the device (tensor-core numerics: within
// about 1e-2 of the fp32 CPU path). Its device temporaries are kept from
// call to call (one set per concurrent caller).
func (m *MoE) Forward(x, y []float32) error { return m.ForwardRouting(x, y, nil, nil) }

// ForwardRouting is Forward that also returns each token's experts
// (ascending) and their routing weights, ids and weights [tokens, top_k];
// either may be nil.
func (m *MoE) ForwardRouting(x, y []float32, ids []int32, weights []float32) error {
	if err := m.whole(); err != nil {
		return err
	}
	c, d := m.cfg, m.dev
	H, E, K, I := c.Hidden, c.NumExperts, c.TopK, c.Inter
	if len(x)%H != 0 || len(y) != len(x) {
		return fmt.Errorf("cuda: moe: x has %d values and y %d, want [tokens, %d]", len(x), len(y), H)
	}
	if n := len(x) / H * K; (ids != nil && len(ids) != n) || (weights != nil && len(weights) != n) {
		return fmt.Errorf("cuda: moe: ids has %d values and weights %d, want [%d tokens, top_k %d]", len(ids), len(weights), len(x)/H, K)
	}
	if err := moe.CheckFinite(x, H); err != nil {
		return err
	}
	T := len(x) / H
	if T == 0 {
		return nil
	}
	sc := m.tmp.get()
	defer m.tmp.put(sc)
	bs := &scratchAlloc{sc: sc}
	alloc := bs.alloc
	xf := stage(bs, x)
	xb := alloc(int64(T * H * 2))
	if bs.err != nil {
		return bs.err
	}
	if err := d.F32ToBF16(xf, xb, T*H); err != nil {
		return err
	}

	// Router logits: one "expert" over every token.
	idLay, idBlocks, err := identityLayout(T)
	if err != nil {
		return err
	}
	idSorted, idExp := stage(bs, idLay.Pairs), stage(bs, idBlocks)
	idRows := len(idLay.Pairs)
	logits := alloc(int64(idRows * E * 4))
	if bs.err != nil {
		return bs.err
	}
	if err := d.GroupedGEMM(xb, m.router, idSorted, idExp, idRows, 1, T, true, E, H, Buffer{}, logits); err != nil {
		return err
	}

	// Gate and layout.
	idb, wb := alloc(int64(T*K*4)), alloc(int64(T*K*4))
	if bs.err != nil {
		return bs.err
	}
	if err := d.Gate(c.GateKernelArgs(), logits, m.bias, idb, wb, T); err != nil {
		return err
	}
	if ids != nil {
		if err := download(d, idb, ids); err != nil {
			return err
		}
	}
	if weights != nil {
		if err := download(d, wb, weights); err != nil {
			return err
		}
	}
	n := T * K
	maxRows := n + E*(gemmBlock-1)
	counts, offsets := alloc(int64(E*4)), alloc(int64((E+1)*4))
	sorted, blockExpert, rows := alloc(int64(maxRows*4)), alloc(int64((maxRows/gemmBlock+1)*4)), alloc(int64(n*4))
	if bs.err != nil {
		return bs.err
	}
	if err := d.Align(idb, n, 0, E, gemmBlock, maxRows/gemmBlock+1, counts, offsets, sorted, blockExpert, rows); err != nil {
		return err
	}
	off := make([]int32, E+1)
	if err := download(d, offsets, off); err != nil {
		return err
	}
	padded := int(off[E])

	// Experts: h = silu(x·gate)·(x·up), then weighted h·down, in layout order.
	h := alloc(int64(padded * I * 4))
	hb := alloc(int64(padded * I * 2))
	out := alloc(int64(padded * H * 4))
	if bs.err != nil {
		return bs.err
	}
	if err := d.GroupedSwiGLU(xb, m.gate, m.up, sorted, blockExpert, padded, K, n, I, H, h); err != nil {
		return err
	}
	if err := d.F32ToBF16(h, hb, padded*I); err != nil {
		return err
	}
	if err := d.GroupedGEMM(hb, m.down, sorted, blockExpert, padded, K, n, false, H, I, wb, out); err != nil {
		return err
	}

	// Shared expert over every token, its qwen2_moe gate as a row weight.
	shared := Buffer{}
	if m.hasShared {
		S := c.SharedInter
		var sw Buffer
		if m.sharedGate != nil {
			g := make([]float32, T)
			logit := make([]float64, 1)
			for t := 0; t < T; t++ {
				kernels.RouterLogits(logit, x[t*H:(t+1)*H], *m.sharedGate)
				g[t] = float32(1 / (1 + math.Exp(-logit[0])))
			}
			sw = stage(bs, g)
		}
		sh, shb, so := alloc(int64(idRows*S*4)), alloc(int64(idRows*S*2)), alloc(int64(idRows*H*4))
		if bs.err != nil {
			return bs.err
		}
		if err := d.GroupedSwiGLU(xb, m.sGate, m.sUp, idSorted, idExp, idRows, 1, T, S, H, sh); err != nil {
			return err
		}
		if err := d.F32ToBF16(sh, shb, idRows*S); err != nil {
			return err
		}
		if err := d.GroupedGEMM(shb, m.sDn, idSorted, idExp, idRows, 1, T, false, H, S, sw, so); err != nil {
			return err
		}
		shared = so
	}

	yb := alloc(int64(T * H * 4))
	if bs.err != nil {
		return bs.err
	}
	if err := d.Combine(out, rows, T, K, H, shared, yb); err != nil {
		return err
	}
	return download(d, yb, y)
}

// MLAInput is an MLA decode batch as `moex exec mla-decode` takes it: q
// [batch, heads, D], a dense paged cache [blocks, BlockSize, D] as fp32
// (CacheF32) or bf16 bits (CacheBF16), a block table [batch, MaxBlocks]
// and lengths [batch].
type MLAInput struct {
	Q                    []float32
	CacheF32             []float32
	CacheBF16            []uint16
	BlockSize, D         int
	BlockTable           []int32
	MaxBlocks            int
	SeqLens              []int32
	Heads, DV, SplitRows int
	Scale                float32
}

// MLADecode runs MLA decode on the device: out [batch, heads, dv] and lse
// [batch, heads], the contract of dpattn.MLA.
func MLADecode(d Launcher, in MLAInput) (out, lse []float32, err error) {
	n := len(in.CacheF32)
	if in.CacheBF16 != nil {
		n = len(in.CacheBF16)
	}
	if in.BlockSize < 1 || in.D < 1 || n%(in.BlockSize*in.D) != 0 {
		return nil, nil, fmt.Errorf("cuda: mla decode: the cache has %d values, not whole blocks of %d × %d", n, in.BlockSize, in.D)
	}
	if err := in.check(n / (in.BlockSize * in.D)); err != nil {
		return nil, nil, err
	}
	bs := &buffers{d: d}
	defer bs.free()
	var cache Buffer
	if in.CacheBF16 != nil {
		cache = bs.put(upload(d, in.CacheBF16))
	} else {
		cache = bs.put(upload(d, in.CacheF32))
	}
	if bs.err != nil {
		return nil, nil, bs.err
	}
	return mlaDecode(d, cache, in.CacheBF16 != nil, in)
}

// check checks the batch's shapes, lengths and block-table entries against
// a cache of nBlocks blocks.
func (in *MLAInput) check(nBlocks int) error {
	B := len(in.SeqLens)
	if in.Heads < 1 || in.DV < 1 || in.DV > in.D || in.DV > 1024 || in.SplitRows < 1 || len(in.Q) != B*in.Heads*in.D ||
		len(in.BlockTable) != B*in.MaxBlocks {
		return fmt.Errorf("cuda: mla decode: bad shapes (batch %d, heads %d, D %d, dv %d)", B, in.Heads, in.D, in.DV)
	}
	for b, l := range in.SeqLens {
		if l < 1 || int(l) > in.MaxBlocks*in.BlockSize {
			return fmt.Errorf("cuda: mla decode: sequence %d has length %d, the block table holds %d rows", b, l, in.MaxBlocks*in.BlockSize)
		}
		for i, blk := range in.BlockTable[b*in.MaxBlocks:][:(int(l)+in.BlockSize-1)/in.BlockSize] {
			if blk < 0 || int(blk) >= nBlocks {
				return fmt.Errorf("cuda: mla decode: query %d: block table entry %d is %d, out of range [0, %d)", b, i, blk, nBlocks)
			}
		}
	}
	return nil
}

// mlaDecode runs a checked batch over a cache already on the device (its
// Cache fields are not read).
func mlaDecode(d Launcher, cache Buffer, bf16 bool, in MLAInput) (out, lse []float32, err error) {
	sc := &scratch{d: d}
	defer sc.free()
	return mlaDecodeIn(d, sc, cache, bf16, in)
}

// mlaDecodeIn is mlaDecode with its device temporaries in sc.
func mlaDecodeIn(d Launcher, sc *scratch, cache Buffer, bf16 bool, in MLAInput) (out, lse []float32, err error) {
	B := len(in.SeqLens)
	maxLen := 1
	for _, l := range in.SeqLens {
		maxLen = max(maxLen, int(l))
	}
	splits := (maxLen + in.SplitRows - 1) / in.SplitRows
	out, lse = make([]float32, B*in.Heads*in.DV), make([]float32, B*in.Heads)
	if B == 0 {
		return out, lse, nil
	}
	var buf [7]Buffer
	for i, bytes := range []int64{int64(len(in.Q) * 4), int64(len(in.BlockTable) * 4), int64(len(in.SeqLens) * 4),
		int64(B * in.Heads * splits * in.DV * 4), int64(B * in.Heads * splits * 4), int64(len(out) * 4), int64(len(lse) * 4)} {
		if buf[i], err = sc.at(i, bytes); err != nil {
			return nil, nil, err
		}
	}
	q, bt, sl, partO, partL, o, l := buf[0], buf[1], buf[2], buf[3], buf[4], buf[5], buf[6]
	for _, f := range []func() error{
		func() error { return copyIn(d, q, in.Q) },
		func() error { return copyIn(d, bt, in.BlockTable) },
		func() error { return copyIn(d, sl, in.SeqLens) },
	} {
		if err := f(); err != nil {
			return nil, nil, err
		}
	}
	if err := d.MLADecode(bf16, q, cache, bt, sl, B, in.Heads, in.D, in.DV, in.BlockSize, in.MaxBlocks,
		in.SplitRows, splits, in.Scale, partO, partL, o, l); err != nil {
		return nil, nil, err
	}
	if err := download(d, o, out); err != nil {
		return nil, nil, err
	}
	return out, lse, download(d, l, lse)
}
