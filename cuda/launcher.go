//go:build cuda || cudaemu

package cuda

import (
	"context"
	"math"
	"unsafe"

	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/kernels"
)

// Weights are a grouped GEMM's weights on the device, [experts, N, K], in
// one of the formats below. The quantized kernels dequantize each tile to
// bf16 as they load it into shared memory, so quantized experts stay in
// their bytes on the device (FP8: half the memory of bf16; 4-bit: about a
// third with their scales) and run the bf16 path's tensor-core GEMM.
type Weights struct {
	Format WeightFormat
	W      Buffer // bf16 values, FP8 bytes, 4-bit nibbles (two a byte, the even k low), int8 codes, or 5- and 6-bit codes' rows (see NarrowCodes)
	// Scales, fp32: FP8 [experts, ceil(N/BlockRows), ceil(K/BlockCols)];
	// the integer codes [experts, N, K/BlockCols] (BlockRows 1, BlockCols
	// the group; E8M0 bytes with E8, fp16 with Half, the factors' d with
	// Super). Offsets, as Scales, for UINT4, INT8 and UINT5 codes that have
	// them (the zero Buffer: none).
	Scales, Offsets      Buffer
	BlockRows, BlockCols int
	// Super > 0: the codes' scales as GGUF's K-quants factor them, Super
	// groups a super-block. Scales then holds each super-block's d and
	// Offsets its −dmin, [experts, N, K/(BlockCols·Super)], and Factors
	// each group's int8 sc (and m after it, with offsets), [experts, N,
	// K/BlockCols(, 2)]: the group's scale is d·sc and its offset −dmin·m,
	// exact, the values of the fp32 form (0.75 bits a weight rather than 2
	// for Q4_K's groups of 32).
	Factors Buffer
	Super   int
	// E8 (MXFP4): Scales holds the format's E8M0 bytes, a group's scale
	// 2^(E−127) (4.25 bits a weight rather than 5). Half: Scales and
	// Offsets hold fp16 values, as GGUF's Q8_0, Q4_0, Q4_1 and Q5_x blocks
	// do (Q8_0: 8.5 bits a weight rather than 9, Q4_1 5 rather than 6).
	E8, Half bool
}

// Epilogue is what a grouped GEMM computes around its products, each part
// optional (the zero value: nothing).
type Epilogue struct {
	// Bias and Bias2, fp32 [experts, N], are added to the products:
	// GroupedGEMM's, or GroupedSwiGLU's gate and up products.
	Bias, Bias2 Buffer
	// Act is GroupedSwiGLU's activation (the zero value: SwiGLU).
	Act kernels.Activation
	// InScale, fp32 [pairs], scales GroupedSwiGLU's products of each pair
	// before the biases: a routing weight on the expert's input (llama4).
	InScale Buffer
}

// WeightFormat is how a grouped GEMM's weights are stored.
type WeightFormat uint8

// Weight formats: a weight is the stored value (BF16), or its value times
// its block's or group's scale: an e4m3 byte (FP8), an e2m1 nibble (MXFP4),
// a nibble minus 8 (INT4); or a nibble (UINT4), an int8 byte (INT8) or a
// code of 5 or 6 bits (INT5: stored plus 16, UINT5, INT6: plus 32; GGUF's
// Q5_0, Q5_1 and Q5_K, Q6_K; see NarrowCodes) times its group's scale plus
// its offset, if any, rounded once.
const (
	BF16 WeightFormat = iota
	FP8
	MXFP4
	INT4
	UINT4
	INT8
	INT5
	UINT5
	INT6
)

// BF16Weights are bf16 weights w.
func BF16Weights(w Buffer) Weights { return Weights{W: w} }

// sameFormat says whether a and b can be one launch's gate and up.
func sameFormat(a, b Weights) bool {
	return a.Format == b.Format && a.BlockRows == b.BlockRows && a.BlockCols == b.BlockCols && (a.Offsets.Bytes == 0) == (b.Offsets.Bytes == 0) &&
		a.Super == b.Super && a.E8 == b.E8 && a.Half == b.Half
}

// codeKind is the kernels' kind argument of an integer-code format.
// The codes' kind in its low 4 bits, the scales' form (1: E8M0 bytes, 2:
// fp16) from bit 4.
func (w Weights) codeKind() int {
	k := map[WeightFormat]int{MXFP4: 0, INT4: 1, UINT4: 2, INT8: 3, INT5: 4, UINT5: 5, INT6: 6}[w.Format]
	switch {
	case w.E8:
		k |= 1 << 4
	case w.Half:
		k |= 2 << 4
	}
	return k
}

// HalfScales returns scales (or offsets) as fp16 values; false when one is
// not exactly a finite fp16 value.
func HalfScales(v []float32) ([]uint16, bool) {
	out := make([]uint16, len(v))
	for i, x := range v {
		h := half.F32ToF16(x)
		if half.F16ToF32(h) != x || math.IsInf(float64(x), 0) || math.IsNaN(float64(x)) {
			return nil, false
		}
		out[i] = h
	}
	return out, true
}

// E8Scales returns MXFP4 scales (fp32, each a power of two) as E8M0 bytes,
// E the scale's exponent plus 127; false when one is not 2^(E−127) for
// E in [0, 254].
func E8Scales(scales []float32) ([]uint8, bool) {
	out := make([]uint8, len(scales))
	for i, s := range scales {
		frac, exp := math.Frexp(float64(s)) // s = frac·2^exp, frac in [0.5, 1)
		e := exp - 1 + 127
		if frac != 0.5 || e < 0 || e > 254 {
			return nil, false
		}
		out[i] = uint8(e)
	}
	return out, true
}

// NarrowFormat returns the format of 5 or 6 bits that holds every one of
// INT8 codes whose least and greatest are lo and hi, of rows of k codes
// (k a multiple of 8), with offsets or without, and false where none does
// (the codes then stay INT8): INT5 for codes in [−16, 16) without
// offsets (Q5_0), UINT5 for [0, 32) with (Q5_1, Q5_K), INT6 for
// [−32, 32) without (Q6_K).
func NarrowFormat(lo, hi, k int, offsets bool) (WeightFormat, bool) {
	switch {
	case k%8 != 0:
	case !offsets && lo >= -16 && hi < 16:
		return INT5, true
	case offsets && lo >= 0 && hi < 32:
		return UINT5, true
	case !offsets && lo >= -32 && hi < 32:
		return INT6, true
	}
	return INT8, false
}

// NarrowCodes returns INT8 codes [rows, k] (each byte an int8) in the
// narrow format f's device layout: each row's k/2 bytes of low nibbles
// (the even k low), then for each high bit a plane of k/8 bytes (bit k%8
// of byte k/8), of the code plus f's bias.
func NarrowCodes(f WeightFormat, codes []uint8, k int) []uint8 {
	planes, bias := 1, 16
	switch f {
	case UINT5:
		bias = 0
	case INT6:
		planes, bias = 2, 32
	}
	rows := len(codes) / k
	rowBytes := k/2 + planes*k/8
	out := make([]uint8, rows*rowBytes)
	for r := range rows {
		dst := out[r*rowBytes:][:rowBytes]
		for j, c := range codes[r*k:][:k] {
			v := int(int8(c)) + bias
			dst[j/2] |= uint8(v&15) << (4 * (j & 1))
			for p := range planes {
				dst[k/2+p*k/8+j/8] |= uint8(v>>(4+p)&1) << (j & 7)
			}
		}
	}
	return out
}

// Buffer is device memory: an address on the GPU (tag cuda) or a block of
// host memory standing for it (tag cudaemu).
type Buffer struct {
	id    uint64
	Bytes int64
}

// Launcher is what the launch code needs of a device: memory, copies and
// the kernels of kernels/cuda. The GPU (tag cuda) and the CPU emulation
// AlignArgs are the dispatch-layout kernel's operands: n = tokens·top_k
// expert ids, the shard's experts Lo … Lo+Experts-1, blocks of Block rows
// (at most MaxBlocks); the counts, offsets, sorted pairs, each block's
// expert and each pair's row come out.
type AlignArgs struct {
	IDs                              Buffer
	N, Lo, Experts, Block, MaxBlocks int
	Counts, Offsets, Sorted          Buffer
	BlockExpert, Rows                Buffer
}

// GEMMArgs are a grouped expert GEMM's operands beside its weights: the
// activations A, the layout (Sorted pairs, each block's expert, the padded
// rows in blocks of 64), top_k and the pairs, whether A's rows are gathered
// by pair (row pair/TopK: the first projection reading the tokens), the
// output width N and the reduction K, and the epilogue.
type GEMMArgs struct {
	A                   Buffer
	Sorted, BlockExpert Buffer
	PaddedRows          int
	TopK, Pairs         int
	GatherA             bool
	N, K                int
	Epilogue            Epilogue
}

// AttnDecodeArgs are split-KV decode attention's operands: Q [Batch,
// Heads, KeyDim], Cache [blocks, BlockSize, Dim] (bf16 bits when BF16),
// BlockTable [Batch, MaxBlocks], SeqLens [Batch]; PartO and PartL hold
// Batch·Heads·Splits·ValueDim and Batch·Heads·Splits floats; Out [Batch,
// Heads, ValueDim], LSE [Batch, Heads]. Query head h reads group g = h /
// (Heads/KVHeads): its key the KeyDim values from g·KeyDim, its value the
// ValueDim values from ValueOff + g·ValueDim. KVHeads 0 is MLA: one group
// whose key is the whole row (KeyDim = Dim) and whose value is a view of
// its first ValueDim values. Window > 0 attends to the last Window rows;
// Sinks (fp32 [Heads], or the zero Buffer) join each softmax's denominator.
type AttnDecodeArgs struct {
	BF16                                    bool
	Q, Cache, BlockTable, SeqLens           Buffer
	Batch, Heads, Dim, ValueDim             int
	KVHeads, KeyDim, ValueOff, Window       int
	BlockSize, MaxBlocks, SplitRows, Splits int
	Scale                                   float32
	Sinks                                   Buffer
	PartO, PartL, Out, LSE                  Buffer
}

// shape fills MLA's defaults in.
func (m AttnDecodeArgs) shape() AttnDecodeArgs {
	if m.KVHeads == 0 {
		m.KVHeads, m.KeyDim, m.ValueOff = 1, m.Dim, 0
	}
	return m
}

// CopyRowsArgs: for i < Rows, Width values of row SrcMap[i] of Src (from
// SrcCol; rows of SrcStride values) go to row DstMap[i] of Dst (from
// DstCol; DstStride), as fp32 or rounded to bf16 (DstBF16); a zero Buffer
// map is the identity, a negative index skips the row.
type CopyRowsArgs struct {
	Src               Buffer
	SrcStride, SrcCol int
	SrcMap, Dst       Buffer
	DstBF16           bool
	DstStride, DstCol int
	DstMap            Buffer
	Rows, Width       int
}

// (tag cudaemu) implement it, so the same launch code runs on both.
type Launcher interface {
	Alloc(bytes int64) (Buffer, error)
	Free(b Buffer)
	ToDevice(dst Buffer, src unsafe.Pointer, n int64) error
	ToHost(dst unsafe.Pointer, src Buffer, n int64) error
	// ToDeviceAt copies n bytes from the host to dst at byte offset off.
	ToDeviceAt(dst Buffer, off int64, src unsafe.Pointer, n int64) error
	Gate(k kernels.GateArgs, logits, bias, ids, weights Buffer, tokens int) error
	// Align lays out the pairs of the experts Lo … Lo+Experts-1 (a shard;
	// the others' rows are -1); BlockExpert holds MaxBlocks entries, -1
	// past the layout.
	Align(a AlignArgs) error
	Combine(out, rows Buffer, tokens, topK, hidden int, shared, y Buffer) error
	// GroupedGEMM and GroupedSwiGLU take their weights [experts, N, K] in
	// bf16, or in FP8 with block scales (see Weights; gate and up of one
	// format).
	// The epilogue's bias is added before GroupedGEMM's weights multiply.
	// GroupedGEMM writes c [PaddedRows, N] (weights: the pairs' routing
	// weights, or the zero Buffer); GroupedSwiGLU h = silu(a·gateᵀ) ·
	// (a·upᵀ) [PaddedRows, N].
	GroupedGEMM(g GEMMArgs, w Weights, weights, c Buffer) error
	GroupedSwiGLU(g GEMMArgs, gate, up Weights, h Buffer) error
	F32ToBF16(src, dst Buffer, n int) error
	// AttnDecode is decode attention over a paged cache, MLA's or
	// grouped-query attention's (see AttnDecodeArgs), split-KV then merged.
	AttnDecode(m AttnDecodeArgs) error
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
	CopyRows(c CopyRowsArgs) error
	// Collective enqueues op, the work of a communication library (NCCL)
	// on the device's stream, which it is given: after the kernels before
	// it, before those after. On a recorder it becomes a step of the graph
	// (on the emulation, run again at each Replay with Replay's context).
	// op runs with the device held: it must not call the device itself.
	Collective(ctx context.Context, name string, op func(ctx context.Context, stream uintptr) error) error
	// Capture gives record a recorder of the device: the kernels record
	// launches on it make a Graph instead of running (copies are errors),
	// while other users of the device go on as usual.
	Capture(record func(rec Launcher) error) (Graph, error)
}

// GEMMBlock is the row block of the grouped GEMM (kernels/cuda): every
// group's rows in a layout start at a multiple of it.
const GEMMBlock = 64

// The launch shapes and limits of kernels/cuda/mla_prep.cu.
const (
	normThreads = 128
	ropeThreads = 64
	copyThreads = 128
	MaxRope     = 512
)

// IsZero reports whether b is no buffer (the zero Buffer: an optional
// argument left out).
func (b Buffer) IsZero() bool { return b.id == 0 }

// Addr is b's device address (for a communication library such as NCCL).
func (b Buffer) Addr() uintptr { return uintptr(b.id) }

// Upload allocates a buffer on d holding v.
func Upload[T any](d Launcher, v []T) (Buffer, error) {
	var zero T
	n := int64(len(v)) * int64(unsafe.Sizeof(zero))
	b, err := d.Alloc(n)
	if err != nil || n == 0 {
		return b, err
	}
	return b, d.ToDevice(b, unsafe.Pointer(&v[0]), n)
}

// Buffers tracks the device buffers of one call or object: the first
// error of their allocations and uploads, and one Free for all of them.
// The zero value is not usable: make one with NewBuffers.
type Buffers struct {
	d    Launcher
	bufs []Buffer
	err  error
}

// NewBuffers tracks buffers of d.
func NewBuffers(d Launcher) *Buffers { return &Buffers{d: d} }

// Put keeps b (even when e is set: an upload's buffer may exist) and e,
// and returns b.
func (s *Buffers) Put(b Buffer, e error) Buffer {
	if b.id != 0 {
		s.bufs = append(s.bufs, b)
	}
	if e != nil && s.err == nil {
		s.err = e
	}
	return b
}

// Alloc allocates a buffer of bytes (its error kept for Err).
func (s *Buffers) Alloc(bytes int64) Buffer { return s.Put(s.d.Alloc(bytes)) }

// Err is the first error of the allocations and uploads.
func (s *Buffers) Err() error { return s.err }

// Keep records err if it is the first error.
func (s *Buffers) Keep(err error) {
	if s.err == nil {
		s.err = err
	}
}

// Device is the device of the buffers.
func (s *Buffers) Device() Launcher { return s.d }

// Free frees every buffer kept; the set may be used again.
func (s *Buffers) Free() {
	for _, b := range s.bufs {
		s.d.Free(b)
	}
	s.bufs = nil
}

// CopyIn copies v into the device buffer b.
func CopyIn[T any](d Launcher, b Buffer, v []T) error {
	var zero T
	n := int64(len(v)) * int64(unsafe.Sizeof(zero))
	if n == 0 {
		return nil
	}
	return d.ToDevice(b, unsafe.Pointer(&v[0]), n)
}

// Download copies the first len(v) values of b into v.
func Download[T any](d Launcher, b Buffer, v []T) error {
	var zero T
	n := int64(len(v)) * int64(unsafe.Sizeof(zero))
	if n == 0 {
		return nil
	}
	return d.ToHost(unsafe.Pointer(&v[0]), b, n)
}

// BF16Rows widens m's rows and rounds them to bf16 bits: [rows, cols],
// row-major, as the device kernels take weights.
func BF16Rows(m kernels.Matrix) []uint16 {
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

// DenseLayout is the grouped GEMM's layout of rows rows all in group 0 (a
// dense GEMM: the router, a shared expert): the rows in order, padded to
// GEMMBlock with the sentinel rows, and the group of each row block.
func DenseLayout(rows int) (sorted, blockGroup []int32) {
	blocks := (rows + GEMMBlock - 1) / GEMMBlock
	sorted = make([]int32, blocks*GEMMBlock)
	for i := range sorted {
		sorted[i] = int32(min(i, rows)) // rows: kernels.Layout's sentinel for top-1
	}
	return sorted, make([]int32, blocks)
}

// Pow2 is the smallest power of two ≥ n (n ≥ 1): the buckets of graphs.
func Pow2(n int) int {
	p := 1
	for p < n {
		p *= 2
	}
	return p
}
