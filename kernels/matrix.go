// Package kernels holds the compute kernels of moex behind one Go API: the
// grouped expert FFN (gate/up with a fused activation, down with a fused
// routing weight), grouped GEMMs for the projections and the router, the
// gating and dispatch layout, the int8-dot and bf16-dot numerics modes,
// and the decoders' RMSNorm and RoPE. Every kernel has a plain-Go generic
// implementation, the reference for all others; the avo-generated AVX2 and
// AVX-512 paths (chosen by cpuid) and the CUDA sources (kernels/cuda, run
// on a CPU emulation by kernels/cudaemu) plug in beneath the same functions.
//
// Weights stay in the format they were stored in (fp32, bf16, fp16, FP8
// e4m3 with block scales, MXFP4, INT4, and the integer codes of GGUF's
// block types) and are widened to fp32 inside the kernels, each to its
// dequantized value; accumulation is fp32 (float64 for the router) in a
// fixed order, so a token's result never depends on the other rows of its
// batch.
package kernels

import (
	"fmt"
	"slices"
	"unsafe"

	"github.com/moex-project/moex/internal/half"
)

// DType is the element type of a weight matrix.
type DType uint8

// Weight dtypes.
const (
	F32 DType = iota + 1
	BF16
	F16
	// F8E4M3 is FP8 e4m3fn with block scales (see NewFP8).
	F8E4M3
	// MXFP4 is OCP MXFP4: e2m1 nibbles with a power-of-two (E8M0) scale
	// per 32 along a row (see NewMXFP4).
	MXFP4
	// INT4 is symmetric 4-bit integers with a scale per group along a row,
	// compressed-tensors' pack-quantized (see NewINT4).
	INT4
	// UINT4 is unsigned 4-bit codes with a scale and an optional offset
	// per group along a row (see NewUINT4): ggml's Q4_1 and Q4_K.
	UINT4
	// INT8 is signed 8-bit codes with a scale and an optional offset per
	// group along a row (see NewINT8): ggml's Q8_0, and its 5- and 6-bit
	// blocks held a byte a code.
	INT8
)

// String returns the safetensors name of the dtype.
func (d DType) String() string {
	switch d {
	case F32:
		return "F32"
	case BF16:
		return "BF16"
	case F16:
		return "F16"
	case F8E4M3:
		return "F8_E4M3"
	case MXFP4:
		return "MXFP4"
	case INT4:
		return "INT4"
	case UINT4:
		return "UINT4"
	case INT8:
		return "INT8"
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// Size is the size of one element in bytes, rounded up (the 4-bit dtypes
// hold two elements a byte, see Bits; the scales of the quantized dtypes
// come on top, see Matrix.Bytes).
func (d DType) Size() int {
	switch d {
	case F32:
		return 4
	case F8E4M3, MXFP4, INT4, UINT4, INT8:
		return 1
	}
	return 2
}

// Bits is the size of one element in bits.
func (d DType) Bits() int {
	if d == MXFP4 || d == INT4 || d == UINT4 {
		return 4
	}
	return 8 * d.Size()
}

// quantized says whether d is stored with scales (FP8 and the 4- and 8-bit
// dtypes).
func (d DType) quantized() bool { return d >= F8E4M3 && d <= INT8 }

// Quantized says whether d is stored with scales: FP8 e4m3 and the 4- and
// 8-bit dtypes.
func (d DType) Quantized() bool { return d.quantized() }

// Matrix is a weight matrix [Rows, Cols] in its stored dtype: row-major as
// Hugging Face's nn.Linear stores it ([out, in]), or packed in panels for
// the SIMD kernels (see Pack).
type Matrix struct {
	DType      DType
	Rows, Cols int
	f32        []float32
	u16        []uint16
	u8         []uint8      // the quantized dtypes' bytes
	q          *blockScales // the quantized dtypes' scales
	lut        *[16]float32 // the 4-bit dtypes' nibble values
	packed     bool
	dot8       bool // packed for the int8-dot mode (see PackInt8Dot)
	// planes is the high bits' planes (1 or 2) of a packed INT8 matrix
	// whose codes are held as 5 or 6 bits, 0 for a byte a code; bias is
	// what such codes are stored plus (16 or 32 for signed codes, 0 for
	// unsigned; see Pack and PackInt8Dot).
	planes, bias uint8
	bdot         bool // packed for the bf16-dot mode (see PackBF16Dot)
}

// NewF32 wraps data as an fp32 matrix [rows, cols] without copying.
func NewF32(rows, cols int, data []float32) (Matrix, error) {
	if err := checkDims(rows, cols, len(data)); err != nil {
		return Matrix{}, err
	}
	return Matrix{DType: F32, Rows: rows, Cols: cols, f32: data[:rows*cols]}, nil
}

// NewHalf wraps bf16 or fp16 bit patterns as a matrix [rows, cols] without copying.
func NewHalf(dtype DType, rows, cols int, data []uint16) (Matrix, error) {
	if dtype != BF16 && dtype != F16 {
		return Matrix{}, fmt.Errorf("kernels: NewHalf: dtype %v is not a 16-bit float", dtype)
	}
	if err := checkDims(rows, cols, len(data)); err != nil {
		return Matrix{}, err
	}
	return Matrix{DType: dtype, Rows: rows, Cols: cols, u16: data[:rows*cols]}, nil
}

func checkDims(rows, cols, n int) error {
	if rows < 0 || cols < 0 {
		return fmt.Errorf("kernels: negative matrix shape [%d, %d]", rows, cols)
	}
	if cols != 0 && rows > n/cols || rows*cols != n {
		return fmt.Errorf("kernels: matrix [%d, %d] needs %d values, have %d", rows, cols, rows*cols, n)
	}
	return nil
}

// Clone returns a copy of m that shares no memory with it (a matrix that
// viewed a mapped file no longer does).
func (m Matrix) Clone() Matrix {
	c := m
	c.f32 = append([]float32(nil), m.f32...)
	c.u16 = append([]uint16(nil), m.u16...)
	c.u8 = append([]uint8(nil), m.u8...)
	if m.q != nil {
		q := *m.q
		q.grid, q.off = slices.Clone(m.q.grid), slices.Clone(m.q.off)
		q.panel, q.offPanel = slices.Clone(m.q.panel), slices.Clone(m.q.offPanel)
		q.kmeta, q.e8 = slices.Clone(m.q.kmeta), slices.Clone(m.q.e8)
		q.h16, q.offH16 = slices.Clone(m.q.h16), slices.Clone(m.q.offH16)
		if sup := m.q.super; sup != nil {
			q.super = &superScales{per: sup.per, offsets: sup.offsets, d: slices.Clone(sup.d), dmin: slices.Clone(sup.dmin), sc: slices.Clone(sup.sc), m: slices.Clone(sup.m)}
		}
		c.q = &q
	}
	return c
}

// RowF32 widens row i into dst[:Cols].
func (m Matrix) RowF32(i int, dst []float32) {
	dst = dst[:m.Cols]
	if m.packed {
		m.packedRowF32(i, dst)
		return
	}
	lo := i * m.Cols
	switch m.DType {
	case F32:
		copy(dst, m.f32[lo:lo+m.Cols])
	case BF16:
		half.BF16SliceToF32(dst, m.u16[lo:lo+m.Cols])
	case F16:
		half.F16SliceToF32(dst, m.u16[lo:lo+m.Cols])
	case F8E4M3:
		m.fp8RowF32(i, dst)
	case MXFP4, INT4, UINT4:
		m.q4RowF32(i, dst)
	case INT8:
		m.int8RowF32(i, dst)
	}
}

// SpanF32 widens row i's columns [c0, c0+len(dst)) into dst: a run of an
// attention cache row (one key/value head's keys or values). Row-major
// f32, bf16 and f16 matrices read only the run; others widen the row.
func (m Matrix) SpanF32(i, c0 int, dst []float32) {
	lo := i*m.Cols + c0
	switch {
	case m.packed:
	case m.DType == F32:
		copy(dst, m.f32[lo:lo+len(dst)])
		return
	case m.DType == BF16:
		half.BF16SliceToF32(dst, m.u16[lo:lo+len(dst)])
		return
	case m.DType == F16:
		half.F16SliceToF32(dst, m.u16[lo:lo+len(dst)])
		return
	}
	row := make([]float32, m.Cols)
	m.RowF32(i, row)
	copy(dst, row[c0:])
}

// SpanRowsF32 widens columns [c0, c0+n) of rows [r0, r0+rows) into dst
// [rows, n], row after row: one key/value head's keys or values of an
// attention cache's rows. bf16 and fp16 runs of a multiple of 16 values
// take the SIMD widening where the machine has it (the same values: the
// widening is exact).
func (m Matrix) SpanRowsF32(r0, rows, c0, n int, dst []float32) {
	dst = dst[:rows*n]
	if rows == 0 || n == 0 {
		return
	}
	if s := active; s != nil && !m.packed && n%PanelWidth == 0 && c0 >= 0 && r0 >= 0 && c0+n <= m.Cols && r0+rows <= m.Rows {
		widen := s.bf16
		if m.DType == F16 {
			widen = s.half
		}
		if (m.DType == BF16 || m.DType == F16) && widen != nil {
			src := m.u16[r0*m.Cols+c0 : (r0+rows-1)*m.Cols+c0+n] // every value read, bounds-checked
			widen(&dst[0], &src[0], rows, n, 2*m.Cols, 4*n)
			return
		}
	}
	for r := range rows {
		m.SpanF32(r0+r, c0, dst[r*n:(r+1)*n])
	}
}

// PrefetchRows asks the machine to bring columns [c0, c0+n) of rows [r0,
// r0+rows) of a row-major fp32, bf16 or fp16 matrix into its caches: a
// hint, which changes no value (an attention cache's next rows, so that
// a head's strided runs do not wait on memory one by one). Ranges outside
// the matrix, other dtypes and machines without the SIMD kernels do
// nothing.
func (m Matrix) PrefetchRows(r0, rows, c0, n int) {
	s := active
	if s == nil || s.prefetch == nil || m.packed || m.DType.quantized() || m.DType == F8E4M3 ||
		rows < 1 || n < 1 || r0 < 0 || c0 < 0 || r0+rows > m.Rows || c0+n > m.Cols {
		return
	}
	es := m.DType.Size()
	s.prefetch((*byte)(unsafe.Add(unsafe.Pointer(m.rowPtr(r0)), c0*es)), rows, n*es, m.Cols*es)
}

// At returns element [i, j] widened to float32.
func (m Matrix) At(i, j int) float32 {
	if m.dot8 || m.planes > 0 {
		return m.q.weight(float32(m.code(i, j)), i, j)
	}
	if m.bdot {
		return half.BF16ToF32(m.u16[m.bdotIndex(i, j)])
	}
	k := i*m.Cols + j
	if m.packed {
		k = m.packedIndex(i, j)
	}
	switch m.DType {
	case BF16:
		return half.BF16ToF32(m.u16[k])
	case F16:
		return half.F16ToF32(m.u16[k])
	case F8E4M3:
		return e4m3[m.u8[k]] * m.q.at(i, j)
	case MXFP4, INT4, UINT4: // k counts nibbles
		return m.q.weight(m.lut[m.u8[k/2]>>(4*(k&1))&15], i, j)
	case INT8:
		return m.q.weight(float32(int8(m.u8[k])), i, j)
	}
	return m.f32[k]
}
