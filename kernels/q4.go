package kernels

import (
	"fmt"
	"math"

	"github.com/moex-project/moex/internal/half"
)

// e2m1 are the values of OCP FP4 (e2m1) nibbles: 1 sign, 2 exponent, 1
// mantissa bit.
var e2m1 = [16]float32{0, 0.5, 1, 1.5, 2, 3, 4, 6, -0, -0.5, -1, -1.5, -2, -3, -4, -6}

// int4 are the values of compressed-tensors' offset-coded int4 nibbles:
// the field minus 8.
var int4 = func() (t [16]float32) {
	for i := range t {
		t[i] = float32(i - 8)
	}
	return t
}()

// Layout of the 4-bit dtypes, row-major: element j of row i is nibble
// i·cols + j, two a byte, the even one in the low nibble (gpt-oss's
// _blocks, and compressed-tensors' int32 words read as little-endian
// bytes). A weight is its nibble's value times the scale of its group of
// columns, rounded once to fp32.

// NewMXFP4 wraps MXFP4 weights [rows, cols] without copying the nibbles:
// blocks holds rows·cols/2 bytes (gpt-oss's ..._blocks [rows, cols/32, 16]
// flattened), scales rows·cols/32 E8M0 bytes (..._scales): element [i, j]
// is e2m1(nibble) × 2^(scales[i·cols/32 + j/32] − 127), exact in fp32. cols
// must be a multiple of 32; the E8M0 NaN (0xFF) is an error.
func NewMXFP4(rows, cols int, blocks, scales []uint8) (Matrix, error) {
	if cols%32 != 0 {
		return Matrix{}, fmt.Errorf("kernels: mxfp4 matrix [%d, %d]: columns must be a multiple of 32", rows, cols)
	}
	if err := checkNibbles(rows, cols, len(blocks)); err != nil {
		return Matrix{}, err
	}
	g := cols / 32
	if len(scales) != rows*g {
		return Matrix{}, fmt.Errorf("kernels: mxfp4 matrix [%d, %d] needs [%d, %d] scales, have %d", rows, cols, rows, g, len(scales))
	}
	f := make([]float32, len(scales))
	for i, e := range scales {
		if e == 0xFF {
			return Matrix{}, fmt.Errorf("kernels: mxfp4 scale [%d, %d] is the E8M0 NaN 0xff", i/g, i%g)
		}
		f[i] = float32(math.Ldexp(1, int(e)-127))
	}
	q := &blockScales{rows: 1, cols: 32, gridCols: g, grid: f, groups: len(f)}
	return Matrix{DType: MXFP4, Rows: rows, Cols: cols, u8: blocks[:rows*cols/2], q: q, lut: &e2m1}, nil
}

// NewINT4 wraps symmetric int4 weights [rows, cols] without copying the
// nibbles: packed holds rows·cols/2 bytes (compressed-tensors'
// weight_packed [rows, cols/8] int32 words, little-endian), each field
// the value plus 8; scales is [rows, cols/group] (weight_scale): element
// [i, j] is (field − 8) × scales[i·cols/group + j/group], rounded once to
// fp32. group must divide cols and be even; a scale that is not finite is
// an error (negative ones are allowed: ggml's Q4_0 blocks, the same
// encoding with a group of 32, carry signed scales).
func NewINT4(rows, cols, group int, packed []uint8, scales []float32) (Matrix, error) {
	if group < 2 || group%2 != 0 || cols%group != 0 {
		return Matrix{}, fmt.Errorf("kernels: int4 matrix [%d, %d]: group size %d must be even and divide the columns", rows, cols, group)
	}
	if err := checkNibbles(rows, cols, len(packed)); err != nil {
		return Matrix{}, err
	}
	g := cols / group
	if len(scales) != rows*g {
		return Matrix{}, fmt.Errorf("kernels: int4 matrix [%d, %d] in groups of %d needs [%d, %d] scales, have %d", rows, cols, group, rows, g, len(scales))
	}
	for i, s := range scales {
		if math.IsNaN(float64(s)) || math.IsInf(float64(s), 0) {
			return Matrix{}, fmt.Errorf("kernels: int4 scale [%d, %d] is %v: want a finite value", i/g, i%g, s)
		}
	}
	q := &blockScales{rows: 1, cols: group, gridCols: g, grid: scales[:rows*g], groups: rows * g}
	return Matrix{DType: INT4, Rows: rows, Cols: cols, u8: packed[:rows*cols/2], q: q, lut: &int4}, nil
}

func checkNibbles(rows, cols, n int) error {
	if rows < 0 || cols < 0 || cols%2 != 0 {
		return fmt.Errorf("kernels: 4-bit matrix [%d, %d]: the shape must be non-negative with an even column count", rows, cols)
	}
	if cols != 0 && rows > 2*n/cols || rows*cols != 2*n {
		return fmt.Errorf("kernels: 4-bit matrix [%d, %d] needs %d bytes, have %d", rows, cols, rows*cols/2, n)
	}
	return nil
}

// GroupSize is a 4-bit matrix's scale group along a row (MXFP4: 32), or an
// FP8 matrix's block columns; 0 for other dtypes.
func (m Matrix) GroupSize() int {
	if m.q == nil {
		return 0
	}
	return m.q.cols
}

// Q4Data returns a 4-bit matrix's nibbles row-major ([Rows, Cols/2]
// bytes, the even column low; unpacked when m is packed: then a copy), its
// scales ([Rows, Cols/group]: shared, or when packed a copy made from its
// panels) and group, and false for other dtypes.
func (m Matrix) Q4Data() (data []uint8, scales []float32, group int, ok bool) {
	if m.DType != MXFP4 && m.DType != INT4 {
		return nil, nil, 0, false
	}
	data = m.u8
	if m.packed {
		data = make([]uint8, m.Rows*m.Cols/2)
		for i := 0; i < m.Rows; i++ {
			for j := 0; j < m.Cols; j++ {
				data[(i*m.Cols+j)/2] |= m.nibble(i, j) << (4 * (j & 1))
			}
		}
	}
	scales, _ = m.formatScales()
	return data, scales, m.q.cols, true
}

// q4RowF32 widens row i of a row-major 4-bit matrix into dst[:Cols].
func (m Matrix) q4RowF32(i int, dst []float32) {
	src := m.u8[i*m.Cols/2:][:m.Cols/2]
	q := m.q
	scales := q.grid[i*q.gridCols:][:q.gridCols]
	if q.off != nil {
		for j := range dst {
			dst[j] = q.weight(m.lut[src[j/2]>>(4*(j&1))&15], i, j)
		}
		return
	}
	for j := range dst {
		b := src[j/2] >> (4 * (j & 1)) & 15
		dst[j] = m.lut[b] * scales[j/q.cols]
	}
}

// packNibbles writes the row-major 4-bit matrix src [rows, k] into dst in
// panels (see packedIndex); padding rows hold the nibble of value zero.
func packNibbles(dst, src []uint8, rows, k int, lut *[16]float32) {
	var zero uint8
	for zero = 0; lut[zero] != 0; zero++ {
	}
	for p0 := 0; p0 < rows; p0 += PanelWidth {
		panel := dst[p0*k/2:][:PanelWidth*k/2]
		for l := 0; l < PanelWidth; l++ {
			r := p0 + l
			for j := 0; j < k; j += 2 {
				lo, hi := zero, zero
				if r < rows {
					b := src[(r*k+j)/2]
					lo, hi = b&15, b>>4
				}
				panel[j/2*PanelWidth+l] = lo | hi<<4
			}
		}
	}
}

// Quantize returns the fp32 matrix v [rows, cols] in dtype dt as the
// checkpoints of each format are made: F8E4M3 in 128×128 blocks (see
// QuantizeFP8); MXFP4 per 32 along a row, the scale the power of two that
// brings the block's largest magnitude within e2m1's 6, each value the
// nearest e2m1; INT4 in groups of 32 along a row, symmetric, scale
// max|v|/7 and each field round(v/scale) + 8; INT8 as ggml's Q8_0, in
// groups of 32, scale max|v|/127 and each code round(v/scale); both keep
// their scales rounded to fp16, as GGUF's Q4_0 and Q8_0 store them (the
// codes made with the unrounded scale, as ggml makes them), where that is
// a normal fp16 value (else the fp32 scale); UINT4 as
// ggml's Q4_K (see quantizeQ4K): groups of 32 with a scale and an offset,
// both factored over super-blocks of 8 groups. cols must
// be a multiple of 32 for the 4- and 8-bit dtypes. Other dtypes are an
// error.
func Quantize(dt DType, v []float32, rows, cols int) (Matrix, error) {
	if len(v) != rows*cols {
		return Matrix{}, fmt.Errorf("kernels: quantize: %d values for a matrix [%d, %d]", len(v), rows, cols)
	}
	switch dt {
	case F8E4M3:
		data, scales := QuantizeFP8(v, rows, cols, 128, 128)
		return NewFP8(rows, cols, data, scales, 128, 128)
	case MXFP4, INT4, UINT4, INT8:
	default:
		return Matrix{}, fmt.Errorf("kernels: quantize to %v", dt)
	}
	if cols%32 != 0 {
		return Matrix{}, fmt.Errorf("kernels: quantize: %v needs columns in multiples of 32, have %d", dt, cols)
	}
	if dt == UINT4 || dt == INT8 {
		return quantizeCodes(dt, v, rows, cols), nil
	}
	g := cols / 32
	packed := make([]uint8, rows*cols/2)
	e8 := make([]uint8, rows*g)
	f := make([]float32, rows*g)
	for i := 0; i < rows*g; i++ {
		block := v[i*32:][:32]
		var amax float64
		for _, x := range block {
			amax = math.Max(amax, math.Abs(float64(x)))
		}
		var inv float64 // 1/scale
		if dt == MXFP4 {
			e := 0
			if amax > 0 {
				e = int(math.Ceil(math.Log2(amax / 6)))
			}
			e = max(-127, min(127, e))
			e8[i] = uint8(e + 127)
			inv = math.Ldexp(1, -e)
		} else if amax > 0 {
			s := float32(amax / 7)
			f[i], inv = halfScale(s), 1/float64(s)
		}
		for j, x := range block {
			var n uint8
			if dt == MXFP4 {
				n = nearestE2M1(float64(x) * inv)
			} else {
				n = uint8(max(-7, min(7, math.RoundToEven(float64(x)*inv))) + 8)
			}
			packed[(i*32+j)/2] |= n << (4 * (j & 1))
		}
	}
	if dt == MXFP4 {
		return NewMXFP4(rows, cols, packed, e8)
	}
	return NewINT4(rows, cols, 32, packed, f)
}

// halfScale is the scale s rounded to fp16 where that is a normal fp16
// value (as GGUF files store their blocks' scales), else s itself: one too
// large would be infinite, one too small zero or with fewer bits.
func halfScale(s float32) float32 {
	h := half.F32ToF16(s)
	if e := h >> 10 & 0x1f; e == 0 || e == 0x1f {
		return s
	}
	return half.F16ToF32(h)
}

// nearestE2M1 is the e2m1 nibble nearest x (saturating at ±6), the one of
// even mantissa on a tie.
func nearestE2M1(x float64) uint8 {
	best, bestD := uint8(0), math.Inf(1)
	for n := uint8(0); n < 16; n++ {
		d := math.Abs(float64(e2m1[n]) - x)
		if d < bestD || d == bestD && n&1 == 0 && best&1 == 1 {
			best, bestD = n, d
		}
	}
	return best
}

// quantizeCodes is Quantize for UINT4 (as Q4_K) and INT8 (as Q8_0).
func quantizeCodes(dt DType, v []float32, rows, cols int) Matrix {
	g := rows * cols / 32
	if dt == UINT4 {
		return quantizeQ4K(v, rows, cols)
	}
	scales := make([]float32, g)
	codes := make([]int8, rows*cols)
	for i := range g {
		block := v[i*32:][:32]
		var amax float64
		for _, x := range block {
			amax = math.Max(amax, math.Abs(float64(x)))
		}
		d := float32(amax / 127)
		scales[i] = halfScale(d)
		if d == 0 {
			continue
		}
		for j, x := range block {
			codes[i*32+j] = int8(max(-127, min(127, math.RoundToEven(float64(x)/float64(d)))))
		}
	}
	m, err := NewINT8(rows, cols, 32, codes, scales, nil)
	if err != nil {
		panic(err) // finite scales of finite values
	}
	return m
}

// quantizeQ4K quantizes v [rows, cols] as ggml's Q4_K lays values out
// (its simple rounding, not its search for the best scales): groups of 32
// with a scale and a min ≤ 0, the groups of a super-block of 8 (fewer
// where the columns are not whole super-blocks) sharing f16 factors d and
// dmin with 6-bit sc and m each; a group's scale is d·sc, its offset
// −dmin·m, each code round((v − offset)/scale) in 0…15.
func quantizeQ4K(v []float32, rows, cols int) Matrix {
	gc := cols / 32
	per := 1
	for _, p := range []int{8, 4, 2} {
		if gc%p == 0 {
			per = p
			break
		}
	}
	n := rows * gc
	scales, offs := make([]float32, n), make([]float32, n)
	d, dmin := make([]float32, n/per), make([]float32, n/per)
	sc, mins := make([]int8, n), make([]int8, n)
	nibbles := make([]uint8, rows*cols/2)
	f16 := func(x float64) float32 { return half.F16ToF32(half.F32ToF16(float32(x))) }
	for sb := range n / per {
		gs, ms := make([]float64, per), make([]float64, per)
		var smax, mmax float64
		for k := range per {
			block := v[(sb*per+k)*32:][:32]
			lo, hi := 0.0, math.Inf(-1)
			for _, x := range block {
				lo, hi = math.Min(lo, float64(x)), math.Max(hi, float64(x))
			}
			gs[k], ms[k] = (hi-lo)/15, -lo
			smax, mmax = math.Max(smax, gs[k]), math.Max(mmax, ms[k])
		}
		d[sb], dmin[sb] = f16(smax/63), f16(mmax/63)
		for k := range per {
			i := sb*per + k
			if d[sb] > 0 {
				sc[i] = int8(min(63, math.Ceil(gs[k]/float64(d[sb])))) // the group's range fits
			}
			if dmin[sb] > 0 {
				mins[i] = int8(min(63, math.Ceil(ms[k]/float64(dmin[sb]))))
			}
			scales[i], offs[i] = d[sb]*float32(sc[i]), -(dmin[sb] * float32(mins[i]))
			if scales[i] == 0 {
				continue
			}
			for j, x := range v[i*32:][:32] {
				q := uint8(max(0, min(15, math.RoundToEven((float64(x)-float64(offs[i]))/float64(scales[i])))))
				nibbles[(i*32+j)/2] |= q << (4 * (j & 1))
			}
		}
	}
	m, err := NewUINT4(rows, cols, 32, nibbles, scales, offs)
	if err == nil {
		m, err = WithSuperScales(m, per, d, dmin, sc, mins)
	}
	if err != nil {
		panic(err) // finite factors of finite values, and their products
	}
	return m
}
