package kernels

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/internal/hugepage"
)

// PanelWidth is the number of weight rows in one panel of a packed matrix.
const PanelWidth = 16

// Pack returns a copy of m laid out for the outer-product kernels: the
// weight rows in panels of PanelWidth, each panel k-major (element [n, k]
// at panel n/PanelWidth, position k·PanelWidth + n%PanelWidth), the last
// panel padded with zero rows. The dtype stays, so packed bf16 weights take
// the bytes they did; INT8 codes that fit in 5 or 6 bits are held in that
// many (see packNarrow and PackInt8Dot); integer codes with the
// K-quants' factors keep their scales only as those, fp16 scales stay
// fp16 and MXFP4's E8M0 ones a byte a block (see kscales). A
// packed matrix goes wherever a Matrix does and gives the same values
// through RowF32 and At; a packed m is returned as it is.
//
// Packing is done once, when weights are loaded: the SIMD kernels then read
// one contiguous stream per panel, and every output is a single FMA chain
// over ascending k, whatever the batch (see the package's kernels).
func Pack(m Matrix) Matrix {
	if m.packed {
		return m
	}
	p := m
	p.packed = true
	K := m.Cols
	n := m.panels() * PanelWidth * K
	switch m.DType {
	case F32:
		p.f32 = hugepage.Slice[float32](n)
		packRows(p.f32, m.f32, m.Rows, K)
	case INT8:
		codes := make([]uint8, K)
		p.planes, p.bias = m.narrowCodes(codes)
		if p.planes > 0 {
			p.u8 = hugepage.Bytes(n * p.codeBits() / 8)
			packNarrow(p.u8, m, p.planes, p.bias)
		} else {
			p.u8 = hugepage.Bytes(n)
			packRows(p.u8, m.u8, m.Rows, K)
		}
		p.q = m.q.packScales(m.Rows, m.panels(), 1)
	case F8E4M3:
		p.u8 = hugepage.Bytes(n)
		packRows(p.u8, m.u8, m.Rows, K)
		factor := 1.0
		if m.DType == F8E4M3 {
			factor = 0x1p120
		}
		p.q = m.q.packScales(m.Rows, m.panels(), factor)
	case MXFP4, INT4, UINT4:
		p.u8 = hugepage.Bytes(n / 2)
		packNibbles(p.u8, m.u8, m.Rows, K, m.lut)
		p.q = m.q.packScales(m.Rows, m.panels(), 1)
	default:
		p.u16 = hugepage.Slice[uint16](n)
		packRows(p.u16, m.u16, m.Rows, K)
	}
	if m.DType == UINT4 || m.DType == INT8 || m.DType == MXFP4 || m.DType == INT4 {
		// The panels hold the scales and offsets (blockScales.scale): no
		// fp32 grid beside them. With the K-quants' factors, only those,
		// as the int8-dot kernels read them; fp16 ones (GGUF's Q8_0, Q4_0,
		// Q4_1, Q5_0 and Q5_1 store theirs so), as fp16: the exact
		// kernels' fp32 scales are made for each call (see kscales).
		p.q = p.q.dropGrid()
		switch {
		case m.q.kFactored(m.DType):
			p.q.panel, p.q.offPanel = nil, nil
			p.q.kmeta = m.q.dot8Factors(m.Rows, m.panels())
			p.q.super = &superScales{per: m.q.super.per, offsets: m.q.super.offsets}
		case m.DType == MXFP4 && p.q.panel != nil:
			// E8M0 exponents, a byte a block as the files hold them, in
			// the int8-dot layout; where a scale is not one (a matrix not
			// from a file, say), fp32 panels.
			d := m.q.dot8Scales(m.Rows, m.panels())
			if e8, err := toE8(d, m.Rows); err == nil {
				p.q.e8, p.q.e8Exact, p.q.panel, p.q.dot8Panel = e8, true, nil, true
			}
		case p.q.panel != nil:
			// In the int8-dot layout (see dot8Scales): a call's panels'
			// scales for its k range are one stream.
			d := m.q.dot8Scales(m.Rows, m.panels())
			if h, ok := toHalf(d.panel); ok {
				if o, ok := toHalf(d.offPanel); ok {
					p.q.h16, p.q.offH16, p.q.panel, p.q.offPanel = h, o, nil, nil
					p.q.dot8Panel = true
				}
			}
		}
	}
	return p
}

// narrowUnit is the bytes of a unit (dot8Unit steps) of a panel of codes
// held in 4 + planes bits (see packNarrow).
func narrowUnit(planes uint8) int { return 64 + 16*int(planes) }

// packNarrow writes the row-major INT8 matrix m, whose codes plus bias
// fit in 4 + planes bits, into dst in panels of units of 8 steps: 64
// bytes of nibbles (byte 16p + l: row l's codes of steps 2p, low, and
// 2p+1, high) and each high bit's plane (16 bytes: a 64-bit word for the
// even steps, then one for the odd ones, bit 16p + l for row l's step 2p
// or 2p+1, as the nibbles' bytes), a panel at a time.
func packNarrow(dst []uint8, m Matrix, planes, bias uint8) {
	unit := narrowUnit(planes)
	K := m.Cols
	rows := make([]uint8, PanelWidth*K) // a panel's codes plus bias, row-major
	for p0 := 0; p0 < m.Rows; p0 += PanelWidth {
		clear(rows)
		for r := p0; r < min(p0+PanelWidth, m.Rows); r++ {
			code := rows[(r-p0)*K:][:K]
			m.codeRow(r, code)
			for j := range code {
				code[j] += bias
			}
		}
		panel := dst[p0/PanelWidth*K/dot8Unit*unit:]
		for u := 0; u < K; u += dot8Unit {
			un := panel[u/dot8Unit*unit:][:unit]
			for s := 0; s < dot8Unit; s++ {
				var hi4, hi5 uint16 // the step's planes, a bit a row
				for l := range PanelWidth {
					c := rows[l*K+u+s]
					un[16*(s/2)+l] |= c & 15 << (4 * (s & 1))
					hi4 |= uint16(c>>4&1) << l
					hi5 |= uint16(c>>5&1) << l
				}
				binary.LittleEndian.PutUint16(un[narrowPlaneAt(0, s):], hi4)
				if planes > 1 {
					binary.LittleEndian.PutUint16(un[narrowPlaneAt(1, s):], hi5)
				}
			}
		}
	}
}

// narrowPlaneAt is where in a unit plane pl's bits of step s start (16,
// a row each).
func narrowPlaneAt(pl, s int) int { return 64 + 16*pl + 8*(s%2) + 2*(s/2) }

// narrowCode is the code of element [i, j] of a packed matrix held as
// packNarrow lays it out.
func (m Matrix) narrowCode(i, j int) int {
	unit := narrowUnit(m.planes)
	l, s := i%PanelWidth, j%dot8Unit
	un := m.u8[i/PanelWidth*m.Cols/dot8Unit*unit+j/dot8Unit*unit:]
	c := int(un[16*(s/2)+l] >> (4 * (s & 1)) & 15)
	for pl := range int(m.planes) {
		c |= int(un[narrowPlaneAt(pl, s)+l/8]>>(l%8)&1) << (4 + pl)
	}
	return c - int(m.bias)
}

// packRows writes the rows×k matrix src into dst in panels, one panel at
// a time, so that the strided writes stay within one panel's cache lines.
func packRows[T float32 | uint16 | uint8](dst, src []T, rows, k int) {
	for p0 := 0; p0 < rows; p0 += PanelWidth {
		panel := dst[p0*k:][:PanelWidth*k]
		for r := p0; r < min(p0+PanelWidth, rows); r++ {
			row := src[r*k:][:k]
			for j, v := range row {
				panel[j*PanelWidth+r-p0] = v
			}
		}
	}
}

// PacksWeights says whether this machine has kernels for packed weights
// (a SIMD implementation): where it does, layers pack their experts when
// they are made; elsewhere packing would only slow the generic path.
func PacksWeights() bool {
	implMu.Lock()
	defer implMu.Unlock()
	return len(simds) > 0
}

// Packed says whether m is laid out in panels (see Pack).
func (m Matrix) Packed() bool { return m.packed }

// panels is the number of panels that cover m's rows.
func (m Matrix) panels() int { return (m.Rows + PanelWidth - 1) / PanelWidth }

// packedRowF32 widens row i of a packed matrix into dst[:Cols].
func (m Matrix) packedRowF32(i int, dst []float32) {
	if m.Cols == 0 {
		return
	}
	if m.bdot {
		for k := range dst {
			dst[k] = m.At(i, k)
		}
		return
	}
	base := m.packedIndex(i, 0)
	switch m.DType {
	case F32:
		src := m.f32[base:]
		for k := range dst {
			dst[k] = src[k*PanelWidth]
		}
	case BF16:
		src := m.u16[base:]
		for k := range dst {
			dst[k] = half.BF16ToF32(src[k*PanelWidth])
		}
	case F16:
		src := m.u16[base:]
		for k := range dst {
			dst[k] = half.F16ToF32(src[k*PanelWidth])
		}
	case F8E4M3:
		src := m.u8[base:]
		for k := range dst {
			dst[k] = e4m3[src[k*PanelWidth]] * m.q.at(i, k)
		}
	case MXFP4, INT4, UINT4, INT8:
		for k := range dst {
			dst[k] = m.At(i, k)
		}
	}
}

// packedIndex is the position of element [i, j] of a packed matrix.
// For the 4-bit dtypes it counts nibbles: a panel's k steps go in pairs,
// byte l of pair j holding row l's nibbles of steps 2j (low) and 2j+1.
func (m Matrix) packedIndex(i, j int) int {
	if m.DType.Bits() == 4 {
		return 2*((i-i%PanelWidth)*m.Cols/2+j/2*PanelWidth+i%PanelWidth) + j&1
	}
	return (i-i%PanelWidth)*m.Cols + j*PanelWidth + i%PanelWidth
}

// panelPtr points at step k of panel p of a packed matrix with Cols > 0.
func (m Matrix) panelPtr(p, k int) *byte {
	off := (p*m.Cols + k) * PanelWidth
	if m.planes > 0 { // k a multiple of 8: a unit's start
		return &m.u8[off*m.codeBits()/8]
	}
	switch m.DType {
	case F32:
		return (*byte)(unsafe.Pointer(&m.f32[off]))
	case F8E4M3, INT8:
		return &m.u8[off]
	case MXFP4, INT4, UINT4: // k even
		return &m.u8[off/2]
	}
	return (*byte)(unsafe.Pointer(&m.u16[off]))
}

// PackColumns returns, packed, the transpose of rows [r0, r1) and columns
// [0, n) of the row-major m: the [n, r1-r0] matrix whose row x is column x
// of those rows (an attention block's values as the weights of a GEMM over
// its rows). Each panel's k step is a run of one of m's rows, so nothing is
// transposed element by element. reuse, a previous result, lends its memory
// when it is large enough and of m's dtype.
func PackColumns(m Matrix, r0, r1, n int, reuse Matrix) Matrix {
	K := r1 - r0
	p := Matrix{DType: m.DType, Rows: n, Cols: K, packed: true}
	size := p.panels() * PanelWidth * K
	switch m.DType {
	case F32:
		p.f32 = reuse.f32
		if cap(p.f32) < size || reuse.DType != F32 {
			p.f32 = make([]float32, size)
		}
		p.f32 = p.f32[:size]
		packColumns(p.f32, m.f32, m.Cols, r0, K, n)
	default:
		p.u16 = reuse.u16
		if cap(p.u16) < size || reuse.DType != m.DType {
			p.u16 = make([]uint16, size)
		}
		p.u16 = p.u16[:size]
		packColumns(p.u16, m.u16, m.Cols, r0, K, n)
	}
	return p
}

// NewPackedF32 returns a packed fp32 matrix [n, k] (Pack's layout) whose
// values PackRows sets, its memory lent by reuse when large enough.
func NewPackedF32(n, k int, reuse Matrix) Matrix {
	p := Matrix{DType: F32, Rows: n, Cols: k, packed: true}
	size := p.panels() * PanelWidth * k
	p.f32 = reuse.f32
	if cap(p.f32) < size || reuse.DType != F32 {
		p.f32 = make([]float32, size)
	}
	p.f32 = p.f32[:size]
	return p
}

// PackRows sets k steps [k0, k0+rows) of p, a matrix NewPackedF32 made,
// from rows [r0, r0+rows) of the row-major f32, bf16 or f16 src, columns
// [c0, c0+p.Rows): p[x, k0+j] = src[r0+j, c0+x] (an attention cache's
// values, one head's columns, as the weights of a GEMM over its rows). A
// panel's k step is a run of one of src's rows, widened by SIMD where the
// machine has it. Ranges outside either matrix are an error.
func (p Matrix) PackRows(src Matrix, r0, rows, c0, k0 int) error {
	K, n := p.Cols, p.Rows
	if !p.packed || p.DType != F32 || src.packed || src.DType.quantized() || rows < 0 || k0 < 0 || k0+rows > K || r0 < 0 || r0+rows > src.Rows || c0 < 0 || c0+n > src.Cols {
		return fmt.Errorf("kernels: PackRows of rows %d+%d, columns %d+%d of a %v [%d, %d] (packed %v) into k steps %d+ of a %v [%d, %d] (packed %v)",
			r0, rows, c0, n, src.DType, src.Rows, src.Cols, src.packed, k0, p.DType, n, K, p.packed)
	}
	s := active
	for x0 := 0; x0 < n; x0 += PanelWidth {
		w := min(PanelWidth, n-x0)
		panel := p.f32[x0*K:][:PanelWidth*K]
		if s != nil && w == PanelWidth && rows > 0 && (src.DType == BF16 && s.bf16 != nil || src.DType == F16 && s.half != nil) {
			widen := s.bf16
			if src.DType == F16 {
				widen = s.half
			}
			from := src.u16[r0*src.Cols+c0+x0 : (r0+rows-1)*src.Cols+c0+x0+PanelWidth]
			widen(&panel[k0*PanelWidth], &from[0], rows, PanelWidth, 2*src.Cols, 4*PanelWidth)
			continue
		}
		for j := range rows {
			out := panel[(k0+j)*PanelWidth:][:PanelWidth]
			src.SpanF32(r0+j, c0+x0, out[:w])
			clear(out[w:])
		}
	}
	return nil
}

// PackStrided returns, packed, the [n, m.Rows] matrix whose row x is
// column first + step·x of the row-major m (an x·W weight [in, out], its
// output columns possibly interleaved with another projection's): each
// panel's k step is read from one row of m, so m is never transposed
// through a copy. m must be f32, bf16 or f16 and the columns in range.
func PackStrided(m Matrix, first, step, n int) (Matrix, error) {
	if m.packed || m.DType.quantized() {
		return Matrix{}, fmt.Errorf("kernels: PackStrided of a %v matrix (packed %v): want a row-major f32, bf16 or f16 one", m.DType, m.packed)
	}
	if n < 0 || first < 0 || step < 1 || n > 0 && first+step*(n-1) >= m.Cols {
		return Matrix{}, fmt.Errorf("kernels: PackStrided: columns %d + %d·[0, %d) of a matrix with %d", first, step, n, m.Cols)
	}
	K := m.Rows
	p := Matrix{DType: m.DType, Rows: n, Cols: K, packed: true}
	size := p.panels() * PanelWidth * K
	if m.DType == F32 {
		p.f32 = make([]float32, size)
		hugepage.Advise(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(p.f32))), 4*size))
		packStrided(p.f32, m.f32, m.Cols, 0, K, n, first, step)
	} else {
		p.u16 = make([]uint16, size)
		hugepage.Advise(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(p.u16))), 2*size))
		packStrided(p.u16, m.u16, m.Cols, 0, K, n, first, step)
	}
	return p, nil
}

func packColumns[T float32 | uint16](dst, src []T, cols, r0, k, n int) {
	packStrided(dst, src, cols, r0, k, n, 0, 1)
}

// packStrided packs the [n, k] matrix whose element [x, j] is
// src[(r0+j)·cols + first + step·x].
func packStrided[T float32 | uint16](dst, src []T, cols, r0, k, n, first, step int) {
	for x0 := 0; x0 < n; x0 += PanelWidth {
		w := min(PanelWidth, n-x0)
		panel := dst[x0*k:][:PanelWidth*k]
		for j := 0; j < k; j++ {
			out := panel[j*PanelWidth:][:PanelWidth]
			row := src[(r0+j)*cols+first+step*x0:]
			if step == 1 {
				copy(out, row[:w])
			} else {
				for l := range w {
					out[l] = row[step*l]
				}
			}
			clear(out[w:]) // the last panel's padding
		}
	}
}
