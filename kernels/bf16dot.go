package kernels

import (
	"fmt"
	"math"
	"sync"
	"time"
	"unsafe"

	"github.com/moex-project/moex/internal/buffers"
	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/internal/hugepage"
)

// The bf16-dot numerics mode (BF16Dot), chosen per matrix (PackBF16Dot)
// and never taken otherwise: bf16 weights against activations rounded to
// bf16 (to nearest, ties to even), the products of two k steps at a time
// added to one fp32 chain as AVX-512 BF16's vdpbf16ps adds them. For each
// pair of steps 2j, 2j+1 in ascending j:
//
//	acc = daz(acc)
//	acc = ftz(acc + daz(a[2j+1])·daz(w[2j+1]))   (one rounding)
//	acc = ftz(acc + daz(a[2j])·daz(w[2j]))       (one rounding)
//
// from zero; daz makes a subnormal input zero, ftz a subnormal result
// (its sign kept). Each bf16 product is exact in fp32. The generic code
// computes the same bits as the kernels (checked on this order against the
// instruction, subnormals included); an output depends on its own rows
// only. The error against exact arithmetic is that of rounding the
// activations to bf16: about 2^-9 of each.

// bdotFunc is a bf16-dot kernel: outerFunc on bf16 activation rows a (k
// even) and bf16-dot panels (see PackBF16Dot), the chains as the mode
// defines them.
type bdotFunc func(a *[maxKernelRows]*uint16, b *byte, stride, k int, c *float32, ldc, flags int)

// bdotTable holds bf16-dot kernels by rows and panel count.
type bdotTable = [maxKernelRows + 1][]bdotFunc

// PackBF16Dot returns m, a bf16 matrix with an even column count, packed
// for the bf16-dot mode: panels of 16 rows, each pair of k steps a row's
// two weights side by side ([k/2][16][2]). Its products are computed as
// the mode defines (see BF16Dot) by every kernel call, on every
// implementation; At and RowF32 still give the weights' values. Other
// matrices are an error naming why.
func PackBF16Dot(m Matrix) (Matrix, error) {
	if m.bdot {
		return m, nil
	}
	if m.DType != BF16 || m.dot8 {
		return Matrix{}, fmt.Errorf("kernels: bf16dot numerics need BF16 weights, have %v", m.DType)
	}
	if m.Cols%2 != 0 {
		return Matrix{}, fmt.Errorf("kernels: bf16dot numerics need an even column count, have %d", m.Cols)
	}
	p := Matrix{DType: BF16, Rows: m.Rows, Cols: m.Cols, packed: true, bdot: true}
	p.u16 = hugepage.Slice[uint16](m.panels() * PanelWidth * m.Cols)
	for i := 0; i < m.Rows; i++ { // a row at a time, in bdotIndex's layout
		l := i % PanelWidth
		dst := p.u16[(i-l)*m.Cols+2*l:]
		if m.packed { // step j of row i at (i−l)·Cols + 16j + l
			src := m.u16[(i-l)*m.Cols+l:]
			for j := 0; j < m.Cols; j += 2 {
				dst[j*PanelWidth], dst[j*PanelWidth+1] = src[j*PanelWidth], src[(j+1)*PanelWidth]
			}
			continue
		}
		src := m.u16[i*m.Cols:][:m.Cols]
		for j := 0; j < m.Cols; j += 2 {
			dst[j*PanelWidth], dst[j*PanelWidth+1] = src[j], src[j+1]
		}
	}
	return p, nil
}

// bdotIndex is the position of element [i, j] of a bf16-dot matrix.
func (m Matrix) bdotIndex(i, j int) int {
	l := i % PanelWidth
	return (i-l)*m.Cols + j/2*2*PanelWidth + 2*l + j%2
}

// bdotStep is one vdpbf16ps lane: acc plus the pair's two products, the
// odd one first, as the mode defines.
func bdotStep(acc float32, a0, a1, w0, w1 uint16) float32 {
	acc = ftz(acc)
	acc = ftz(fmaF32(daz(a1), daz(w1), acc))
	return ftz(fmaF32(daz(a0), daz(w0), acc))
}

// daz is a bf16's value, zero (signed) when subnormal.
func daz(h uint16) float32 {
	if h&0x7F80 == 0 {
		return math.Float32frombits(uint32(h&0x8000) << 16)
	}
	return half.BF16ToF32(h)
}

// ftz is x, zero (signed) when subnormal.
func ftz(x float32) float32 {
	if b := math.Float32bits(x); b&0x7F800000 == 0 {
		return math.Float32frombits(b & 0x80000000)
	}
	return x
}

// bdotGeneric computes c[r][n−n0] for n in [n0, n1), the bf16 rows a[r]
// (k each), against the bf16-dot matrix b: the mode's definition, in Go.
func bdotGeneric(c []float32, ldc int, a [][]uint16, b Matrix, n0, n1 int) {
	for r, x := range a {
		for n := n0; n < n1; n++ {
			var acc float32
			for j := 0; j < b.Cols; j += 2 {
				at := b.bdotIndex(n, j)
				acc = bdotStep(acc, x[j], x[j+1], b.u16[at], b.u16[at+1])
			}
			c[r*ldc+n-n0] = acc
		}
	}
}

// round fills sc.rows with the rows (k each) rounded to bf16; from pre,
// where it holds them (row r at pre's row idx[r], or r with idx nil).
func (sc *dotScratch) round(rows []*float32, k int, pre *dot8Rows, idx []int32) {
	sc.bf = sc.bf[:0]
	if pre != nil && pre.bf != nil && pre.k == k {
		for r := range rows {
			i := r
			if idx != nil {
				i = int(idx[r])
			}
			sc.bf = append(sc.bf, pre.bf[i*k:][:k])
		}
		return
	}
	if cap(sc.buf16) < len(rows)*k {
		sc.buf16 = make([]uint16, len(rows)*k)
	}
	for r, p := range rows {
		out := sc.buf16[r*k:][:k]
		for j, v := range unsafe.Slice(p, k) {
			out[j] = half.F32ToBF16(v)
		}
		sc.bf = append(sc.bf, out)
	}
}

// bdotGEMM is bdotGeneric on s's kernels.
func (s *simd) bdotGEMM(sc *dotScratch, b Matrix, n0, n1 int, c []float32, ldc int) {
	M, K := len(sc.bf), b.Cols
	p0, p1 := n0/PanelWidth, (n1+PanelWidth-1)/PanelWidth
	ldt := (p1 - p0) * PanelWidth
	tile := buffers.Grow(&sc.tile, M*ldt)
	stride := 2 * PanelWidth * K
	ap := &sc.apb
	for m0, mr := 0, 0; m0 < M; m0 += mr {
		mr = min(len(s.bdot)-1, M-m0)
		for r := range mr {
			ap[r] = &sc.bf[m0+r][0]
		}
		ks := s.bdot[mr]
		for p := p0; p < p1; {
			np := min(len(ks)-1, p1-p)
			ks[np](ap, (*byte)(unsafe.Pointer(&b.u16[p*PanelWidth*K])), stride, K, &tile[m0*ldt+(p-p0)*PanelWidth], 4*ldt, 0)
			p += np
		}
	}
	for r := range M {
		copy(c[r*ldc:][:n1-n0], tile[r*ldt+n0-p0*PanelWidth:])
	}
}

// bdotPeak, where the machine has the bf16-dot kernels, runs n rounds of
// 12 independent vdpbf16ps (64 flops each) on one core.
var bdotPeak func(n int) float32

// BF16DotPeak measures the machine's vdpbf16ps peak on threads goroutines
// at once (GFLOP/s, the best of three runs of about d each), and false
// where it has no AVX-512 BF16.
func BF16DotPeak(threads int, d time.Duration) (float64, bool) {
	if bdotPeak == nil {
		return 0, false
	}
	const rounds = 1 << 16
	best := 0.0
	for range 3 {
		var wg sync.WaitGroup
		start := time.Now()
		n := 0
		for time.Since(start) < d {
			n++
			for range threads {
				wg.Go(func() { bdotPeak(rounds) })
			}
			wg.Wait()
		}
		best = max(best, float64(n)*float64(threads)*rounds*12*64/time.Since(start).Seconds()/1e9)
	}
	return best, true
}
