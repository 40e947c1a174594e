package kernels

import (
	"sync"
	"unsafe"
)

// The dot-product drivers below run row-major weights (packed weights take
// the outer-product kernels, outer.go). They have two schedules, both built
// on kernels of one lane order, so that a row's bits never depend on which
// one ran it.
//
// Few rows (decode, at most maxMR8): weights stream from memory once, in
// blocks of weight rows sized to stay in L2, eight weight rows per kernel
// call for more streams in flight.
//
// More rows: a strip of maxMR activation rows at a time, the k range in
// blocks whose activation strip stays in L1 while the weight rows of the
// work item (in L2) pass under it; the kernels carry each output's lanes in
// a small buffer between k blocks, which keeps the order exactly.
//
// Activation rows are read in place through their token index (no gather
// copy) and weights in their stored dtype (no packing): the kernels widen
// them in registers. The k % lanes tail is added after the lane reduction,
// one rounded product at a time.

// blockRows is the number of weight rows of one L2 block: half of L2 for
// weights, the rest for activations and outputs.
func blockRows(k int, dtype DType) int {
	return max(4, l2Bytes/2/max(1, k*dtype.Size()))
}

// laneAcc holds the lanes of one kernel call's outputs between k blocks:
// one 64-byte slot per output.
type laneAcc = [4 * maxKernelRows * 16]float32

// Blocking of the many-row schedule, from the L1 size: a k block whose
// activation strip takes half of L1, and calls per column block so that
// their lane buffers take a quarter; the weight rows stream through the
// rest. Tests shrink them.
var (
	stripK     = max(64, l1dBytes/2/(maxKernelRows*4))
	stripCalls = max(1, l1dBytes/4/int(unsafe.Sizeof(laneAcc{})))
)

// stripScratch is the per-call state of the many-row schedule.
type stripScratch struct {
	ap   [maxKernelRows]*float32 // a kernel call's operands: here, not on
	bp   [4]*byte                // the heap each call
	b    [][4]*byte
	out  [][4 * maxKernelRows]float32
	lane []laneAcc
}

var stripPool = sync.Pool{New: func() any { return new(stripScratch) }}

func (sc *stripScratch) grow(calls int) {
	if cap(sc.b) < calls {
		sc.b = make([][4]*byte, calls)
		sc.out = make([][4 * maxKernelRows]float32, calls)
	}
	sc.b, sc.out = sc.b[:calls], sc.out[:calls]
	if len(sc.lane) < min(calls, stripCalls) {
		sc.lane = make([]laneAcc, min(calls, stripCalls))
	}
}

// stripRows is the row count of the strip that starts at row m0 of M: the
// fewest strips of at most maxMR rows, their sizes as even as can be (16
// rows of three-row kernels are 3+3+3+3+2+2, not 3+3+3+3+3+1: a lone row
// has too few accumulators to hide the FMA latency).
func (s *simd) stripRows(M, m0 int) int {
	n := (M + s.maxMR - 1) / s.maxMR
	base, extra := M/n, M%n // extra strips of base+1 rows, then base rows
	if m0 < extra*(base+1) {
		return base + 1
	}
	return base
}

// strip computes, for every call c, the 4·mr dot products of the rows a
// with the four weight rows sc.b[c] over kMain elements into sc.out[c].
func (s *simd) strip(kern kernelFunc, a *[maxKernelRows]*float32, mr, kMain, esize int, sc *stripScratch) {
	// Blocks of equal length (whole vectors), the fewest that fit stripK.
	kc := max(s.lanes, stripK-stripK%s.lanes)
	if blocks := (kMain + kc - 1) / kc; blocks > 1 {
		vecs := kMain / s.lanes
		kc = (vecs + blocks - 1) / blocks * s.lanes
	}
	ap, bp := &sc.ap, &sc.bp
	for c0 := 0; c0 < len(sc.b); c0 += stripCalls {
		c1 := min(c0+stripCalls, len(sc.b))
		for kb := 0; ; kb += kc {
			kl := min(kc, kMain-kb)
			flags := 0
			if kb > 0 {
				flags |= 1 // lanes carried from the previous block
			}
			if kb+kl == kMain {
				flags |= 2 // last block: reduce
			}
			for i := 0; i < mr; i++ {
				ap[i] = (*float32)(unsafe.Add(unsafe.Pointer(a[i]), 4*kb))
			}
			for c := c0; c < c1; c++ {
				for j, p := range &sc.b[c] {
					bp[j] = (*byte)(unsafe.Add(unsafe.Pointer(p), esize*kb))
				}
				kern(ap, bp, kl, &sc.lane[c-c0], flags, &sc.out[c])
			}
			if flags&2 != 0 {
				break
			}
		}
	}
}

// gateUpSIMD is GateUp on the active SIMD implementation.
func gateUpSIMD(s *simd, h, x []float32, idx []int32, gate, up Matrix, ep *glu, n0, n1 int) {
	K, inter := gate.Cols, gate.Rows
	M := len(idx)
	if K == 0 {
		for r := 0; r < M; r++ {
			for n := n0; n < n1; n++ {
				h[r*inter+n] = ep.apply(0, 0, r, n)
			}
		}
		return
	}
	if n1 <= n0 || M == 0 {
		return
	}
	kMain := K - K%s.lanes
	kern := s.kern[gate.DType]
	var a [maxKernelRows]*float32
	if M <= s.maxMR8 {
		for i := 0; i < M; i++ {
			a[i] = &x[int(idx[i])*K]
		}
		step := max(4, blockRows(K, gate.DType)/2) // two weight rows (gate, up) per column
		var lane laneAcc
		var b [4]*byte
		var out [4 * maxKernelRows]float32
		for nb := n0; nb < n1; nb += step {
			ne := min(nb+step, n1)
			n := gateUp8(s, h, inter, &a, M, K, gate, up, ep, 0, kMain, nb, ne)
			for ; n < ne; n += 2 {
				n2 := min(n+1, ne-1)
				b = [4]*byte{gate.rowPtr(n), gate.rowPtr(n2), up.rowPtr(n), up.rowPtr(n2)}
				kern[M](&a, &b, kMain, &lane, 2, &out)
				gateUpTail(h, inter, &a, M, K, kMain, gate, up, ep, 0, n, n2, &out)
			}
		}
		return
	}
	sc := stripPool.Get().(*stripScratch)
	defer stripPool.Put(sc)
	sc.grow((n1 - n0 + 1) / 2)
	for c := range sc.b {
		n := n0 + 2*c
		n2 := min(n+1, n1-1)
		sc.b[c] = [4]*byte{gate.rowPtr(n), gate.rowPtr(n2), up.rowPtr(n), up.rowPtr(n2)}
	}
	for m0, mr := 0, 0; m0 < M; m0 += mr {
		mr = s.stripRows(M, m0)
		for i := 0; i < mr; i++ {
			a[i] = &x[int(idx[m0+i])*K]
		}
		s.strip(kern[mr], &a, mr, kMain, gate.DType.Size(), sc)
		for c := range sc.out {
			n := n0 + 2*c
			gateUpTail(h[m0*inter:], inter, &a, mr, K, kMain, gate, up, ep, m0, n, min(n+1, n1-1), &sc.out[c])
		}
	}
}

// gateUpTail adds the k tail to one kernel call's gate/up dot products
// (columns n, n2 of rows a[:mr]) and writes their activations into h
// [mr, inter].
func gateUpTail(h []float32, inter int, a *[maxKernelRows]*float32, mr, K, kMain int, gate, up Matrix, ep *glu, r0, n, n2 int, out *[4 * maxKernelRows]float32) {
	for i := 0; i < mr; i++ {
		o := out[4*i : 4*i+4]
		if kMain < K {
			xr := unsafe.Slice(a[i], K)
			for k := kMain; k < K; k++ {
				o[0] += float32(xr[k] * gate.At(n, k))
				o[1] += float32(xr[k] * gate.At(n2, k))
				o[2] += float32(xr[k] * up.At(n, k))
				o[3] += float32(xr[k] * up.At(n2, k))
			}
		}
		row := h[i*inter:]
		row[n] = ep.apply(o[0], o[2], r0+i, n)
		row[n2] = ep.apply(o[1], o[3], r0+i, n2)
	}
}

// downSIMD is Down on the active SIMD implementation; with idx non-nil,
// row r of h is h[idx[r]] and there are len(idx) rows.
func downSIMD(s *simd, out, h []float32, idx []int32, down Matrix, bias, scale []float32, n0, n1 int) {
	hidden, K := down.Rows, down.Cols
	if K == 0 {
		for r := 0; r < len(out)/max(hidden, 1); r++ {
			for n := n0; n < n1; n++ {
				out[r*hidden+n] = biased(0, bias, n, scale, r)
			}
		}
		return
	}
	M := len(h) / K
	row := func(r int) *float32 { return &h[r*K] }
	if idx != nil {
		M = len(idx)
		row = func(r int) *float32 { return &h[int(idx[r])*K] }
	}
	if n1 <= n0 || M == 0 {
		return
	}
	kMain := K - K%s.lanes
	kern := s.kern[down.DType]
	var a [maxKernelRows]*float32
	if M <= s.maxMR8 {
		for i := 0; i < M; i++ {
			a[i] = row(i)
		}
		step := max(8, blockRows(K, down.DType))
		var lane laneAcc
		var b [4]*byte
		var acc [4 * maxKernelRows]float32
		for nb := n0; nb < n1; nb += step {
			ne := min(nb+step, n1)
			n := down8(s, out, &a, M, K, down, bias, scale, 0, kMain, nb, ne)
			for ; n < ne; n += 4 {
				cols := min(4, ne-n)
				for j := range b {
					b[j] = down.rowPtr(n + min(j, cols-1))
				}
				kern[M](&a, &b, kMain, &lane, 2, &acc)
				downTail(out, hidden, &a, M, K, kMain, down, bias, scale, 0, n, cols, &acc)
			}
		}
		return
	}
	sc := stripPool.Get().(*stripScratch)
	defer stripPool.Put(sc)
	sc.grow((n1 - n0 + 3) / 4)
	for c := range sc.b {
		n := n0 + 4*c
		cols := min(4, n1-n)
		for j := range sc.b[c] {
			sc.b[c][j] = down.rowPtr(n + min(j, cols-1))
		}
	}
	for m0, mr := 0, 0; m0 < M; m0 += mr {
		mr = s.stripRows(M, m0)
		for i := 0; i < mr; i++ {
			a[i] = row(m0 + i)
		}
		s.strip(kern[mr], &a, mr, kMain, down.DType.Size(), sc)
		for c := range sc.out {
			n := n0 + 4*c
			downTail(out[m0*hidden:], hidden, &a, mr, K, kMain, down, bias, scale, m0, n, min(4, n1-n), &sc.out[c])
		}
	}
}

// downTail adds the k tail to one kernel call's dot products (columns
// n … n+cols-1 of rows a[:mr], rows r0… of the call) and writes them,
// scaled, into out [mr, hidden].
func downTail(out []float32, hidden int, a *[maxKernelRows]*float32, mr, K, kMain int, down Matrix, bias, scale []float32, r0, n, cols int, acc *[4 * maxKernelRows]float32) {
	if kMain == K && bias == nil && scale == nil { // nothing to add: the sums as they are
		for i := 0; i < mr; i++ {
			copy(out[i*hidden+n:i*hidden+n+cols], acc[4*i:4*i+cols])
		}
		return
	}
	for i := 0; i < mr; i++ {
		o := acc[4*i : 4*i+4]
		if kMain < K {
			hr := unsafe.Slice(a[i], K)
			for j := 0; j < cols; j++ {
				for k := kMain; k < K; k++ {
					o[j] += float32(hr[k] * down.At(n+j, k))
				}
			}
		}
		for j := 0; j < cols; j++ {
			out[i*hidden+n+j] = biased(o[j], bias, n+j, scale, r0+i)
		}
	}
}

// gateUp8 does columns of gateUpSIMD for mr ≤ maxMR8 rows a, four columns
// (eight weight rows) per kernel call; h holds the rows' outputs [mr,
// inter]. It returns the first column it did not do.
func gateUp8(s *simd, h []float32, inter int, a *[maxKernelRows]*float32, mr, K int, gate, up Matrix, ep *glu, r0, kMain, n, ne int) int {
	var b, next [8]*byte
	var out [8 * maxKernelRows]float32
	kern := s.kern8[gate.DType][mr]
	for ; n+4 <= ne; n += 4 {
		for j := 0; j < 4; j++ {
			b[j], b[4+j] = gate.rowPtr(n+j), up.rowPtr(n+j)
			nj := min(n+4+j, gate.Rows-1) // the next call's rows (or the last row)
			next[j], next[4+j] = gate.rowPtr(nj), up.rowPtr(nj)
		}
		kern(a, &b, &next, kMain, &out)
		for i := 0; i < mr; i++ {
			o := out[8*i : 8*i+8]
			if kMain < K {
				xr := unsafe.Slice(a[i], K)
				for k := kMain; k < K; k++ {
					for j := 0; j < 4; j++ {
						o[j] += float32(xr[k] * gate.At(n+j, k))
						o[4+j] += float32(xr[k] * up.At(n+j, k))
					}
				}
			}
			for j := 0; j < 4; j++ {
				h[i*inter+n+j] = ep.apply(o[j], o[4+j], r0+i, n+j)
			}
		}
	}
	return n
}

// down8 does columns of downSIMD for mr ≤ maxMR8 rows a (rows r0… of the
// call), eight weight rows per kernel call; out holds the rows' outputs
// [mr, hidden]. It returns the first column it did not do.
func down8(s *simd, out []float32, a *[maxKernelRows]*float32, mr, K int, down Matrix, bias, scale []float32, r0, kMain, n, ne int) int {
	var b, next [8]*byte
	var acc [8 * maxKernelRows]float32
	kern := s.kern8[down.DType][mr]
	hidden := down.Rows
	for ; n+8 <= ne; n += 8 {
		for j := range b {
			b[j] = down.rowPtr(n + j)
			next[j] = down.rowPtr(min(n+8+j, hidden-1))
		}
		kern(a, &b, &next, kMain, &acc)
		for i := 0; i < mr; i++ {
			o := acc[8*i : 8*i+8]
			if kMain < K {
				hr := unsafe.Slice(a[i], K)
				for j := 0; j < 8; j++ {
					for k := kMain; k < K; k++ {
						o[j] += float32(hr[k] * down.At(n+j, k))
					}
				}
			}
			for j := 0; j < 8; j++ {
				out[i*hidden+n+j] = biased(o[j], bias, n+j, scale, r0+i)
			}
		}
	}
	return n
}
