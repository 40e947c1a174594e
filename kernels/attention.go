package kernels

import (
	"fmt"
	"sync"
	"unsafe"
)

// Attention over a cache read in place: a head's keys (values) are a run
// of each cache row, and ScoreRows and WeighRows read them where they lie,
// widened in registers, instead of widening a chunk of them into fp32
// copies for Down and GEMMRows. Their bits are those copies' (the kernels
// keep the orders of the dot and packed kernels; the widening is exact),
// so an attention may take either way on a machine and give the same
// numbers. AVX-512 only: elsewhere InPlaceAttention is false and the
// callers widen.

// attnDims are the head dimensions with in-place kernels.
var attnDims = [...]int{64, 128, 256, 512, 576}

type (
	// attnScoresFunc: for n keys (a multiple of 4) from keys, stride bytes
	// apart, out[m·ldo + j] = q[m]·key j for the 4 rows of q; ldo in bytes.
	attnScoresFunc func(q *float32, keys *byte, stride, n int, out *float32, ldo int)
	// attnWeighFunc: the chain c = fma(p[m·ldp + j], value j [x], c) over
	// j ascending for n values from vals, stride bytes apart, 4 or 8 rows
	// m, from c = part[m·d + x] into it (add 0), or from zero and then
	// part[m·d + x] += c (add 1); ldp in bytes.
	attnWeighFunc func(p *float32, ldp int, vals *byte, stride, n int, part *float32, add int)
)

func attnDim(d int) int {
	for i, v := range attnDims {
		if v == d {
			return i
		}
	}
	return -1
}

// InPlaceAttention reports whether ScoreRows (at key dimension kd) and
// WeighRows (at value dimension vd) run on row-major matrices of dtype dt
// on this machine: AVX-512, F32, BF16 or F16, dimensions 64, 128, 256,
// 512 or 576 (MLA's latent rows and their values).
func InPlaceAttention(dt DType, kd, vd int) bool {
	s := active
	if s == nil || dt > F16 || dt != F32 && dt != BF16 && dt != F16 {
		return false
	}
	i, j := attnDim(kd), attnDim(vd)
	return i >= 0 && j >= 0 && s.attnScores[dt][i] != nil && s.attnWeigh[dt][j][0] != nil
}

// ScoreRows computes, for query rows i < rows and the matrix's rows j < n
// from r0,
//
//	out[i·ldo + j] = q[i] · m[r0+j, c0 : c0+kd]
//
// each the lane-ordered dot product of Down's kernels over the row widened
// to fp32 (the same bits): an attention cache's keys read in place. q is
// [rows rounded up to 4, kd] and out has as many rows of ldo (≥ n)
// values; the rows past rows are computed too, and do not change the
// others. It needs InPlaceAttention; shapes out of range are an error.
func (m Matrix) ScoreRows(out []float32, ldo int, q []float32, kd, rows, r0, n, c0 int) error {
	rows4 := (rows + 3) &^ 3
	var f attnScoresFunc
	if s, d := active, attnDim(kd); s != nil && d >= 0 && !m.packed && m.DType <= F16 {
		f = s.attnScores[m.DType][d]
	}
	switch {
	case f == nil:
		return fmt.Errorf("kernels: ScoreRows of a %v matrix (packed %v) at key dimension %d: no in-place kernel here", m.DType, m.packed, kd)
	case rows < 0 || n < 0 || ldo < n || r0 < 0 || c0 < 0 || r0+n > m.Rows || c0+kd > m.Cols ||
		len(q) < rows4*kd || rows4 > 0 && n > 0 && len(out) < (rows4-1)*ldo+n:
		return fmt.Errorf("kernels: ScoreRows of %d rows (%d queries of %d, out %d values %d apart) against rows %d+%d, columns %d+ of a [%d, %d] matrix",
			rows, len(q), kd, len(out), ldo, r0, n, c0, m.Rows, m.Cols)
	}
	if rows == 0 || n == 0 {
		return nil
	}
	es := m.DType.Size()
	stride := m.Cols * es
	base := unsafe.Add(unsafe.Pointer(m.rowPtr(r0)), c0*es)
	main := n &^ 3
	for i := 0; i < rows4; i += 4 {
		if main > 0 {
			f(&q[i*kd], (*byte)(base), stride, main, &out[i*ldo], 4*ldo)
		}
	}
	if main == n {
		return nil
	}
	// The last n%4 keys: copied with the last one repeated to a run of 4.
	sc := attnTailPool.Get().(*attnTail)
	defer attnTailPool.Put(sc)
	for j := range 4 {
		src := unsafe.Slice((*byte)(unsafe.Add(base, min(main+j, n-1)*stride)), kd*es)
		copy(sc.keys[j*kd*es:], src)
	}
	for i := 0; i < rows4; i += 4 {
		f(&q[i*kd], &sc.keys[0], kd*es, 4, &sc.out[0], 16)
		for r := range 4 {
			copy(out[(i+r)*ldo+main:][:n-main], sc.out[4*r:])
		}
	}
	return nil
}

// attnTail is ScoreRows' scratch for a run's last keys: 4 keys of up to
// 576 fp32 values, and their 16 scores.
type attnTail struct {
	keys [4 * 576 * 4]byte
	out  [16]float32
}

var attnTailPool = sync.Pool{New: func() any { return new(attnTail) }}

// WeighRows weighs the matrix's rows r0 to r0+n, columns c0 to c0+vd, by
// the probabilities p: for rows i < rows and x < vd, over j ascending,
//
//	c = fma(p[i·ldp + j], m[r0+j, c0+x], c)
//
// the FMA chain of GEMMRows over those rows widened and packed (an
// attention cache's values read in place). Without add the chain starts
// from part[i·vd + x] and ends there (from a cleared part it is GEMMRows'
// bits; a range split in two continues it); with add it starts from zero
// and part[i·vd + x] += c (GEMMRows' product added in one rounding). p is
// [rows rounded up to 4, ldp ≥ n] and part [rows rounded up to 4, vd]; the
// rows past rows are computed too, and do not change the others. It needs
// InPlaceAttention; shapes out of range are an error.
func (m Matrix) WeighRows(part []float32, vd int, p []float32, ldp, rows, r0, n, c0 int, add bool) error {
	rows4 := (rows + 3) &^ 3
	var f [2]attnWeighFunc
	if s, d := active, attnDim(vd); s != nil && d >= 0 && !m.packed && m.DType <= F16 {
		f = s.attnWeigh[m.DType][d]
	}
	switch {
	case f[0] == nil || f[1] == nil:
		return fmt.Errorf("kernels: WeighRows of a %v matrix (packed %v) at value dimension %d: no in-place kernel here", m.DType, m.packed, vd)
	case rows < 0 || n < 0 || ldp < n || r0 < 0 || c0 < 0 || r0+n > m.Rows || c0+vd > m.Cols ||
		len(part) < rows4*vd || rows4 > 0 && n > 0 && len(p) < (rows4-1)*ldp+n:
		return fmt.Errorf("kernels: WeighRows of %d rows (p %d values %d apart, part %d of %d) over rows %d+%d, columns %d+ of a [%d, %d] matrix",
			rows, len(p), ldp, len(part), vd, r0, n, c0, m.Rows, m.Cols)
	}
	if rows == 0 || n == 0 {
		return nil
	}
	es := m.DType.Size()
	base := (*byte)(unsafe.Add(unsafe.Pointer(m.rowPtr(r0)), c0*es))
	for i := 0; i < rows4; {
		k, r := f[1], 8
		if rows4-i < 8 {
			k, r = f[0], 4
		}
		a := 0
		if add {
			a = 1
		}
		k(&p[i*ldp], 4*ldp, base, m.Cols*es, n, &part[i*vd], a)
		i += r
	}
	return nil
}

// MaxMin returns the largest and the smallest of x, and whether every
// value of x is finite (when not, hi and lo mean nothing): a softmax's
// maximum, by SIMD where the machine has it. x must not be empty.
func MaxMin(x []float32) (hi, lo float32, finite bool) {
	hi, lo = x[0], x[0]
	i := 0
	check := x[0] - x[0]
	if s := active; s != nil && s.maxMin != nil && len(x) >= 16 {
		i = len(x) &^ 15
		var out [48]float32
		s.maxMin(&x[0], i, &out)
		hi, lo = out[0], out[16]
		for l := range 16 {
			hi, lo = max(hi, out[l]), min(lo, out[16+l])
			check += out[32+l]
		}
	}
	for _, v := range x[i:] {
		hi, lo = max(hi, v), min(lo, v)
		check += v - v
	}
	return hi, lo, check == 0
}
