package kernels

import (
	"math"
	"math/bits"
	"sync"
	"unsafe"

	"github.com/moex-project/moex/internal/buffers"
	"github.com/moex-project/moex/internal/half"
)

// The outer-product schedule runs on packed weights (see Pack). A kernel
// call adds k steps of MR activation rows times NP panels to a tile of the
// output, each output one FMA chain over ascending k carried through the
// tile between calls, so neither the strips of rows, nor the k blocks, nor
// the panels beside an output change its bits.
//
// Loops, outermost first: k blocks (the activation block of every row in
// L2), weight matrices (gate and up share each block), groups of
// outerGroup panels (whose k block stays in L1), strips of at most maxMR
// rows, panels in steps of the strip's kernel width.

// outerFunc is an outer-product kernel: c[m][16j+l] += a[m][k]·panel_j[k][l]
// over k steps, panel j at b + j·stride bytes, c [mr][ldc bytes], starting
// from c when flags bit 0 is set and from zero otherwise; see _asm/outer.go.
type outerFunc func(a *[maxKernelRows]*float32, b *byte, stride, k int, c *float32, ldc, flags int)

// outerTable holds an implementation's outer-product kernels by dtype, rows
// and panel count (the widest at the end of each slice).
type outerTable = [F16 + 1][maxKernelRows + 1][]outerFunc

// outerFP8Func is an outer-product kernel on FP8 panels: outerFunc's sum
// with panel j's byte [k][l] widened to its e4m3 value times 2^-120 and
// multiplied by s[16j + l] (its row's scale times 2^120): the dequantized
// weight, exactly. The k range starts at a scale block; s moves on ss bytes
// every bk steps, to the next block's scales.
type outerFP8Func func(a *[maxKernelRows]*float32, b *byte, stride, k int, c *float32, ldc, flags int, s *float32, bk, ss int)

// outerFP8Table holds the FP8 kernels by rows and panel count.
type outerFP8Table = [maxKernelRows + 1][]outerFP8Func

// outerQFunc is an outer-product kernel on 4- or 8-bit panels. 4-bit:
// k even, each byte holds a row's nibbles of two k steps (low first), a
// nibble's code being t[nibble]; 8-bit: a byte a step, its code the byte
// as an int8 (t unused). A weight is its code times its row's scale in s
// (16 per panel) and, in the kernels with offsets, plus its row's offset
// in o (a fused multiply-add); s and o move on ss bytes every bk steps
// (bk even for 4 bits) as outerFP8Func's s.
type outerQFunc func(a *[maxKernelRows]*float32, b *byte, stride, k int, c *float32, ldc, flags int, s, t, o *float32, bk, ss int)

// outerQTable holds kernels on 4- or 8-bit panels by rows and panel count.
type outerQTable = [maxKernelRows + 1][]outerQFunc

// outerQ4Func is outerQFunc without offsets, for 4-bit panels.
type outerQ4Func func(a *[maxKernelRows]*float32, b *byte, stride, k int, c *float32, ldc, flags int, s, t *float32, bk, ss int)

// outerQ4Table holds the 4-bit kernels by rows and panel count.
type outerQ4Table = [maxKernelRows + 1][]outerQ4Func

// outerGroup is the number of panels whose k block is kept in L1 while
// every strip of rows passes over it.
const outerGroup = 4

// outerKBytes is the bytes of one k step of an outerGroup's panels that
// fit a quarter of L2: the k block is outerKBytes over the element size.
// (Blocks sized for L1 measured slower: the kernels' panel loads hide L2
// latency well, and longer blocks reload the output tiles less often.)
// Tests shrink it.
var outerKBytes = max(16, l2Bytes/4/(outerGroup*PanelWidth))

type outerScratch struct {
	ap   [maxKernelRows]*float32 // a kernel call's rows: here, not on the heap each call
	rows []*float32
	rr   []magRange
	c    [2][]float32
	ks   [2][]float32 // a call's scales and offsets made from K-quant factors (see kscales)
}

// gather returns the ranges of the rows idx picks from r, or nil without r.
func (sc *outerScratch) gather(r []magRange, idx []int32) []magRange {
	if r == nil {
		return nil
	}
	sc.rr = sc.rr[:0]
	for _, i := range idx {
		sc.rr = append(sc.rr, r[i])
	}
	return sc.rr
}

var outerPool = sync.Pool{New: func() any { return new(outerScratch) }}

// outerBlockK is the k block for M rows over K: the whole range for one
// strip (its panels are read once), else blocks of equal length, the fewest
// of at most outerKBytes per element.
func (s *simd) outerBlockK(M, K int, dtype DType) int {
	if M <= s.maxMR {
		return K
	}
	kc := max(1, outerKBytes/dtype.Size())
	blocks := (K + kc - 1) / kc
	return (K + blocks - 1) / blocks
}

// outerGEMM computes c[i][r][j] = Σ_k rows[r][k]·b[i][16·p0 + j][k] for the
// panels [p0, p1) of each packed matrix b[i] (all [·, K] of one dtype), c[i]
// holding len(rows) rows of ldc floats. K must be positive. rr, when not
// nil, is the rows' magnitude ranges (see Ranges).
func (s *simd) outerGEMM(sc *outerScratch, rows []*float32, rr []magRange, b []Matrix, p0, p1 int, c [2][]float32, ldc int) {
	M, K := len(rows), b[0].Cols
	ap := &sc.ap
	if b[0].DType.quantized() {
		s.outerGEMMQ(sc, rows, rr, b, p0, p1, c, ldc)
		return
	}
	kern := &s.outer[b[0].DType]
	esize := b[0].DType.Size()
	stride := PanelWidth * K * esize
	kc := s.outerBlockK(M, K, b[0].DType)
	for kb := 0; kb < K; kb += kc {
		kl := min(kc, K-kb)
		flags := 0
		if kb > 0 {
			flags = 1 // continue the chains in c
		}
		for i, bi := range b {
			for g := p0; g < p1; g += outerGroup {
				ge := min(g+outerGroup, p1)
				for m0, mr := 0, 0; m0 < M; m0 += mr {
					mr = s.stripRows(M, m0)
					for r := 0; r < mr; r++ {
						ap[r] = (*float32)(unsafe.Add(unsafe.Pointer(rows[m0+r]), 4*kb))
					}
					ks := kern[mr]
					for p := g; p < ge; {
						np := min(len(ks)-1, ge-p)
						ks[np](ap, bi.panelPtr(p, kb), stride, kl, &c[i][m0*ldc+(p-p0)*PanelWidth], 4*ldc, flags)
						p += np
					}
				}
			}
		}
	}
}

// outerGEMMQ is outerGEMM on packed quantized matrices: each kernel call
// runs over whole blocks (groups) of the scales, its chains in registers
// from block to block, and carries them through c from one k block to the
// next.
func (s *simd) outerGEMMQ(osc *outerScratch, rows []*float32, rr []magRange, b []Matrix, p0, p1 int, c [2][]float32, ldc int) {
	M, K, dt := len(rows), b[0].Cols, b[0].DType
	ap := &osc.ap
	// Widening first pays from a few strips on (measured: in registers is
	// faster up to 16 rows, widened from 64).
	wide := M > 3*s.maxMR
	for _, bi := range b {
		wide = wide && s.widens(bi)
	}
	if wide {
		s.outerGEMMWiden(osc, rows, b, p0, p1, c, ldc)
		return
	}
	blk := scaleBlocks(b)
	kc := s.outerBlockK(M, K, dt)
	if kc < K {
		kc = max(blk, kc-kc%blk) // k blocks of whole scale blocks
	}
	// MXFP4 on the power-of-two kernels, strip by strip where pow2Exact
	// allows (M ≤ 3·maxMR here, so the rows' ranges fit on the stack).
	var own [3 * maxKernelRows]magRange
	p2 := s.pow2(b...) && M <= len(own)
	pmin, pmax := 0, 0
	for i, bi := range b {
		if i == 0 || bi.q.pmin < pmin {
			pmin = bi.q.pmin
		}
		pmax = max(pmax, bi.q.pmax)
	}
	if p2 && rr == nil {
		for r, row := range rows {
			own[r] = magnitudeRange(unsafe.Slice(row, K))
		}
		rr = own[:M]
	}
	for kb := 0; kb < K; kb += kc {
		ke := min(kb+kc, K)
		flags := 0
		if kb > 0 {
			flags = 1 // continue the chains in c
		}
		for i, bi := range b {
			q := bi.q
			bc := q.cols                    // its scale blocks (gate and up may differ)
			ss := 4 * q.panels * PanelWidth // bytes from a block's scales to the next's
			stride := PanelWidth * K * bi.codeBits() / 8
			qt := s.qTable(bi)
			for g := p0; g < p1; g += outerGroup {
				ge := min(g+outerGroup, p1)
				// Held as K-quant factors, fp16 values or E8M0 exponents (see
				// kscales): the group's panels' scales for this k block, made
				// once for every strip (side by side, as a matrix's panel
				// scales lie for these panels alone).
				scales, offPanel := q.panel, q.offPanel
				if scales == nil {
					ss = 4 * PanelWidth * (ge - g)
					scales, offPanel = s.kscales(osc, bi, g, ge-g, kb/bc, (ke-kb)/bc, ss)
				}
				for m0, mr := 0, 0; m0 < M; m0 += mr {
					mr = s.stripRows(M, m0)
					for r := 0; r < mr; r++ {
						ap[r] = (*float32)(unsafe.Add(unsafe.Pointer(rows[m0+r]), 4*kb))
					}
					q4 := &s.outerQ4
					if p2 {
						sr := rr[m0]
						for _, r := range rr[m0+1 : m0+mr] {
							sr = sr.join(r)
						}
						if pow2Check(sr.lo, sr.hi, K, pmin, pmax) {
							q4 = &s.outerQ4P
						}
					}
					widest := len(s.outerFP8[mr]) - 1
					switch {
					case dt == F8E4M3:
					case qt != nil:
						widest = len(qt[mr]) - 1
					default:
						widest = len(q4[mr]) - 1
					}
					for p := g; p < ge; {
						np := min(widest, ge-p)
						tile := &c[i][m0*ldc+(p-p0)*PanelWidth]
						at := (kb/bc*q.panels + p) * PanelWidth
						if q.panel == nil {
							at = (p - g) * PanelWidth
						}
						sc := &scales[at]
						switch {
						case dt == F8E4M3:
							s.outerFP8[mr][np](ap, bi.panelPtr(p, kb), stride, ke-kb, tile, 4*ldc, flags, sc, bc, ss)
						case qt != nil:
							var t, off *float32
							if bi.lut != nil {
								t = &bi.lut[0]
							}
							if offPanel != nil {
								off = &offPanel[at]
							}
							qt[mr][np](ap, bi.panelPtr(p, kb), stride, ke-kb, tile, 4*ldc, flags, sc, t, off, bc, ss)
						default:
							q4[mr][np](ap, bi.panelPtr(p, kb), stride, ke-kb, tile, 4*ldc, flags, sc, &bi.lut[0], bc, ss)
						}
						p += np
					}
				}
			}
		}
	}
}

// scaleBlocks is the least k range made of whole scale blocks of every
// matrix of b (gate and up may have different groups).
func scaleBlocks(b []Matrix) int {
	blk := b[0].q.cols
	for _, m := range b[1:] {
		c := m.q.cols
		x, y := blk, c
		for y != 0 {
			x, y = y, x%y
		}
		blk = blk / x * c
	}
	return blk
}

// kscales makes, in sc's buffers, the fp32 scales (and offsets, nil
// without) that the exact kernels read for np panels from p on and groups
// [b0, b0+groups) of m, a packed matrix holding them only as K-quant
// factors (its kmeta, see dot8Factors), as fp16 values (its h16 and
// offH16) or as E8M0 exponents (an MXFP4 matrix's e8): panel p+j's group
// b0+g at g·ss/4 + 16·j, as a matrix's panel scales lie for those panels
// alone.
func (s *simd) kscales(sc *outerScratch, m Matrix, p, np, b0, groups, ss int) (scales, offsets []float32) {
	q := m.q
	n := groups * ss / 4
	scales = buffers.Grow(&sc.ks[0], n)
	offs := q.hasOffsets()
	var op *float32
	if offs {
		offsets = buffers.Grow(&sc.ks[1], n)
		op = &offsets[0]
	}
	if q.h16 != nil || q.e8 != nil { // fp16 values or E8M0 exponents in the int8-dot layout (see Pack), widened exactly
		// A run's panels' groups lie side by side (dot8Run panels a group):
		// a chunk of panels within one run is a stream of groups.
		run := dot8Run * PanelWidth
		for j := 0; j < min(np, q.panels-p); {
			pj := p + j
			cnt := min(np, q.panels-p, j+dot8Run-pj%dot8Run) - j
			at := ((pj/dot8Run*q.gridCols+b0)*dot8Run + pj%dot8Run) * PanelWidth
			if q.e8 != nil {
				dst := scales[PanelWidth*j:]
				if s.e8 != nil {
					s.e8(&dst[0], &q.e8[at], groups, cnt*PanelWidth, run, ss)
				} else {
					for g := range groups {
						for i, e := range q.e8[at+g*run:][:cnt*PanelWidth] {
							dst[g*ss/4+i] = e8Scale(e)
						}
					}
				}
				j += cnt
				continue
			}
			for i, h := range [2][]uint16{q.h16, q.offH16} {
				if h == nil {
					continue
				}
				dst := [2][]float32{scales, offsets}[i][PanelWidth*j:]
				if s.half != nil {
					s.half(&dst[0], &h[at], groups, cnt*PanelWidth, 2*run, ss)
					continue
				}
				for g := range groups {
					half.F16SliceToF32(dst[g*ss/4:][:cnt*PanelWidth], h[at+g*run:][:cnt*PanelWidth])
				}
			}
			j += cnt
		}
		return scales, offsets
	}
	per := q.super.per
	hdr, grp := 256, 64
	if offs {
		hdr, grp = 512, 128
	}
	runBytes := q.gridCols / per * (hdr + per*grp)
	f := s.kscale
	if offs {
		f = s.kscaleM
	}
	for j := range min(np, q.panels-p) {
		pj := p + j
		lane := PanelWidth * (pj % dot8Run)
		start := pj/dot8Run*runBytes + b0/per*(hdr+per*grp) // the first group's super-block
		base, fac, left := start, start, 0
		if gi := b0 % per; gi > 0 {
			fac, left = start+hdr+gi*grp, per-gi
		}
		var oj *float32
		if op != nil {
			oj = &offsets[PanelWidth*j]
		}
		if f == nil {
			for g := range groups {
				for r := range PanelWidth {
					row := min(pj*PanelWidth+r, m.Rows-1) // past the last row: any value
					at := g*ss/4 + PanelWidth*j + r
					scales[at] = q.scale(row*q.gridCols + b0 + g)
					if offs {
						offsets[at] = q.offset(row*q.gridCols + b0 + g)
					}
				}
			}
			continue
		}
		f(&scales[PanelWidth*j], oj, &q.kmeta[base], &q.kmeta[fac], lane, left, per, groups, ss)
	}
	return scales, offsets
}

// magRange is the smallest nonzero and the largest magnitude of a row as
// fp32 bits (lo 0 when the row is all zeros): what pow2Exact needs.
type magRange struct{ lo, hi uint32 }

// join is the range of two rows together.
func (r magRange) join(o magRange) magRange {
	if r.hi == 0 {
		return o
	}
	if o.hi == 0 {
		return r
	}
	return magRange{min(r.lo, o.lo), max(r.hi, o.hi)}
}

// magnitudeRange returns x's magRange.
func magnitudeRange(x []float32) magRange {
	lo, hi := uint32(math.MaxUint32), uint32(0)
	for _, v := range x {
		b := math.Float32bits(v) &^ (1 << 31)
		lo = min(lo, b-1)
		hi = max(hi, b)
	}
	return magRange{lo + 1, hi}
}

// pow2 says s runs the matrices b (one dtype, packed) on its power-of-two
// 4-bit kernels where the rows allow.
func (s *simd) pow2(b ...Matrix) bool {
	if len(b) == 0 || b[0].DType != MXFP4 || len(s.outerQ4P[1]) <= 1 {
		return false
	}
	for _, m := range b {
		if !m.packed || m.q == nil || !m.q.pow2 {
			return false
		}
	}
	return true
}

// rowRanges returns the magRange of each of the rows [rows, k] of x when
// the active implementation would use them for the matrices b, else nil:
// a grouped call computes them once rather than once per tile.
func rowRanges(dst []magRange, x []float32, k int, b ...Matrix) []magRange {
	if s := active; s == nil || k == 0 || !s.pow2(b...) {
		return nil
	}
	n := len(x) / k
	if cap(dst) < n {
		dst = make([]magRange, n)
	}
	dst = dst[:n]
	for r := range dst {
		dst[r] = magnitudeRange(x[r*k:][:k])
	}
	return dst
}

// pow2Exact reports whether the power-of-two 4-bit kernels give the other
// kernels' bits for activations whose nonzero magnitudes lie within the
// fp32 bits [lo, hi], over K steps, against weights t[nibble]·2^p with
// |t| ≤ 8 a multiple of 1/2 and p in [pmin, pmax]. They do when no value of
// a chain is subnormal or overflows, both as computed and scaled by 2^-p:
//
//   - every product, so every chain value, is a multiple of the grid
//     G = 2^(pmin−1) · 2^(elo−23) (elo the exponent of the smallest
//     nonzero activation), and a rounding keeps it one: a nonzero value
//     is at least G, and at least G·2^-pmax scaled; both must be normal;
//   - |chain| ≤ 2·K·8·2^pmax·2^(ehi+1) (rounding grows a sum by less than
//     2 for K < 2^23), and scaled by 2^-pmin, below 2^128.
//
// NaN and infinite activations fail it (the other kernels keep their
// propagation); all-zero rows pass.
func pow2Exact(lo, hi uint32, K, pmin, pmax int) bool {
	if hi >= 0x7f800000 || K >= 1<<23 {
		return false
	}
	if hi == 0 {
		return true
	}
	elo := max(int(lo>>23), 1) - 127
	ehi := int(hi>>23) - 127
	if pmin-1+elo-23-max(0, pmax) < -126 {
		return false
	}
	return 1+bits.Len(uint(K))+3+pmax+ehi+1+max(0, -pmin) <= 127
}

// pow2Check is pow2Exact; tests replace it to show what it guards against.
var pow2Check = pow2Exact

// widenPool holds the fp32 panels outerGEMMWiden widens into.
var widenPool = sync.Pool{New: func() any { return new([]float32) }}

// outerGEMMWiden is outerGEMMQ for more rows than one strip: each panel
// group's k block is widened once into fp32 panels (the quantized kernels'
// widening, exactly) and the fp32 kernels run every strip over them, so
// the widening is not repeated strip by strip. The FMA chains are those of
// the quantized kernels: the same bits.
func (s *simd) outerGEMMWiden(osc *outerScratch, rows []*float32, b []Matrix, p0, p1 int, c [2][]float32, ldc int) {
	M, K, dt := len(rows), b[0].Cols, b[0].DType
	ap := &osc.ap
	blk := scaleBlocks(b)
	kc := s.outerBlockK(M, K, F32)
	kc = max(blk, kc-kc%blk)
	kern := &s.outer[F32]
	wp := widenPool.Get().(*[]float32)
	defer widenPool.Put(wp)
	w := buffers.Grow(wp, outerGroup*min(kc, K)*PanelWidth)
	for kb := 0; kb < K; kb += kc {
		ke := min(kb+kc, K)
		kl := ke - kb
		flags := 0
		if kb > 0 {
			flags = 1 // continue the chains in c
		}
		for i, bi := range b {
			q := bi.q
			bc := q.cols
			for g := p0; g < p1; g += outerGroup {
				ge := min(g+outerGroup, p1)
				for p := g; p < ge; p++ {
					dst := w[(p-g)*kl*PanelWidth:]
					scales, offPanel, lay := q.panel, q.offPanel, q.panels
					if scales == nil { // this panel's, made from what it holds (see kscales)
						scales, offPanel = s.kscales(osc, bi, p, 1, kb/bc, (ke-kb+bc-1)/bc, 4*PanelWidth)
						lay = 1
					}
					for k0 := kb; k0 < ke; {
						k1 := min(ke, (k0/bc+1)*bc)
						at := (k0/bc*q.panels + p) * PanelWidth
						if q.panel == nil {
							at = (k0/bc - kb/bc) * lay * PanelWidth
						}
						sc, d, src := &scales[at], &dst[(k0-kb)*PanelWidth], bi.panelPtr(p, k0)
						switch {
						case bi.planes > 0:
							var off *float32
							if offPanel != nil {
								off = &offPanel[at]
							}
							s.dqNarrow(bi)(d, src, k1-k0, sc, off)
						case dt == F8E4M3:
							s.dqFP8(d, src, k1-k0, sc)
						case dt == INT8 && offPanel != nil:
							s.dqQ8M(d, src, k1-k0, sc, &offPanel[at])
						case dt == INT8:
							s.dqQ8(d, src, k1-k0, sc, nil)
						case offPanel != nil:
							s.dqQ4M(d, src, k1-k0, sc, &bi.lut[0], &offPanel[at])
						default:
							s.dqQ4(d, src, k1-k0, sc, &bi.lut[0])
						}
						k0 = k1
					}
				}
				stride := 4 * PanelWidth * kl
				for m0, mr := 0, 0; m0 < M; m0 += mr {
					mr = s.stripRows(M, m0)
					for r := 0; r < mr; r++ {
						ap[r] = (*float32)(unsafe.Add(unsafe.Pointer(rows[m0+r]), 4*kb))
					}
					ks := kern[mr]
					for p := g; p < ge; {
						np := min(len(ks)-1, ge-p)
						ks[np](ap, (*byte)(unsafe.Pointer(&w[(p-g)*kl*PanelWidth])), stride, kl, &c[i][m0*ldc+(p-p0)*PanelWidth], 4*ldc, flags)
						p += np
					}
				}
			}
		}
	}
}

// gateUpOuter is GateUp on packed weights: the panels that cover [n0, n1)
// into scratch tiles, then the activation of the columns asked for.
func gateUpOuter(s *simd, h, x []float32, xr []magRange, idx []int32, gate, up Matrix, ep *glu, n0, n1 int) {
	K, inter := gate.Cols, gate.Rows
	M := len(idx)
	sc := outerPool.Get().(*outerScratch)
	defer sc.put()
	rows := rowPtrs(sc.grow(M), x, idx, K)
	rr := sc.gather(xr, idx)
	p0, p1 := n0/PanelWidth, (n1+PanelWidth-1)/PanelWidth
	ldc := (p1 - p0) * PanelWidth
	sc.c[0], sc.c[1] = buffers.Grow(&sc.c[0], M*ldc), buffers.Grow(&sc.c[1], M*ldc)
	mats := [2]Matrix{gate, up}
	s.outerGEMM(sc, rows, rr, mats[:], p0, p1, sc.c, ldc)
	off := p0 * PanelWidth
	for r := 0; r < M; r++ {
		storeGLU(h[r*inter+n0:][:n1-n0], sc.c[0][r*ldc+n0-off:], sc.c[1][r*ldc+n0-off:], ep, r, n0)
	}
}

// downOuter is Down and GEMMRows on a packed matrix; with idx non-nil, row
// r of h is h[idx[r]].
func downOuter(s *simd, out, h []float32, hr []magRange, idx []int32, down Matrix, bias, scale []float32, n0, n1 int) {
	hidden, K := down.Rows, down.Cols
	M := len(h) / K
	if idx != nil {
		M = len(idx)
	}
	sc := outerPool.Get().(*outerScratch)
	defer sc.put()
	rows := rowPtrs(sc.grow(M), h, idx, K)
	rr := hr
	if idx != nil {
		rr = sc.gather(hr, idx)
	}
	p0, p1 := n0/PanelWidth, (n1+PanelWidth-1)/PanelWidth
	ldc := (p1 - p0) * PanelWidth
	sc.c[0] = buffers.Grow(&sc.c[0], M*ldc)
	mats := [1]Matrix{down}
	s.outerGEMM(sc, rows, rr, mats[:], p0, p1, sc.c, ldc)
	off := p0 * PanelWidth
	for r := 0; r < M; r++ {
		storeDown(out[r*hidden+n0:][:n1-n0], sc.c[0][r*ldc+n0-off:], bias, scale, r, n0)
	}
}

// put returns the scratch to the pool without its row pointers, which
// would keep the activations from the collector.
func (sc *outerScratch) put() {
	clear(sc.rows)
	outerPool.Put(sc)
}

func (sc *outerScratch) grow(m int) []*float32 {
	if cap(sc.rows) < m {
		sc.rows = make([]*float32, m)
	}
	sc.rows = sc.rows[:m]
	return sc.rows
}

// storeGLU writes into hr row r's activation of its gate and up products
// g and u (columns n0 on): SwiGLU, or ep's (which may scale and bias g
// and u in place).
func storeGLU(hr, g, u []float32, ep *glu, r, n0 int) {
	if ep == nil {
		siluGate.row(hr, g, u)
		return
	}
	ep.row(hr, g, u, r, n0)
}

// storeDown writes into o row r's products c (columns n0 on), with the
// bias and the row's routing weight where given.
func storeDown(o, c, bias, scale []float32, r, n0 int) {
	c = c[:len(o)]
	switch {
	case bias != nil:
		for n := range o {
			o[n] = biased(c[n], bias, n0+n, scale, r)
		}
	case scale == nil:
		copy(o, c)
	default:
		w := scale[r]
		for n := range o {
			o[n] = c[n] * w
		}
	}
}

// rowPtrs points rows[r] at row idx[r] of a (row r with idx nil), rows of
// k floats, and returns rows.
func rowPtrs(rows []*float32, a []float32, idx []int32, k int) []*float32 {
	for r := range rows {
		i := r
		if idx != nil {
			i = int(idx[r])
		}
		rows[r] = &a[i*k]
	}
	return rows
}
