package kernels

import (
	"fmt"
	"math"

	"github.com/moex-project/moex/internal/half"
)

// e4m3 is the value of every FP8 e4m3fn byte: 1 sign, 4 exponent (bias 7)
// and 3 mantissa bits, subnormals, no infinities; 0x7F and 0xFF are NaN.
var e4m3 = func() (t [256]float32) {
	for b := range t {
		e, m := b>>3&15, b&7
		var v float64
		switch {
		case e == 15 && m == 7:
			v = math.NaN()
		case e == 0:
			v = math.Ldexp(float64(m), -9) // m/8 · 2^-6
		default:
			v = math.Ldexp(float64(8+m), e-10) // (1 + m/8) · 2^(e-7)
		}
		if b&0x80 != 0 {
			v = -v
		}
		t[b] = float32(v)
	}
	return t
}()

// E4M3 returns the value of an FP8 e4m3fn byte (NaN for 0x7F and 0xFF).
func E4M3(b uint8) float32 { return e4m3[b] }

// blockScales are a quantized matrix's scales: one per block of rows×cols
// elements, row-major over the blocks (the 4-bit dtypes: blocks of one row
// and a group of columns).
type blockScales struct {
	rows, cols int
	gridCols   int       // blocks along a row
	grid       []float32 // [ceil(Rows/rows), gridCols]
	// panel, for a packed matrix, holds each panel's scales for each k
	// block, the 16 rows' scales side by side; FP8's multiplied by 2^120
	// (the kernels widen an e4m3 byte to its value times 2^-120): panel p's k
	// block b at (b·panels + p)·16, so that a kernel call's panels have
	// theirs side by side. Nil when a scale is too large for that (2^8 or
	// more): the matrix then runs on the generic kernels.
	panel  []float32
	panels int
	// off and offPanel are the integer-code dtypes' offsets, laid out as
	// grid and panel (nil for none; offPanel nil where panel is).
	off, offPanel []float32
	// super holds an integer-code matrix's scales and offsets as the
	// K-quants factor them (see WithSuperScales), nil for none; kmeta, an
	// int8-dot matrix's factors laid out for its kernels.
	super *superScales
	kmeta []byte
	// e8, for a packed MXFP4 matrix whose scales are all E8M0 powers of
	// two (as the files hold them), holds each block's exponent E in the
	// int8-dot panel layout (see dot8Scales), a byte where panel would
	// hold a float: the block's scale is 2^(E−127). With e8Exact (Pack,
	// the exact mode, whose kernels' fp32 scales are made for each call,
	// see kscales) scale returns that; without (PackInt8Dot), the int8-dot
	// kernels' scale against codes twice the e2m1 values, 2^(E−128).
	e8      []uint8
	e8Exact bool
	// h16 and offH16, for a packed matrix whose scales (and offsets) are
	// all fp16 values (GGUF's Q8_0, Q4_0, Q4_1, Q5_0, Q5_1), hold them as
	// fp16 where panel and offPanel would hold floats, in the int8-dot
	// layout (dot8Panel) in both modes (see Pack, PackInt8Dot and
	// kscales).
	h16, offH16 []uint16
	// pow2 says every scale of the matrix is a power of two 2^p with
	// p in [pmin, pmax] ⊆ [-126, 124] (MXFP4's E8M0 scales, bar the
	// extremes): the power-of-two 4-bit kernels may run it (see pow2Exact).
	pow2       bool
	pmin, pmax int
	// groups is an integer-code matrix's groups (rows times gridCols).
	// Its grid and off may be dropped once packed (see scale): nil, the
	// values come from panel and offPanel (dot8Panel: in the int8-dot
	// layout, see dot8Scales), h16 and offH16, e8, or super (kmeta).
	groups    int
	dot8Panel bool
}

// hasOffsets says whether an integer-code matrix has offsets.
func (q *blockScales) hasOffsets() bool {
	return q.off != nil || q.offPanel != nil || q.offH16 != nil || q.super != nil && q.super.offsets
}

// panelAt is the index in panel (and offPanel) of group g (row-major:
// row g/gridCols, group g%gridCols of the row).
func (q *blockScales) panelAt(g int) int {
	r, b := g/q.gridCols, g%q.gridCols
	pi := r / PanelWidth
	if q.dot8Panel {
		return ((pi/dot8Run*q.gridCols+b)*dot8Run+pi%dot8Run)*PanelWidth + r%PanelWidth
	}
	return (b*q.panels+pi)*PanelWidth + r%PanelWidth
}

// superAt is the super-block of group g.
func (q *blockScales) superAt(g int) int {
	per := q.super.per
	return g/q.gridCols*(q.gridCols/per) + g%q.gridCols/per
}

// scale is group g's scale of an integer-code matrix.
func (q *blockScales) scale(g int) float32 {
	switch {
	case q.grid != nil:
		return q.grid[g]
	case q.kmeta != nil:
		d, sc := q.kmetaAt(g, false)
		return d * float32(sc)
	case q.super != nil:
		return q.super.d[q.superAt(g)] * float32(q.super.sc[g])
	case q.e8 != nil && q.e8Exact:
		return e8Scale(q.e8[q.panelAt(g)])
	case q.e8 != nil:
		return e8Half(q.e8[q.panelAt(g)])
	case q.h16 != nil:
		return half.F16ToF32(q.h16[q.panelAt(g)])
	}
	return q.panel[q.panelAt(g)]
}

// offset is group g's offset of an integer-code matrix with offsets.
func (q *blockScales) offset(g int) float32 {
	switch {
	case q.off != nil:
		return q.off[g]
	case q.kmeta != nil:
		negMin, m := q.kmetaAt(g, true)
		return negMin * float32(m) // −dmin·m, exactly as −(dmin·m)
	case q.super != nil:
		return -(q.super.dmin[q.superAt(g)] * float32(q.super.m[g]))
	case q.offH16 != nil:
		return half.F16ToF32(q.offH16[q.panelAt(g)])
	}
	return q.offPanel[q.panelAt(g)]
}

// scales returns an integer-code matrix's scales [groups] (grid, or made
// from what holds them: a copy) and its offsets likewise (nil for none).
func (q *blockScales) scales() (s, o []float32) {
	s, o = q.grid, q.off
	if s == nil {
		s = make([]float32, q.groups)
		for g := range s {
			s[g] = q.scale(g)
		}
	}
	if o == nil && q.hasOffsets() {
		o = make([]float32, q.groups)
		for g := range o {
			o[g] = q.offset(g)
		}
	}
	return s, o
}

// dropGrid returns q without its grid and offsets, for a packed
// integer-code matrix whose panels or factors hold them.
func (q *blockScales) dropGrid() *blockScales {
	c := *q
	c.grid, c.off = nil, nil
	return &c
}

// at is the scale of element [i, j].
func (q *blockScales) at(i, j int) float32 {
	return q.grid[i/q.rows*q.gridCols+j/q.cols]
}

// NewFP8 wraps FP8 e4m3fn bytes [rows, cols] (row-major, as nn.Linear
// stores its weight [out, in]) and their block scales without copying: the
// weight at [i, j] is e4m3(data[i·cols+j]) × scales[i/blockRows][j/blockCols]
// rounded once to fp32 (the dequantized weight: the scale multiplies,
// despite the name weight_scale_inv the checkpoints give it). scales is
// [ceil(rows/blockRows), ceil(cols/blockCols)], edge blocks partial. It
// fails, naming the element, on a NaN byte (0x7F, 0xFF) and on a scale that
// is not finite or is negative.
func NewFP8(rows, cols int, data []uint8, scales []float32, blockRows, blockCols int) (Matrix, error) {
	if err := checkDims(rows, cols, len(data)); err != nil {
		return Matrix{}, err
	}
	if blockRows < 1 || blockCols < 1 {
		return Matrix{}, fmt.Errorf("kernels: fp8 block size [%d, %d] is not positive", blockRows, blockCols)
	}
	gr, gc := (rows+blockRows-1)/blockRows, (cols+blockCols-1)/blockCols
	if len(scales) != gr*gc {
		return Matrix{}, fmt.Errorf("kernels: fp8 matrix [%d, %d] in blocks of [%d, %d] needs [%d, %d] scales, have %d",
			rows, cols, blockRows, blockCols, gr, gc, len(scales))
	}
	for i, s := range scales {
		if math.IsNaN(float64(s)) || math.IsInf(float64(s), 0) || math.Signbit(float64(s)) {
			return Matrix{}, fmt.Errorf("kernels: fp8 scale [%d, %d] is %v: want a finite value of at least +0", i/gc, i%gc, s)
		}
	}
	data = data[:rows*cols]
	for i, b := range data {
		if b&0x7F == 0x7F {
			return Matrix{}, fmt.Errorf("kernels: fp8 weight [%d, %d] is the NaN byte %#02x", i/cols, i%cols, b)
		}
	}
	q := &blockScales{rows: blockRows, cols: blockCols, gridCols: gc, grid: scales}
	return Matrix{DType: F8E4M3, Rows: rows, Cols: cols, u8: data, q: q}, nil
}

// BlockSize is an FP8 matrix's scale block [rows, cols] ([0, 0] for other
// dtypes).
func (m Matrix) BlockSize() (rows, cols int) {
	if m.q == nil {
		return 0, 0
	}
	return m.q.rows, m.q.cols
}

// Bytes is the size of what the kernels read of m: its elements and, for
// the quantized dtypes, its scales.
func (m Matrix) Bytes() int64 {
	return int64(m.Rows)*int64(m.Cols)*int64(m.codeBits())/8 + int64(m.ScaleBytes())
}

// HeldBytes is the size of the memory m holds: its elements, scales,
// offsets and factors in every layout it keeps (Bytes counts what the
// kernels read of it).
func (m Matrix) HeldBytes() int64 {
	n := 4*int64(len(m.f32)) + 2*int64(len(m.u16)) + int64(len(m.u8))
	if q := m.q; q != nil {
		n += 4*int64(len(q.grid)+len(q.off)+len(q.panel)+len(q.offPanel)) + int64(len(q.kmeta)+len(q.e8)) + 2*int64(len(q.h16)+len(q.offH16))
		if sup := q.super; sup != nil {
			n += 4*int64(len(sup.d)+len(sup.dmin)) + int64(len(sup.sc)+len(sup.m))
		}
	}
	return n
}

// ScaleBytes is the size of the scales the kernels read for a quantized matrix
// (0 for other dtypes): the scale grid, or a packed matrix's panel scales.
func (m Matrix) ScaleBytes() int {
	switch {
	case m.q == nil:
		return 0
	case m.q.kmeta != nil: // the int8-dot kernels' factored scales
		return len(m.q.kmeta)
	case m.q.e8 != nil: // an MXFP4 matrix's exponents (either mode)
		return len(m.q.e8)
	case m.q.h16 != nil: // fp16 scales (either mode)
		return 2 * (len(m.q.h16) + len(m.q.offH16))
	case m.q.panel != nil:
		return 4 * (len(m.q.panel) + len(m.q.offPanel))
	}
	return 4 * (len(m.q.grid) + len(m.q.off))
}

// FP8Data returns an FP8 matrix's bytes row-major ([Rows, Cols], unpacked
// when m is packed: then a copy) and its block scales ([ceil(Rows/br),
// ceil(Cols/bc)], shared), and false for other dtypes.
func (m Matrix) FP8Data() (data []uint8, scales []float32, blockRows, blockCols int, ok bool) {
	if m.DType != F8E4M3 {
		return nil, nil, 0, 0, false
	}
	data = m.u8
	if m.packed {
		data = make([]uint8, m.Rows*m.Cols)
		for i := 0; i < m.Rows; i++ {
			for j := 0; j < m.Cols; j++ {
				data[i*m.Cols+j] = m.u8[m.packedIndex(i, j)]
			}
		}
	}
	return data, m.q.grid, m.q.rows, m.q.cols, true
}

// fp8RowF32 widens row i of a row-major FP8 matrix into dst[:Cols].
func (m Matrix) fp8RowF32(i int, dst []float32) {
	src := m.u8[i*m.Cols:][:m.Cols]
	q := m.q
	scales := q.grid[i/q.rows*q.gridCols:][:q.gridCols]
	for b, s := range scales {
		lo := b * q.cols
		hi := min(lo+q.cols, m.Cols)
		for j := lo; j < hi; j++ {
			dst[j] = e4m3[src[j]] * s
		}
	}
}

// packScales builds a packed matrix's panel scales (see blockScales), each
// times factor (FP8: 2^120; the 4-bit dtypes: 1).
func (q *blockScales) packScales(rows, panels int, factor float64) *blockScales {
	p := *q
	p.panels = panels
	p.panel = make([]float32, panels*q.gridCols*PanelWidth)
	for pi := 0; pi < panels; pi++ {
		for r := pi * PanelWidth; r < min(rows, (pi+1)*PanelWidth); r++ {
			for b := 0; b < q.gridCols; b++ {
				s := float64(q.grid[r/q.rows*q.gridCols+b]) * factor
				if s > math.MaxFloat32 {
					p.panel = nil
					return &p
				}
				p.panel[(b*panels+pi)*PanelWidth+r%PanelWidth] = float32(s)
			}
		}
	}
	if q.off != nil {
		p.offPanel = make([]float32, len(p.panel))
		for pi := 0; pi < panels; pi++ {
			for r := pi * PanelWidth; r < min(rows, (pi+1)*PanelWidth); r++ {
				for b := 0; b < q.gridCols; b++ {
					p.offPanel[(b*panels+pi)*PanelWidth+r%PanelWidth] = q.off[r*q.gridCols+b]
				}
			}
		}
	}
	p.pow2, p.pmin, p.pmax = powerOfTwoRange(q.grid)
	return &p
}

// powerOfTwoRange reports whether every scale is a power of two 2^p with
// 2^p and 2^-p normal fp32s and 8·2^p finite (a 4-bit weight at most 8
// times its scale: the power-of-two kernels never meet the infinite weight
// that t·s can round to), and the range of the exponents.
func powerOfTwoRange(scales []float32) (ok bool, pmin, pmax int) {
	pmin, pmax = math.MaxInt, math.MinInt
	for _, s := range scales {
		frac, e := math.Frexp(float64(s))
		p := e - 1
		if frac != 0.5 || p < -126 || p > 124 {
			return false, 0, 0
		}
		pmin, pmax = min(pmin, p), max(pmax, p)
	}
	return len(scales) > 0, pmin, pmax
}

// EncodeE4M3 rounds v to the nearest FP8 e4m3fn value, ties to the even
// code, saturating at ±448 (the largest); NaN gives the NaN byte 0x7F.
func EncodeE4M3(v float32) uint8 {
	if v != v {
		return 0x7F
	}
	var sign uint8
	if math.Signbit(float64(v)) {
		sign, v = 0x80, -v
	}
	switch {
	case v >= 448:
		return sign | 0x7E
	case v < 0x1p-6: // subnormals: multiples of 2^-9 (8 of them is the smallest normal, 0x08)
		return sign | uint8(math.RoundToEven(float64(v)*512))
	}
	// Round the fp32 mantissa to 3 bits, ties to even; a carry moves into
	// the exponent as it should.
	b := math.Float32bits(v)
	b += 0x7FFFF + (b >> 20 & 1)
	return sign | uint8(int(b>>23)-127+7)<<3 | uint8(b>>20&7)
}

// QuantizeFP8 quantizes the fp32 matrix v [rows, cols] as fine-grained FP8
// checkpoints do: per block of [blockRows, blockCols], scale = max|v|/448
// and each byte the nearest e4m3 value of v/scale (a block of zeros gets
// scale 0 and zero bytes).
func QuantizeFP8(v []float32, rows, cols, blockRows, blockCols int) (data []uint8, scales []float32) {
	gr, gc := (rows+blockRows-1)/blockRows, (cols+blockCols-1)/blockCols
	data, scales = make([]uint8, rows*cols), make([]float32, gr*gc)
	for bi := 0; bi < gr; bi++ {
		for bj := 0; bj < gc; bj++ {
			r0, r1 := bi*blockRows, min((bi+1)*blockRows, rows)
			c0, c1 := bj*blockCols, min((bj+1)*blockCols, cols)
			var amax float32
			for r := r0; r < r1; r++ {
				for _, x := range v[r*cols+c0 : r*cols+c1] {
					amax = max(amax, float32(math.Abs(float64(x))))
				}
			}
			s := amax / 448
			scales[bi*gc+bj] = s
			if s == 0 {
				continue
			}
			for r := r0; r < r1; r++ {
				for c := c0; c < c1; c++ {
					data[r*cols+c] = EncodeE4M3(v[r*cols+c] / s)
				}
			}
		}
	}
	return data, scales
}

// e8Half is 2^(E−128), an int8-dot MXFP4 block's scale (see blockScales.e8).
func e8Half(e uint8) float32 {
	return float32(math.Ldexp(1, int(e)-128))
}

// e8Scale is 2^(E−127), the scale of an MXFP4 block of E8M0 exponent E
// (E < 255; 255 is the format's NaN).
func e8Scale(e uint8) float32 {
	return float32(math.Ldexp(1, int(e)-127))
}

// toE8 returns the E8M0 exponents of the scales of q, laid out as
// dot8Scales lays them (q.panel) for a matrix of rows rows: the scale
// 2^(E−127) of each block, E in [0, 254], a byte where panel holds a
// float (those of rows past the matrix 0). It fails, naming the scale,
// where one is not such a power of two.
func toE8(q *blockScales, rows int) ([]uint8, error) {
	e8 := make([]uint8, len(q.panel))
	for g := range rows * q.gridCols {
		at := q.panelAt(g)
		s := q.panel[at]
		frac, exp := math.Frexp(float64(s))
		if frac != 0.5 || exp+126 < 0 || exp+126 > 254 {
			return nil, fmt.Errorf("mxfp4 scale %g is not an E8M0 power of two", s)
		}
		e8[at] = uint8(exp + 126) // s = 2^(exp−1) = 2^(E−127)
	}
	return e8, nil
}
