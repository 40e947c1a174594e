package kernels

import "unsafe"

// The SIMD drivers walk a projection in blocks of weight rows sized to
// stay in L2, and within a block in micro-tiles of maxMR activation rows ×
// 4 weight rows, each computed by one assembly kernel call. Activation rows
// are read in place through their token index (no gather copy) and weights
// in their stored dtype (no packing): the kernels widen them in registers.
// A row's result depends only on its own data: the k order is fixed by the
// kernel's lanes, whatever the tile or the batch. The k % lanes tail is
// added after the lane reduction, one rounded product at a time.

// blockRows is the number of weight rows of one L2 block: half of L2 for
// weights, the rest for activations and outputs.
func blockRows(k int, dtype DType) int {
	return max(4, l2Bytes/2/max(1, k*dtype.Size()))
}

// gateUpSIMD is GateUp on the active SIMD implementation.
func gateUpSIMD(s *simd, h, x []float32, idx []int32, gate, up Matrix, n0, n1 int) {
	K, inter := gate.Cols, gate.Rows
	M := len(idx)
	if K == 0 {
		for r := 0; r < M; r++ {
			for n := n0; n < n1; n++ {
				h[r*inter+n] = SwiGLU(0, 0)
			}
		}
		return
	}
	kMain := K - K%s.lanes
	kern := &s.kern[gate.DType]
	var a [maxKernelRows]*float32
	var b [4]*byte
	var out [4 * maxKernelRows]float32
	step := max(2, blockRows(K, gate.DType)/2) // two weight rows (gate, up) per column
	for nb := n0; nb < n1; nb += step {
		ne := min(nb+step, n1)
		for m0 := 0; m0 < M; m0 += s.maxMR {
			mr := min(s.maxMR, M-m0)
			for i := 0; i < mr; i++ {
				a[i] = &x[int(idx[m0+i])*K]
			}
			n := nb
			if mr <= s.maxMR8 {
				// Few rows: eight weight streams per call, four columns.
				n = gateUp8(s, h[m0*inter:], inter, &a, mr, K, gate, up, kMain, nb, ne)
			}
			for ; n < ne; n += 2 {
				n2 := min(n+1, ne-1)
				b = [4]*byte{gate.rowPtr(n), gate.rowPtr(n2), up.rowPtr(n), up.rowPtr(n2)}
				kern[mr](&a, &b, kMain, &out)
				if kMain < K {
					for i := 0; i < mr; i++ {
						xr := x[int(idx[m0+i])*K:][:K]
						for k := kMain; k < K; k++ {
							out[4*i] += float32(xr[k] * gate.At(n, k))
							out[4*i+1] += float32(xr[k] * gate.At(n2, k))
							out[4*i+2] += float32(xr[k] * up.At(n, k))
							out[4*i+3] += float32(xr[k] * up.At(n2, k))
						}
					}
				}
				for i := 0; i < mr; i++ {
					row := h[(m0+i)*inter:]
					row[n] = SwiGLU(out[4*i], out[4*i+2])
					row[n2] = SwiGLU(out[4*i+1], out[4*i+3])
				}
			}
		}
	}
}

// downSIMD is Down on the active SIMD implementation; with idx non-nil,
// row r of h is h[idx[r]] and there are len(idx) rows.
func downSIMD(s *simd, out, h []float32, idx []int32, down Matrix, scale []float32, n0, n1 int) {
	hidden, K := down.Rows, down.Cols
	if K == 0 {
		for r := 0; r < len(out)/max(hidden, 1); r++ {
			for n := n0; n < n1; n++ {
				out[r*hidden+n] = 0
			}
		}
		return
	}
	M := len(h) / K
	row := func(r int) []float32 { return h[r*K : (r+1)*K] }
	if idx != nil {
		M = len(idx)
		row = func(r int) []float32 { return h[int(idx[r])*K:][:K] }
	}
	kMain := K - K%s.lanes
	kern := &s.kern[down.DType]
	var a [maxKernelRows]*float32
	var b [4]*byte
	var acc [4 * maxKernelRows]float32
	step := max(4, blockRows(K, down.DType))
	for nb := n0; nb < n1; nb += step {
		ne := min(nb+step, n1)
		for m0 := 0; m0 < M; m0 += s.maxMR {
			mr := min(s.maxMR, M-m0)
			for i := 0; i < mr; i++ {
				a[i] = &row(m0 + i)[0]
			}
			n := nb
			if mr <= s.maxMR8 {
				n = down8(s, out[m0*hidden:], &a, mr, K, down, scale, m0, kMain, nb, ne)
			}
			for ; n < ne; n += 4 {
				cols := min(4, ne-n)
				for j := range b {
					b[j] = down.rowPtr(n + min(j, cols-1))
				}
				kern[mr](&a, &b, kMain, &acc)
				if kMain < K {
					for i := 0; i < mr; i++ {
						hr := row(m0 + i)
						for j := 0; j < cols; j++ {
							for k := kMain; k < K; k++ {
								acc[4*i+j] += float32(hr[k] * down.At(n+j, k))
							}
						}
					}
				}
				for i := 0; i < mr; i++ {
					r := m0 + i
					for j := 0; j < cols; j++ {
						out[r*hidden+n+j] = scaled(acc[4*i+j], scale, r)
					}
				}
			}
		}
	}
}

// gateUp8 does columns of gateUpSIMD for mr ≤ maxMR8 rows a, four columns
// (eight weight rows) per kernel call; h holds the rows' outputs [mr,
// inter]. It returns the first column it did not do.
func gateUp8(s *simd, h []float32, inter int, a *[maxKernelRows]*float32, mr, K int, gate, up Matrix, kMain, n, ne int) int {
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
				h[i*inter+n+j] = SwiGLU(o[j], o[4+j])
			}
		}
	}
	return n
}

// down8 does columns of downSIMD for mr ≤ maxMR8 rows a (rows r0… of the
// call), eight weight rows per kernel call; out holds the rows' outputs
// [mr, hidden]. It returns the first column it did not do.
func down8(s *simd, out []float32, a *[maxKernelRows]*float32, mr, K int, down Matrix, scale []float32, r0, kMain, n, ne int) int {
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
				out[i*hidden+n+j] = scaled(o[j], scale, r0+i)
			}
		}
	}
	return n
}
