package kernels

import (
	"context"
	"fmt"
	"math"
	"sync"
	"unsafe"

	"github.com/moex-project/moex/internal/buffers"
	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/internal/hugepage"
)

// The int8-dot numerics mode, llama.cpp's way of computing with integer
// codes, chosen per matrix (PackInt8Dot) and never taken otherwise. Each
// activation row is quantized per block of 32: d = max|x|/127 (fp32),
// q = round-to-even(x·(1/d)) kept in [−127, 127] as int8 (d = 0: q = 0;
// also where 1/d is past fp32's range and x is 0). For weight group g of
// row n (scale s, offset o, codes c; the group inside one block b), with
// I = Σ c·q over the group (exact integers) and S = Σ q:
//
//	acc = fma(float(I), s·d_b, acc)            (s·d_b rounded once)
//	acc = fma(o, d_b·float(S), acc)            (offsets only; d_b·S rounded once)
//
// over the groups in ascending order, from zero (MXFP4: c twice the
// nibble's e2m1 value, s half its block's scale, 2^(E−128)): an output depends on its
// own activation row and weight row only, and the generic code and the
// VNNI kernels (vpdpbusd) compute the same bits. The error against exact
// arithmetic is that of rounding the activations to int8 (about 2^-8 of a
// block's largest value each).

// Numerics is how a matrix's products are computed.
type Numerics uint8

const (
	// Exact: weights widened to fp32, fp32 FMA chains in ascending k.
	Exact Numerics = iota
	// Int8Dot: activations quantized to int8 per 32, integer dot products
	// per weight group (see PackInt8Dot).
	Int8Dot
	// BF16Dot: bf16 weights against activations rounded to bf16, pairs of
	// products added as vdpbf16ps adds them (see PackBF16Dot).
	BF16Dot
)

// String returns the mode's name as the command line takes it.
func (n Numerics) String() string {
	switch n {
	case Exact:
		return "exact"
	case Int8Dot:
		return "int8dot"
	case BF16Dot:
		return "bf16dot"
	}
	return fmt.Sprintf("Numerics(%d)", uint8(n))
}

// ParseNumerics returns the mode named s ("exact", "int8dot", "bf16dot").
func ParseNumerics(s string) (Numerics, error) {
	switch s {
	case "exact":
		return Exact, nil
	case "int8dot":
		return Int8Dot, nil
	case "bf16dot":
		return BF16Dot, nil
	}
	return 0, fmt.Errorf("kernels: numerics %q: want exact, int8dot or bf16dot", s)
}

// Pack returns m packed for mode n: Pack's layout for Exact, PackInt8Dot's
// and PackBF16Dot's for the others.
func (n Numerics) Pack(m Matrix) (Matrix, error) {
	switch n {
	case Exact:
		return Pack(m), nil
	case Int8Dot:
		return PackInt8Dot(m)
	case BF16Dot:
		return PackBF16Dot(m)
	}
	return Matrix{}, fmt.Errorf("kernels: numerics %v", n)
}

// Numerics returns the mode m's products are computed in.
func (m Matrix) Numerics() Numerics {
	switch {
	case m.dot8:
		return Int8Dot
	case m.bdot:
		return BF16Dot
	}
	return Exact
}

// dot8Block is the activation block of the int8-dot mode.
const dot8Block = 32

// dot8Unit is the k steps of one unit of an int8-dot panel: 64 bytes of
// UINT4 (row l's byte 4l + i holds its codes of steps i, low, and 4 + i,
// high) or 128 of INT8 (two 64-byte halves, steps 0…3 then 4…7, row l's
// bytes 4l…4l+3, each code plus 128). INT8 codes of 5 or 6 bits (see
// PackInt8Dot) take 64 bytes of low nibbles as UINT4's, then each high
// bit's plane: 16 bytes, a 64-bit word for steps 0…3 and one for 4…7,
// row l's step i at bit 4l + i.
const dot8Unit = 8

// PackInt8Dot returns m, a UINT4, INT8, MXFP4 or INT4 matrix whose groups are
// 8, 16 or 32 columns and whose columns are whole blocks of 32, packed for the
// int8-dot mode: its products are computed as the mode defines (see
// Numerics) by every kernel call, on every implementation. At and RowF32
// still give the weights' values. Other matrices are an error naming why.
//
// INT8 codes that fit in 5 or 6 bits (GGUF's Q5_0, Q5_1, Q5_K and Q6_K)
// are held in that many bits: signed codes in [−16, 16) without offsets
// (Q5_0) as 5 bits plus 16, unsigned ones below 32 with offsets (Q5_1,
// Q5_K) as 5 bits, and signed codes in [−32, 32) without offsets (Q6_K,
// and Q5_0's with K-quant factors, whose kernels read those) as 6 bits
// plus 32; the products are the same integers either way. MXFP4's codes
// are twice its e2m1 values (integers in [−12, 12]) and its scales half
// its blocks' (2^(E−128)): the nibbles stay, a kernel looks their codes up.
// INT4's nibbles (GGUF's Q4_0) are the codes plus 8, as stored: a kernel
// takes 8·S off a group's integer sum.
func PackInt8Dot(m Matrix) (Matrix, error) {
	if m.dot8 {
		return m, nil
	}
	if m.DType != UINT4 && m.DType != INT8 && m.DType != MXFP4 && m.DType != INT4 {
		return Matrix{}, fmt.Errorf("kernels: int8dot numerics need UINT4, INT8, MXFP4 or INT4 weights, have %v", m.DType)
	}
	if g := m.q.cols; dot8Block%g != 0 || g%dot8Unit != 0 || m.Cols%dot8Block != 0 {
		return Matrix{}, fmt.Errorf("kernels: int8dot numerics need groups of 8, 16 or 32 and whole blocks of %d columns, have groups of %d over %d", dot8Block, g, m.Cols)
	}
	p := Matrix{DType: m.DType, Rows: m.Rows, Cols: m.Cols, lut: m.lut, packed: true, dot8: true}
	codes := make([]uint8, m.Cols)
	if m.DType == INT8 {
		p.planes, p.bias = m.narrowCodes(codes)
	}
	// The kernels read the K-quants' factors where there are some (every
	// implementation has kernels for them), else the scales in the
	// int8-dot panel layout; either then holds the values (see
	// blockScales.scale), no fp32 grid beside them.
	if m.q.kFactored(m.DType) {
		p.q = m.q.dropGrid()
		p.q.panel, p.q.offPanel, p.q.dot8Panel = nil, nil, false
		p.q.panels = m.panels()
		if p.q.kmeta == nil { // packed for the exact mode, m holds them so already
			p.q.kmeta = m.q.dot8Factors(m.Rows, m.panels())
		}
		p.q.super = &superScales{per: m.q.super.per, offsets: m.q.super.offsets} // the factors in kmeta only
	} else {
		p.q = m.q.dot8Scales(m.Rows, m.panels()).dropGrid()
	}
	if m.DType == MXFP4 {
		// Codes twice the e2m1 values (integers in [−12, 12]), scales half
		// the block's: the same products, exact (see code). The scales
		// are held as the file has them, a byte (E8M0) a block, which the
		// kernels make into 2^(E−128).
		e8, err := toE8(p.q, m.Rows)
		if err != nil {
			return Matrix{}, fmt.Errorf("kernels: int8dot numerics: %w", err)
		}
		p.q.panel, p.q.e8 = nil, e8
		p.q.pow2 = false
	}
	if p.q.panel != nil && hasHalfKind(p) {
		// fp16 scales (and offsets), as GGUF's Q8_0, Q4_0, Q4_1 and Q5_x
		// hold them, are kept so, at half the bytes of fp32: the kernels
		// widen them exactly.
		if h, ok := toHalf(p.q.panel); ok {
			if o, ok := toHalf(p.q.offPanel); ok {
				p.q.h16, p.q.offH16 = h, o
				p.q.panel, p.q.offPanel = nil, nil
			}
		}
	}
	unit := p.dot8UnitBytes()
	p.u8 = hugepage.Bytes(m.panels() * m.Cols / dot8Unit * unit)
	// Row by row, a unit (8 steps) at a time: the layout of dot8Index.
	for i := 0; i < m.Rows; i++ {
		m.codeRow(i, codes)
		l := i % PanelWidth
		row := p.u8[(i-l)/PanelWidth*m.Cols/dot8Unit*unit:]
		switch {
		case m.DType.Bits() == 4:
			for u := 0; u < m.Cols; u += dot8Unit {
				at := u/dot8Unit*64 + 4*l
				for r := range 4 {
					row[at+r] = codes[u+r] | codes[u+4+r]<<4
				}
			}
		case p.planes > 0: // nibbles, then each high bit's plane
			for u := 0; u < m.Cols; u += dot8Unit {
				un := row[u/dot8Unit*unit:][:unit]
				for r := range 4 {
					c0, c1 := codes[u+r]+p.bias, codes[u+4+r]+p.bias
					un[4*l+r] = c0&15 | c1<<4
					for pl := range int(p.planes) {
						bit := uint(4 + pl)
						un[64+16*pl+l/2] |= c0 >> bit & 1 << (4*(l&1) + r)
						un[72+16*pl+l/2] |= c1 >> bit & 1 << (4*(l&1) + r)
					}
				}
			}
		default:
			for u := 0; u < m.Cols; u += dot8Unit {
				at := u/dot8Unit*128 + 4*l
				for r := range 4 {
					row[at+r], row[at+64+r] = codes[u+r]+128, codes[u+4+r]+128
				}
			}
		}
	}
	return p, nil
}

// hasHalfKind says whether the int8-dot kernels have a kind on fp16
// scales for the codes of p, an int8-dot matrix on fp32 scales: GGUF's
// Q8_0 (INT8 without offsets), Q4_0 (INT4), Q4_1 (UINT4 with offsets),
// Q5_0 and Q5_1 (5-bit codes, signed or with offsets).
func hasHalfKind(p Matrix) bool {
	offsets := p.q.hasOffsets()
	switch {
	case p.DType == INT4:
		return true
	case p.DType == UINT4:
		return offsets
	case p.planes == 1:
		return true
	case p.DType == INT8 && p.planes == 0:
		return !offsets
	}
	return false
}

// toHalf returns v as fp16 values, and whether each is one exactly (nil
// for nil).
func toHalf(v []float32) ([]uint16, bool) {
	if v == nil {
		return nil, true
	}
	h := make([]uint16, len(v))
	for i, f := range v {
		h[i] = half.F32ToF16(f)
		if math.Float32bits(half.F16ToF32(h[i])) != math.Float32bits(f) {
			return nil, false
		}
	}
	return h, true
}

// narrowCodes returns how Pack and PackInt8Dot hold the codes of m, an
// INT8 matrix: its high bits' planes (0: a byte a code) and the bias its
// codes are stored plus. Codes of 5 or 6 bits need groups of a multiple
// of 8 steps (the kernels' units). row is scratch [Cols].
func (m Matrix) narrowCodes(row []uint8) (planes, bias uint8) {
	if m.q.cols%dot8Unit != 0 {
		return 0, 0
	}
	lo, hi := 0, 0
	for i := 0; i < m.Rows; i++ {
		m.codeRow(i, row)
		for _, c := range row {
			lo, hi = min(lo, int(int8(c))), max(hi, int(int8(c)))
		}
	}
	offsets := m.q.hasOffsets()
	switch {
	case !offsets && lo >= -16 && hi < 16 && m.q.super == nil: // Q5_0 (with factors: 6 bits, whose kernels read them)
		return 1, 16
	case offsets && lo >= 0 && hi < 32: // Q5_1, Q5_K
		return 1, 0
	case !offsets && lo >= -32 && hi < 32: // Q6_K
		return 2, 32
	}
	return 0, 0
}

// dot8UnitBytes is the bytes of one unit (dot8Unit steps) of a panel of
// the int8-dot matrix m.
func (m Matrix) dot8UnitBytes() int {
	switch {
	case m.DType.Bits() == 4:
		return 64
	case m.planes > 0:
		return 64 + 16*int(m.planes)
	}
	return 128
}

// codeBits is the bits a code of m takes in memory.
func (m Matrix) codeBits() int {
	if m.planes > 0 {
		return 4 + int(m.planes)
	}
	return m.DType.Bits()
}

// codeRow writes row i's integer codes (UINT4: 0…15; MXFP4 and INT4: their
// nibbles; INT8: the int8's bits) to dst [Cols], from m's plain or packed layout (not an int8-dot
// one): code for a whole row, its layout's arithmetic out of the loop.
func (m Matrix) codeRow(i int, dst []uint8) {
	l := i % PanelWidth
	switch {
	case m.DType.Bits() == 4 && m.packed: // a byte a step pair, 16 rows side by side
		src := m.u8[(i-l)*m.Cols/2+l:]
		for j := 0; j < len(dst); j += 2 {
			b := src[j/2*PanelWidth]
			dst[j], dst[j+1] = b&15, b>>4
		}
	case m.DType.Bits() == 4: // row-major nibbles, the low one first
		for j := range dst {
			k := i*m.Cols + j
			dst[j] = m.u8[k/2] >> (4 * (k & 1)) & 15
		}
	case m.planes > 0: // INT8 codes of 5 or 6 bits (packNarrow)
		for j := range dst {
			dst[j] = uint8(m.narrowCode(i, j))
		}
	case m.packed: // INT8: a step of 16 rows side by side
		src := m.u8[(i-l)*m.Cols+l:]
		for j := range dst {
			dst[j] = src[j*PanelWidth]
		}
	default:
		copy(dst, m.u8[i*m.Cols:][:m.Cols])
	}
}

// dot8Scales lays out an int8-dot matrix's scales (and offsets) for its
// kernels: panels in runs of dot8Run, each run's groups in order, a
// group's scales of the run's panels side by side (16 a panel), so that a
// kernel over a run's panels and the whole k range reads them as one
// stream: panel p's group g at ((p/dot8Run·groups + g)·dot8Run + p%dot8Run)·16.
func (q *blockScales) dot8Scales(rows, panels int) *blockScales {
	p := *q
	p.panels, p.dot8Panel = panels, true
	p.h16, p.offH16 = nil, nil // the exact mode's layout (see Pack)
	p.e8, p.e8Exact = nil, false
	runs := (panels + dot8Run - 1) / dot8Run
	lay := func(v func(g int) float32) []float32 {
		dst := make([]float32, runs*q.gridCols*dot8Run*PanelWidth)
		for g := range rows * q.gridCols {
			dst[p.panelAt(g)] = v(g)
		}
		return dst
	}
	p.panel = lay(q.scale)
	p.offPanel = nil
	if q.hasOffsets() {
		p.offPanel = lay(q.offset)
	}
	return &p
}

// dot8Factors lays out a matrix's K-quant factors for the K kernels (see
// dot8KFunc): for each run of dot8Run panels, each super-block's header
// (d, then −dmin with offsets: [dot8Run][16] floats each) and its groups'
// factors (sc, then m: [dot8Run][16] int8 each).
func (q *blockScales) dot8Factors(rows, panels int) []byte {
	sup := q.super
	offs := q.hasOffsets()
	hdr, grp := 256, 64
	if offs {
		hdr, grp = 512, 128
	}
	supers := q.gridCols / sup.per
	runBytes := supers * (hdr + sup.per*grp)
	runs := (panels + dot8Run - 1) / dot8Run
	out := make([]byte, runs*runBytes)
	for r := range rows {
		pi := r / PanelWidth
		lane := pi%dot8Run*PanelWidth + r%PanelWidth
		for sb := range supers {
			base := pi/dot8Run*runBytes + sb*(hdr+sup.per*grp)
			*(*float32)(unsafe.Pointer(&out[base+4*lane])) = sup.d[r*supers+sb]
			if offs {
				*(*float32)(unsafe.Pointer(&out[base+256+4*lane])) = -sup.dmin[r*supers+sb]
			}
			for gi := range sup.per {
				at := base + hdr + gi*grp
				g := r*q.gridCols + sb*sup.per + gi
				out[at+lane] = uint8(sup.sc[g])
				if offs {
					out[at+64+lane] = uint8(sup.m[g])
				}
			}
		}
	}
	return out
}

// kFactored says whether a packed matrix of dtype dt with scales q
// holds them as the K-quants' factors only (its kmeta): those with
// factors, but for UINT4 without offsets (whose int8-dot kernels read
// fp32 scales).
func (q *blockScales) kFactored(dt DType) bool {
	return q.super != nil && (dt == INT8 || q.hasOffsets())
}

// kmetaAt reads group g's factors from an int8-dot matrix's kmeta (see
// dot8Factors): d and sc, or with min −dmin and m.
func (q *blockScales) kmetaAt(g int, min bool) (float32, int8) {
	per := q.super.per
	hdr, grp := 256, 64
	if q.hasOffsets() {
		hdr, grp = 512, 128
	}
	supers := q.gridCols / per
	runBytes := supers * (hdr + per*grp)
	r, b := g/q.gridCols, g%q.gridCols
	pi := r / PanelWidth
	lane := pi%dot8Run*PanelWidth + r%PanelWidth
	base := pi/dot8Run*runBytes + b/per*(hdr+per*grp)
	at, fat := base+hdr+b%per*grp+lane, base+4*lane
	if min {
		at, fat = at+64, fat+256
	}
	return *(*float32)(unsafe.Pointer(&q.kmeta[fat])), int8(q.kmeta[at])
}

// dot8Run is the panels whose scales an int8-dot matrix keeps side by
// side: a tile's (tileCols).
const dot8Run = tileCols / PanelWidth

// code is the integer code of element [i, j] of a UINT4 or INT8 matrix,
// or of an int8-dot MXFP4 one (twice its e2m1 value) or INT4 one (its
// nibble less 8).
func (m Matrix) code(i, j int) int {
	if m.dot8 {
		at, shift := m.dot8Index(i, j)
		switch {
		case m.DType == UINT4:
			return int(m.u8[at] >> shift & 15)
		case m.DType == MXFP4: // twice the e2m1 value
			return int(2 * m.lut[m.u8[at]>>shift&15])
		case m.DType == INT4:
			return int(m.lut[m.u8[at]>>shift&15])
		case m.planes > 0:
			c := int(m.u8[at] >> shift & 15)
			l, u, r := i%PanelWidth, j/dot8Unit, j%dot8Unit
			unit := m.u8[(i-l)/PanelWidth*m.Cols/dot8Unit*m.dot8UnitBytes()+u*m.dot8UnitBytes():]
			for pl := range int(m.planes) {
				word := 64 + 16*pl + 8*(r/4)
				c |= int(unit[word+l/2]>>(4*(l&1)+r%4)&1) << (4 + pl)
			}
			return c - int(m.bias)
		}
		return int(m.u8[at]) - 128
	}
	if m.planes > 0 {
		return m.narrowCode(i, j)
	}
	k := i*m.Cols + j
	if m.packed {
		k = m.packedIndex(i, j)
	}
	if m.DType == UINT4 {
		return int(m.u8[k/2] >> (4 * (k & 1)) & 15)
	}
	return int(int8(m.u8[k]))
}

// dot8Index is the byte and bit shift of element [i, j] of an int8-dot
// matrix (of its low nibble, for codes of 5 or 6 bits).
func (m Matrix) dot8Index(i, j int) (at int, shift uint) {
	l, u, r := i%PanelWidth, j/dot8Unit, j%dot8Unit
	unit := m.dot8UnitBytes()
	at = (i-l)/PanelWidth*m.Cols/dot8Unit*unit + u*unit + 4*l + r%4
	if r >= 4 {
		if unit != 128 {
			return at, 4
		}
		at += 64
	}
	return at, 0
}

// dot8Rows are activation rows quantized for the int8-dot mode against
// weights in groups of g: each row a run of K/g records of g int8 codes
// then 16 bytes: d_b (fp32), d_b·S (fp32), 128·S (int32), zero.
//
// For the bf16-dot mode the same value holds the rows rounded to bf16
// instead (bf, k each; see roundAll).
type dot8Rows struct {
	g, rec, k int // group, record bytes, row length
	buf       []byte
	bf        []uint16
}

// roundAll fills q with every row of x [rows, k] rounded to bf16 (the
// bf16-dot mode's activations), on up to workers goroutines.
func (q *dot8Rows) roundAll(ctx context.Context, workers int, x []float32, k int) error {
	q.k, q.g, q.buf = k, 0, q.buf[:0]
	if cap(q.bf) < len(x) {
		q.bf = make([]uint16, len(x))
	}
	q.bf = q.bf[:len(x)]
	const chunk = 16 << 10
	return Parallel(ctx, workers, (len(x)+chunk-1)/chunk, func(c int) {
		lo := c * chunk
		for i, v := range x[lo:min(len(x), lo+chunk)] {
			q.bf[lo+i] = half.F32ToBF16(v)
		}
	})
}

// row returns row r's records.
func (q *dot8Rows) row(r int) []byte {
	n := q.k / q.g * q.rec
	return q.buf[r*n:][:n]
}

// from is q without its first r0 rows.
func (q *dot8Rows) from(r0 int) dot8Rows {
	v := *q
	if q.bf != nil {
		v.bf = q.bf[r0*q.k:]
		return v
	}
	v.buf = q.buf[r0*q.k/q.g*q.rec:]
	return v
}

// ptrs returns the first record of each row idx picks (nil: every row).
func (q *dot8Rows) ptrs(dst []*byte, idx []int32, rows int) []*byte {
	dst = dst[:0]
	for r := range rows {
		i := r
		if idx != nil {
			i = int(idx[r])
		}
		dst = append(dst, &q.row(i)[0])
	}
	return dst
}

// reset sizes q for n rows of k activations against groups of g.
func (q *dot8Rows) reset(n, k, g int) {
	q.g, q.rec, q.k, q.bf = g, g+16, k, nil
	size := n * k / g * q.rec
	if cap(q.buf) < size {
		q.buf = make([]byte, size)
	}
	q.buf = q.buf[:size]
}

// quantize fills q (reset for them) with rows of k activations for
// groups of g.
func (q *dot8Rows) quantize(rows []*float32, k, g int) {
	q.reset(len(rows), k, g)
	for r, p := range rows {
		quantizeRow(q.row(r), unsafe.Slice(p, k), g)
	}
}

// quantizeAll is quantize over every row of x [rows, k] (rows' indices
// idx, nil for all) on up to workers goroutines.
func (q *dot8Rows) quantizeAll(ctx context.Context, workers int, x []float32, k, g int) error {
	n := len(x) / k
	q.reset(n, k, g)
	const chunk = 16
	return Parallel(ctx, workers, (n+chunk-1)/chunk, func(c int) {
		for r := c * chunk; r < min(n, (c+1)*chunk); r++ {
			quantizeRow(q.row(r), x[r*k:][:k], g)
		}
	})
}

// quantizeRow writes the records of one row x in groups of g to out.
func quantizeRow(out []byte, x []float32, g int) {
	rec := g + 16
	if s := active; s != nil && len(x) > 0 {
		if f := s.quant8[g]; f != nil {
			_ = out[len(x)/g*rec-1]
			f(&out[0], &x[0], len(x)/dot8Block)
			return
		}
	}
	for b := 0; b < len(x); b += dot8Block {
		var amax float32
		for _, v := range x[b : b+dot8Block] {
			amax = max(amax, math.Float32frombits(math.Float32bits(v)&^(1<<31)))
		}
		d := amax / 127
		var id float32
		if d != 0 {
			id = 1 / d
		}
		for g0 := b; g0 < b+dot8Block; g0 += g {
			r := out[g0/g*rec:][:rec]
			var s int32
			for j, v := range x[g0 : g0+g] {
				var c int8
				if f := float64(v * id); f == f { // NaN (0·∞, 1/d past fp32's range): 0
					c = int8(max(-127, min(127, math.RoundToEven(f))))
				}
				r[j] = uint8(c)
				s += int32(c)
			}
			*(*float32)(unsafe.Pointer(&r[g])) = d
			*(*float32)(unsafe.Pointer(&r[g+4])) = d * float32(s)
			*(*int32)(unsafe.Pointer(&r[g+8])) = 128 * s
			*(*int32)(unsafe.Pointer(&r[g+12])) = 0
		}
	}
}

// dot8Generic computes c[r][n−n0] for n in [n0, n1), the rows whose
// records start at recs[r] (records of rec bytes), against the int8-dot
// matrix b: the mode's definition, in Go.
func dot8Generic(c []float32, ldc int, recs []*byte, rec int, b Matrix, n0, n1 int) {
	K, g := b.Cols, b.q.cols
	for r, p := range recs {
		recs := unsafe.Slice(p, K/g*rec)
		for n := n0; n < n1; n++ {
			var acc float32
			for gi := 0; gi < K/g; gi++ {
				rec := recs[gi*rec:][:rec]
				var dot int32
				for j := range g {
					dot += int32(b.code(n, gi*g+j)) * int32(int8(rec[j]))
				}
				d := *(*float32)(unsafe.Pointer(&rec[g]))
				gs := gi + n*b.q.gridCols
				acc = fmaF32(float32(dot), b.q.scale(gs)*d, acc)
				if b.q.hasOffsets() {
					acc = fmaF32(b.q.offset(gs), *(*float32)(unsafe.Pointer(&rec[g+4])), acc)
				}
			}
			c[r*ldc+n-n0] = acc
		}
	}
}

// exactRows computes c[r][n−n0] = rows[r]·b[n] in the exact mode's
// generic order (one fp32 FMA chain in ascending k), for a matrix called
// beside an int8-dot one.
func exactRows(c []float32, ldc int, rows []*float32, b Matrix, n0, n1 int) {
	w := make([]float32, b.Cols)
	for n := n0; n < n1; n++ {
		b.RowF32(n, w)
		for r, p := range rows {
			var acc float32
			for k, x := range unsafe.Slice(p, b.Cols) {
				acc = fmaF32(x, w[k], acc)
			}
			c[r*ldc+n-n0] = acc
		}
	}
}

// dot8Func is an int8-dot kernel: for mr rows of quantized activations
// (records of a group's codes and its d, d·S, 128·S, see dot8Rows; a[r]
// at the first group's) and np panels of an int8-dot matrix (panel j at
// b + j·stride), it computes groups groups of units·8 steps each into the
// tile c (row stride ldc bytes, from c with flags bit 0, else from zero):
// the group's integer dot products (vpdpbusd), their float conversion
// (less bias·S first for codes stored plus a bias: 128 for INT8 bytes, 16
// or 32 for signed 5- or 6-bit codes), times s·d plus, with offsets,
// o·(d·S); s and o
// hold the panels' scales and offsets, 16 a panel, moving on ss bytes a
// group, the records on rec bytes.
type dot8Func func(a *[maxDot8Rows]*byte, b *byte, stride, groups int, c *float32, ldc, flags int, s, o *float32, units, rec, ss int)

// dot8Table holds int8-dot kernels by rows and panel count.
type dot8Table = [maxDot8Rows + 1][]dot8Func

// maxDot8Rows is the most activation rows of an int8-dot kernel call.
const maxDot8Rows = 4

// dot8KFunc is dot8Func on a matrix whose scales and offsets are the
// K-quants' factors (see WithSuperScales): meta holds, for the run of
// panels the call's are in, each super-block's header (d, then −dmin with
// offsets, 16 floats a panel) followed by its groups' int8 factors (sc,
// then m with offsets, 16 a panel); lane is 16 times the first panel's
// place in its run; per is the groups of a super-block.
type dot8KFunc func(a *[maxDot8Rows]*byte, b *byte, stride, groups int, c *float32, ldc, flags int, meta *byte, lane, units, per int)

// dot8KTable holds K-quant int8-dot kernels by rows and panel count.
type dot8KTable = [maxDot8Rows + 1][]dot8KFunc

// dot8Kernels are an implementation's int8-dot kernels by weight dtype
// (UINT4, INT8, INT8 codes of 5 bits signed or unsigned and of 6 bits
// signed, see PackInt8Dot, MXFP4 and INT4), with offsets or without, and
// on K-quant factors.
type dot8Kernels struct {
	u4, u4m, i8, i8m, s5, u5m, s6, m4, s4 dot8Table
	hi8, hs4, hu4m, hs5, hu5m             dot8Table // on fp16 scales (see blockScales.h16)
	u4km, i8k, i8km, u5km, s6k            dot8KTable
}

// tables returns s's kernels for the int8-dot matrix b: by its scales, or
// (k not nil) by its K-quant factors where there are kernels for them.
func (s *dot8Kernels) tables(b Matrix) (t *dot8Table, k *dot8KTable) {
	offsets := b.q.hasOffsets()
	if b.q.h16 != nil { // the kinds of hasHalfKind
		switch {
		case b.DType == INT4:
			return &s.hs4, nil
		case b.DType == UINT4:
			return &s.hu4m, nil
		case b.planes == 1 && b.bias != 0:
			return &s.hs5, nil
		case b.planes == 1:
			return &s.hu5m, nil
		}
		return &s.hi8, nil
	}
	switch {
	case b.DType == MXFP4:
		return &s.m4, nil
	case b.DType == INT4:
		return &s.s4, nil
	case b.planes == 1 && b.bias != 0:
		return &s.s5, nil
	case b.planes == 1:
		t, k = &s.u5m, &s.u5km
	case b.planes == 2:
		t, k = &s.s6, &s.s6k
	case b.DType == INT8 && offsets:
		t, k = &s.i8m, &s.i8km
	case b.DType == INT8:
		t, k = &s.i8, &s.i8k
	case offsets:
		t, k = &s.u4m, &s.u4km
	default:
		return &s.u4, nil
	}
	if b.q.super == nil || b.q.kmeta == nil {
		k = nil
	}
	return t, k
}

func (s *simd) hasDot8() bool { return s.dot8 != nil }

// dot8GEMM is dot8Generic on s's kernels: every row strip against every
// run of panels, the whole k range a call.
func (s *simd) dot8GEMM(sc *dotScratch, recs []*byte, rec int, b Matrix, n0, n1 int, c []float32, ldc int) {
	M := len(recs)
	K, g := b.Cols, b.q.cols
	tab, ktab := s.dot8.tables(b)
	p0, p1 := n0/PanelWidth, (n1+PanelWidth-1)/PanelWidth
	ldt := (p1 - p0) * PanelWidth
	tile := buffers.Grow(&sc.tile, M*ldt)
	stride := K / dot8Unit * b.dot8UnitBytes()
	ss := 4 * dot8Run * PanelWidth
	ap := &sc.ap8
	var run int // bytes of one run of panels' factors
	if ktab != nil {
		run = len(b.q.kmeta) / ((b.q.panels + dot8Run - 1) / dot8Run)
	}
	maxMR := maxDot8Rows // the most rows the kernels to be called take
	for maxMR > 1 && (ktab == nil && len(tab[maxMR]) == 0 || ktab != nil && len(ktab[maxMR]) == 0) {
		maxMR--
	}
	// The panels a kernel call takes side by side: as many as it has, but
	// one for a decode call over codes a byte each (see dot8OnePanel).
	maxNP := dot8MaxNP
	if M <= decodeRows && b.dot8UnitBytes() == 128 && dot8OnePanel {
		maxNP = 1
	}
	for m0, mr := 0, 0; m0 < M; m0 += mr {
		mr = min(maxMR, M-m0)
		copy(ap[:], recs[m0:m0+mr])
		if ktab != nil {
			ks := ktab[mr]
			for p := p0; p < p1; {
				np := min(len(ks)-1, p1-p, dot8Run-p%dot8Run, maxNP)
				ks[np](ap, &b.u8[p*stride], stride, K/g, &tile[m0*ldt+(p-p0)*PanelWidth], 4*ldt, 0, &b.q.kmeta[p/dot8Run*run],
					16*(p%dot8Run), g/dot8Unit, b.q.super.per)
				p += np
			}
			continue
		}
		ks := tab[mr]
		for p := p0; p < p1; {
			// At most the rest of p's run of panels: their scales side by side.
			np := min(len(ks)-1, p1-p, dot8Run-p%dot8Run, maxNP)
			at := (p/dot8Run*(K/g)*dot8Run + p%dot8Run) * PanelWidth
			var off *float32
			if b.q.offPanel != nil {
				off = &b.q.offPanel[at]
			}
			scales, sb := (*float32)(nil), ss
			switch {
			case b.q.e8 != nil: // MXFP4: the exponents, a byte a block
				scales, sb = (*float32)(unsafe.Pointer(&b.q.e8[at])), ss/4
			case b.q.h16 != nil: // fp16 values
				scales, sb = (*float32)(unsafe.Pointer(&b.q.h16[at])), ss/2
				if b.q.offH16 != nil {
					off = (*float32)(unsafe.Pointer(&b.q.offH16[at]))
				}
			default:
				scales = &b.q.panel[at]
			}
			ks[np](ap, &b.u8[p*stride], stride, K/g, &tile[m0*ldt+(p-p0)*PanelWidth], 4*ldt, 0, scales, off, g/dot8Unit, rec, sb)
			p += np
		}
	}
	for r := range M {
		copy(c[r*ldc:][:n1-n0], tile[r*ldt+n0-p0*PanelWidth:])
	}
}

// dot8OnePanel has the int8-dot kernels of a decode call (at most
// decodeRows rows) over INT8 codes a byte each (GGUF's Q8_0) take one
// panel at a time: their weights then stream from DRAM 15-20 % faster
// than four panels side by side (a 151,936 × 2048 output projection and a
// grouped FFN of 8 experts at Qwen3-30B-A3B's shapes on a 2-core Zen 4,
// interleaved in one process; at 2880 columns too, so not the panels'
// 4 KiB aliasing), where the nibble kinds (Q4_K, Q6_K, MXFP4) stream
// faster four side by side. A variable for the tests, which compare the
// two (the bits are the same).
var dot8OnePanel = true

// dot8MaxNP is more panels than any int8-dot kernel takes side by side.
const dot8MaxNP = 8

var dotPool = sync.Pool{New: func() any { return new(dotScratch) }}

// dotScratch is the working memory of a call in the int8-dot or the
// bf16-dot mode.
type dotScratch struct {
	ap8   [maxDot8Rows]*byte     // a kernel call's rows (on the heap were they
	apb   [maxKernelRows]*uint16 // a local: the kernels are called through tables)
	q     [2]dot8Rows
	rows  []*float32
	recs  []*byte
	c     [2][]float32
	tile  []float32
	bf    [][]uint16 // the rows rounded to bf16
	buf16 []uint16
}

// dotGEMM computes c[i][r][n−n0] = rows[r]·b[i][n] for n in [n0, n1),
// each matrix in its mode (int8-dot, bf16-dot, or exact beside them), c[i]
// holding len(rows) rows of ldc floats. pre, when not nil, holds the rows
// already quantized or rounded (row r at pre's row idx[r], or r with idx
// nil), for the matrices it was made for.
func dotGEMM(sc *dotScratch, rows []*float32, pre *dot8Rows, idx []int32, b []Matrix, n0, n1 int, c [2][]float32, ldc int) {
	for i, bi := range b {
		if bi.bdot {
			if i == 0 || !b[0].bdot { // gate and up share the rounded rows
				sc.round(rows, bi.Cols, pre, idx)
			}
			if s := active; s != nil && s.bdot != nil {
				s.bdotGEMM(sc, bi, n0, n1, c[i], ldc)
			} else {
				bdotGeneric(c[i], ldc, sc.bf, bi, n0, n1)
			}
			continue
		}
		if !bi.dot8 { // a matrix of the exact mode beside one of these modes
			exactRows(c[i], ldc, rows, bi, n0, n1)
			continue
		}
		q := pre
		var recs []*byte
		switch {
		case q != nil && q.bf == nil && q.g == bi.q.cols:
			recs = q.ptrs(sc.recs[:0], idx, len(rows))
		case i == 1 && b[0].dot8 && b[0].q.cols == bi.q.cols && (pre == nil || pre.bf != nil || pre.g != bi.q.cols):
			q = &sc.q[0] // quantized for b[0]
			recs = q.ptrs(sc.recs[:0], nil, len(rows))
		default:
			q = &sc.q[i]
			q.quantize(rows, bi.Cols, bi.q.cols)
			recs = q.ptrs(sc.recs[:0], nil, len(rows))
		}
		sc.recs = recs
		if s := active; s != nil && s.hasDot8() {
			s.dot8GEMM(sc, recs, q.rec, bi, n0, n1, c[i], ldc)
			continue
		}
		dot8Generic(c[i], ldc, recs, q.rec, bi, n0, n1)
	}
}

// gateUpDot is GateUp on int8-dot or bf16-dot gate and up matrices; xq,
// when not nil, is every row of x quantized or rounded.
func gateUpDot(h, x []float32, xq *dot8Rows, idx []int32, gate, up Matrix, ep *glu, n0, n1 int) {
	K, inter := gate.Cols, gate.Rows
	sc := dotPool.Get().(*dotScratch)
	defer sc.put()
	rows := rowPtrs(sc.grow(len(idx)), x, idx, K)
	ldc := n1 - n0
	sc.c[0], sc.c[1] = buffers.Grow(&sc.c[0], len(idx)*ldc), buffers.Grow(&sc.c[1], len(idx)*ldc)
	dotGEMM(sc, rows, xq, idx, []Matrix{gate, up}, n0, n1, sc.c, ldc)
	for r := range rows {
		storeGLU(h[r*inter+n0:][:ldc], sc.c[0][r*ldc:], sc.c[1][r*ldc:], ep, r, n0)
	}
}

// downDot is Down and GEMMRows on an int8-dot or bf16-dot matrix; hq,
// when not nil, is every row of h quantized or rounded.
func downDot(out, h []float32, hq *dot8Rows, idx []int32, down Matrix, bias, scale []float32, n0, n1 int) {
	hidden, K := down.Rows, down.Cols
	M := len(h) / K
	if idx != nil {
		M = len(idx)
	}
	sc := dotPool.Get().(*dotScratch)
	defer sc.put()
	rows := rowPtrs(sc.grow(M), h, idx, K)
	ldc := n1 - n0
	sc.c[0] = buffers.Grow(&sc.c[0], M*ldc)
	dotGEMM(sc, rows, hq, idx, []Matrix{down}, n0, n1, sc.c, ldc)
	for r := 0; r < M; r++ {
		storeDown(out[r*hidden+n0:][:ldc], sc.c[0][r*ldc:], bias, scale, r, n0)
	}
}

func (sc *dotScratch) grow(m int) []*float32 {
	if cap(sc.rows) < m {
		sc.rows = make([]*float32, m)
	}
	sc.rows = sc.rows[:m]
	return sc.rows
}

// put returns the scratch to the pool without its row pointers.
func (sc *dotScratch) put() {
	clear(sc.rows)
	clear(sc.recs)
	clear(sc.bf)
	dotPool.Put(sc)
}
