package kernels

import (
	"fmt"
	"math"
	"unsafe"
)

// The integer-code dtypes hold each weight as a small integer with a scale
// and, optionally, an offset per group of columns along a row: element
// [i, j] is code·scale + offset rounded once to fp32 (a fused multiply-add;
// without offsets, code·scale rounded once). ggml's blocks map onto them
// exactly: Q8_0 is code·d; Q4_1 and Q5_1 code·d + m; Q4_K and Q5_K
// code·(d·sc) − dmin·m; Q6_K (code−32)·(d·sc), every product but Q6_K's
// exact in fp32, so the one rounding is ggml's own.

// uint4 are the values of unsigned 4-bit codes.
var uint4 = func() (t [16]float32) {
	for i := range t {
		t[i] = float32(i)
	}
	return t
}()

// NewUINT4 wraps unsigned 4-bit codes [rows, cols] without copying the
// nibbles: packed holds rows·cols/2 bytes laid out as NewINT4's, scales
// and offsets are [rows, cols/group] (offsets nil for none): element
// [i, j] is nibble × scale + offset, rounded once to fp32. group must be
// even and divide cols; a scale or offset that is not finite is an error.
func NewUINT4(rows, cols, group int, packed []uint8, scales, offsets []float32) (Matrix, error) {
	if group < 2 || group%2 != 0 || cols%group != 0 {
		return Matrix{}, fmt.Errorf("kernels: uint4 matrix [%d, %d]: group size %d must be even and divide the columns", rows, cols, group)
	}
	if err := checkNibbles(rows, cols, len(packed)); err != nil {
		return Matrix{}, err
	}
	q, err := groupScales("uint4", rows, cols, group, scales, offsets)
	if err != nil {
		return Matrix{}, err
	}
	return Matrix{DType: UINT4, Rows: rows, Cols: cols, u8: packed[:rows*cols/2], q: q, lut: &uint4}, nil
}

// NewINT8 wraps signed 8-bit codes [rows, cols] (row-major) without
// copying: scales and offsets are [rows, cols/group] (offsets nil for
// none), element [i, j] codes[i·cols+j] × scale + offset rounded once to
// fp32. group must divide cols; a scale or offset that is not finite is an
// error.
func NewINT8(rows, cols, group int, codes []int8, scales, offsets []float32) (Matrix, error) {
	if group < 1 || cols%group != 0 {
		return Matrix{}, fmt.Errorf("kernels: int8 matrix [%d, %d]: group size %d must divide the columns", rows, cols, group)
	}
	if err := checkDims(rows, cols, len(codes)); err != nil {
		return Matrix{}, err
	}
	q, err := groupScales("int8", rows, cols, group, scales, offsets)
	if err != nil {
		return Matrix{}, err
	}
	u8 := unsafe.Slice((*uint8)(unsafe.Pointer(unsafe.SliceData(codes))), len(codes))
	return Matrix{DType: INT8, Rows: rows, Cols: cols, u8: u8[:rows*cols], q: q}, nil
}

// groupScales checks and wraps the per-group scales and offsets of an
// integer-code matrix.
func groupScales(kind string, rows, cols, group int, scales, offsets []float32) (*blockScales, error) {
	g := cols / group
	if len(scales) != rows*g || offsets != nil && len(offsets) != rows*g {
		return nil, fmt.Errorf("kernels: %s matrix [%d, %d] in groups of %d needs [%d, %d] scales and offsets, have %d and %d",
			kind, rows, cols, group, rows, g, len(scales), len(offsets))
	}
	for _, v := range []struct {
		what string
		x    []float32
	}{{"scale", scales}, {"offset", offsets}} {
		for i, s := range v.x {
			if math.IsNaN(float64(s)) || math.IsInf(float64(s), 0) {
				return nil, fmt.Errorf("kernels: %s %s [%d, %d] is %v: want a finite value", kind, v.what, i/g, i%g, s)
			}
		}
	}
	return &blockScales{rows: 1, cols: group, gridCols: g, grid: scales[:rows*g], off: offsets, groups: rows * g}, nil
}

// superScales are an integer-code matrix's scales and offsets as GGUF's
// K-quants store them: each run of per groups along a row (a super-block)
// has a scale d and a min dmin, each group int8 factors sc and m; the
// group's scale is d·sc and its offset −(dmin·m), both exact in fp32.
type superScales struct {
	per     int
	offsets bool      // dmin and m given (an int8-dot matrix's are in its kmeta only)
	d, dmin []float32 // [rows, groups/per]; dmin nil without offsets
	sc, m   []int8    // [rows, groups]; m nil without offsets
}

// WithSuperScales returns m, a UINT4 or INT8 matrix, with its scales (and
// offsets) also held as the K-quants factor them: d and dmin per run of
// per groups along a row ([rows, groups/per]), sc and mins per group
// ([rows, groups]); dmin and mins nil when m has no offsets. Every scale
// must be d·sc and every offset −(dmin·mins), exactly: the factors only
// let the int8-dot kernels read fewer bytes (0.75 bits a weight rather
// than 2 at Q4_K's groups of 32), never change a value. Not copied.
func WithSuperScales(m Matrix, per int, d, dmin []float32, sc, mins []int8) (Matrix, error) {
	if m.DType != UINT4 && m.DType != INT8 || m.packed {
		return Matrix{}, fmt.Errorf("kernels: super-block scales for a %v matrix (packed %v): want a row-major UINT4 or INT8 one", m.DType, m.packed)
	}
	q := m.q
	groups := len(q.grid)
	if per < 1 || q.gridCols%per != 0 || len(d) != groups/per || len(sc) != groups ||
		(q.off != nil) != (dmin != nil) || (q.off != nil) != (mins != nil) || dmin != nil && (len(dmin) != len(d) || len(mins) != groups) {
		return Matrix{}, fmt.Errorf("kernels: super-block scales: %d groups a row in runs of %d, %d scales, %d mins, %d factors, %d min factors, offsets %v",
			q.gridCols, per, len(d), len(dmin), len(sc), len(mins), q.off != nil)
	}
	for i := range groups {
		s := i / q.gridCols * (q.gridCols / per)
		sb := s + i%q.gridCols/per
		if v := d[sb] * float32(sc[i]); v != q.grid[i] {
			return Matrix{}, fmt.Errorf("kernels: super-block scales: group %d's scale %v is not %v·%d", i, q.grid[i], d[sb], sc[i])
		}
		if q.off != nil {
			if v := -(dmin[sb] * float32(mins[i])); v != q.off[i] {
				return Matrix{}, fmt.Errorf("kernels: super-block scales: group %d's offset %v is not −%v·%d", i, q.off[i], dmin[sb], mins[i])
			}
		}
	}
	c := *q
	c.super = &superScales{per: per, d: d, dmin: dmin, sc: sc, m: mins, offsets: dmin != nil}
	m.q = &c
	return m, nil
}

// SuperScales returns the K-quant factors of a matrix made by
// WithSuperScales (or packed from one), copies: per, each super-block's d
// and −dmin ([Rows, groups/per]) and each group's sc and m ([Rows,
// groups]), the offsets' nd and mins nil without offsets; false when m
// holds no factors. Its scales are d·sc and its offsets nd·m.
func (m Matrix) SuperScales() (per int, d, nd []float32, sc, mins []int8, ok bool) {
	q := m.q
	if q == nil || q.super == nil {
		return 0, nil, nil, nil, nil, false
	}
	sup := q.super
	per = sup.per
	groups := m.Rows * q.gridCols
	d, sc = make([]float32, groups/per), make([]int8, groups)
	if sup.offsets {
		nd, mins = make([]float32, groups/per), make([]int8, groups)
	}
	switch {
	case sup.d != nil:
		copy(d, sup.d)
		copy(sc, sup.sc)
		for i, v := range sup.dmin {
			nd[i] = -v
		}
		copy(mins, sup.m)
	case q.kmeta != nil:
		for g := range groups {
			d[g/per], sc[g] = q.kmetaAt(g, false)
			if sup.offsets {
				nd[g/per], mins[g] = q.kmetaAt(g, true)
			}
		}
	default:
		return 0, nil, nil, nil, nil, false
	}
	return per, d, nd, sc, mins, true
}

// Offsets returns an integer-code matrix's offsets ([Rows, Cols/group]:
// shared, or a copy made from a packed matrix's), nil when it has none or
// is of another dtype.
func (m Matrix) Offsets() []float32 {
	if m.DType != UINT4 && m.DType != INT8 || m.q == nil {
		return nil
	}
	_, o := m.q.scales()
	return o
}

// HasOffsets says whether m is an integer-code matrix with offsets.
func (m Matrix) HasOffsets() bool {
	return (m.DType == UINT4 || m.DType == INT8) && m.q != nil && m.q.hasOffsets()
}

// weight is code c of element [i, j] scaled (and offset) as its group's.
func (q *blockScales) weight(c float32, i, j int) float32 {
	g := i/q.rows*q.gridCols + j/q.cols
	if !q.hasOffsets() {
		return c * q.scale(g)
	}
	return fmaF32(c, q.scale(g), q.offset(g))
}

// int8RowF32 widens row i of a row-major INT8 matrix into dst[:Cols].
func (m Matrix) int8RowF32(i int, dst []float32) {
	src := m.u8[i*m.Cols:][:m.Cols]
	for j := range dst {
		dst[j] = m.q.weight(float32(int8(src[j])), i, j)
	}
}

// fmaF32 is a·b + c rounded once to fp32, as an fp32 fused multiply-add
// computes it. a·b is exact in float64; the float64 sum, rounded to odd
// rather than to nearest, keeps what rounding it to fp32 needs (Boldo and
// Melquiond: rounding to odd at 53 bits, then to nearest at 24, is the
// correct rounding at 24).
func fmaF32(a, b, c float32) float32 {
	p := float64(a) * float64(b)
	s := p + float64(c)
	if math.IsInf(s, 0) || math.IsNaN(s) {
		return float32(s)
	}
	// The sum's rounding error (TwoSum); inexact with an even last bit,
	// the odd neighbour on the exact value's side is the one to keep.
	bv := s - p
	e := (p - (s - bv)) + (float64(c) - bv)
	if e != 0 && math.Float64bits(s)&1 == 0 {
		s = math.Nextafter(s, math.Copysign(math.Inf(1), e))
	}
	return float32(s)
}

// CodeData returns an integer-code matrix's codes row-major (4-bit: [Rows,
// Cols/2] bytes, the even column low; INT8: [Rows, Cols] bytes, each an
// int8), shared when m is row-major and a copy when it is packed, with its
// scales and offsets ([Rows, Cols/group], shared, or copies made from a
// packed matrix's; offsets nil for none) and group; false for the other
// dtypes.
func (m Matrix) CodeData() (data []uint8, scales, offsets []float32, group int, ok bool) {
	switch m.DType {
	case MXFP4, INT4, UINT4, INT8:
	default:
		return nil, nil, nil, 0, false
	}
	data = m.u8
	if m.packed {
		data = make([]uint8, m.Rows*m.Cols*m.DType.Bits()/8)
		for i := 0; i < m.Rows; i++ {
			for j := 0; j < m.Cols; j++ {
				switch {
				case m.DType == INT8:
					data[i*m.Cols+j] = uint8(int8(m.code(i, j)))
				default:
					data[(i*m.Cols+j)/2] |= m.nibble(i, j) << (4 * (j & 1))
				}
			}
		}
	}
	scales, offsets = m.formatScales()
	return data, scales, offsets, m.q.cols, true
}

// CodeScales returns CodeData's scales and offsets alone (copies where m
// is packed), without the codes; nil for the other dtypes.
func (m Matrix) CodeScales() (scales, offsets []float32) {
	switch m.DType {
	case MXFP4, INT4, UINT4, INT8:
		return m.formatScales()
	}
	return nil, nil
}

// nibble is the nibble of element [i, j] of a 4-bit matrix, in any
// layout.
func (m Matrix) nibble(i, j int) uint8 {
	if m.dot8 {
		at, shift := m.dot8Index(i, j)
		return m.u8[at] >> shift & 15
	}
	k := i*m.Cols + j
	if m.packed {
		k = m.packedIndex(i, j)
	}
	return m.u8[k/2] >> (4 * (k & 1)) & 15
}

// formatScales returns an integer-code or 4-bit matrix's scales and
// offsets as its format defines them (see blockScales.scales): an
// int8-dot MXFP4 matrix holds half its blocks' scales (see PackInt8Dot).
func (m Matrix) formatScales() (scales, offsets []float32) {
	scales, offsets = m.q.scales()
	if m.dot8 && m.DType == MXFP4 { // a copy: the int8-dot matrices hold no grid
		for i := range scales {
			scales[i] *= 2
		}
	}
	return scales, offsets
}
