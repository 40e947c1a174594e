package kernels

// Every dot product below runs over k in ascending order with one fp32
// accumulator; the explicit float32 conversion of each product stops the
// compiler from fusing multiply and add on targets where it may, so the
// bits are the same on every architecture and for any batch.

// gateUpGeneric is the reference for GateUp.
func gateUpGeneric(h, x []float32, idx []int32, gate, up Matrix, ep *glu, n0, n1 int) {
	hidden, inter := gate.Cols, gate.Rows
	g := make([]float32, hidden)
	u := make([]float32, hidden)
	for n := n0; n < n1; n++ {
		gate.RowF32(n, g)
		up.RowF32(n, u)
		r := 0
		for ; r+4 <= len(idx); r += 4 {
			x0 := x[int(idx[r])*hidden:][:hidden]
			x1 := x[int(idx[r+1])*hidden:][:hidden]
			x2 := x[int(idx[r+2])*hidden:][:hidden]
			x3 := x[int(idx[r+3])*hidden:][:hidden]
			var g0, g1, g2, g3, u0, u1, u2, u3 float32
			for k, gk := range g {
				uk := u[k]
				g0 += float32(x0[k] * gk)
				g1 += float32(x1[k] * gk)
				g2 += float32(x2[k] * gk)
				g3 += float32(x3[k] * gk)
				u0 += float32(x0[k] * uk)
				u1 += float32(x1[k] * uk)
				u2 += float32(x2[k] * uk)
				u3 += float32(x3[k] * uk)
			}
			h[r*inter+n] = ep.apply(g0, u0, r, n)
			h[(r+1)*inter+n] = ep.apply(g1, u1, r+1, n)
			h[(r+2)*inter+n] = ep.apply(g2, u2, r+2, n)
			h[(r+3)*inter+n] = ep.apply(g3, u3, r+3, n)
		}
		for ; r < len(idx); r++ {
			xr := x[int(idx[r])*hidden:][:hidden]
			var gs, us float32
			for k, gk := range g {
				gs += float32(xr[k] * gk)
				us += float32(xr[k] * u[k])
			}
			h[r*inter+n] = ep.apply(gs, us, r, n)
		}
	}
}

// SwiGLU returns silu(g)·u = g/(1+e^−g)·u, computed in float64 (the
// exponential as gateExp defines it) and rounded once to float32.
func SwiGLU(g, u float32) float32 { return siluGate.apply(g, u) }

// downGeneric is the reference for Down and GEMMRows; with idx non-nil,
// row r of h is h[idx[r]].
func downGeneric(out, h []float32, idx []int32, down Matrix, bias, scale []float32, n0, n1 int) {
	hidden, inter := down.Rows, down.Cols
	rows := 0
	if inter > 0 {
		rows = len(h) / inter
	} else if hidden > 0 {
		rows = len(out) / hidden
	}
	row := func(r int) []float32 { return h[r*inter:][:inter] }
	if idx != nil {
		rows = len(idx)
		row = func(r int) []float32 { return h[int(idx[r])*inter:][:inter] }
	}
	w := make([]float32, inter)
	for n := n0; n < n1; n++ {
		down.RowF32(n, w)
		r := 0
		for ; r+4 <= rows; r += 4 {
			h0, h1, h2, h3 := row(r), row(r+1), row(r+2), row(r+3)
			var a0, a1, a2, a3 float32
			for k, wk := range w {
				a0 += float32(h0[k] * wk)
				a1 += float32(h1[k] * wk)
				a2 += float32(h2[k] * wk)
				a3 += float32(h3[k] * wk)
			}
			out[r*hidden+n] = biased(a0, bias, n, scale, r)
			out[(r+1)*hidden+n] = biased(a1, bias, n, scale, r+1)
			out[(r+2)*hidden+n] = biased(a2, bias, n, scale, r+2)
			out[(r+3)*hidden+n] = biased(a3, bias, n, scale, r+3)
		}
		for ; r < rows; r++ {
			hr := row(r)
			var a float32
			for k, wk := range w {
				a += float32(hr[k] * wk)
			}
			out[r*hidden+n] = biased(a, bias, n, scale, r)
		}
	}
}

// biased is a dot product's output: a plus bias[n] (none when bias is
// nil), times scale[r] (one when scale is nil), each rounded to fp32.
func biased(a float32, bias []float32, n int, scale []float32, r int) float32 {
	if bias != nil {
		a += bias[n]
	}
	if scale == nil {
		return a
	}
	return a * scale[r]
}

// routerLogitsGeneric is RouterLogits: a float64 dot product per token
// and expert (see routerDot).
func routerLogitsGeneric(dst []float64, x []float32, w Matrix, e0, e1 int) {
	experts, hidden := w.Rows, w.Cols
	if hidden == 0 {
		for t := 0; t < len(dst)/max(experts, 1); t++ {
			clear(dst[t*experts+e0 : t*experts+e1])
		}
		return
	}
	tokens := len(x) / hidden
	row := make([]float32, hidden)
	part := new([32]float64)
	for e := e0; e < e1; e++ {
		row := row
		if w.DType == F32 && !w.packed { // its rows as they are: no copy
			row = w.f32[e*hidden:][:hidden]
		} else {
			w.RowF32(e, row)
		}
		for t := 0; t < tokens; t++ {
			dst[t*experts+e] = routerDot(x[t*hidden:][:hidden], row, part)
		}
	}
}

// routerDot is Σ x[k]·w[k] in float64: each product exact, added into
// part[k mod 32] in ascending k (32 independent chains: a SIMD kernel's
// four accumulators of eight lanes on AVX-512, eight of four on AVX2),
// the 32 partial sums then folded in halves (part[j] += part[j+16], then
// 8, 4, 2, 1). The generic code and the kernels give the same bits.
func routerDot(x, w []float32, part *[32]float64) float64 {
	clear(part[:])
	n := 0
	if s := active; s != nil && s.routerDot != nil && len(x) >= 32 {
		n = len(x) &^ 31
		s.routerDot(&x[0], &w[0], n, part)
	}
	for k := n; k < len(x); k++ {
		part[k%32] += float64(x[k]) * float64(w[k]) // exact product; only the sum rounds
	}
	for h := 16; h > 0; h /= 2 {
		for j := range h {
			part[j] += part[j+h]
		}
	}
	return part[0]
}
