package kernels

// GateUp computes the first projection of a SwiGLU expert for the rows that
// idx gathers from x, fused with its activation:
//
//	h[r, n] = silu(x[idx[r]] · gate[n]) · (x[idx[r]] · up[n])   for n in [n0, n1)
//
// x is [tokens, hidden], gate and up are [inter, hidden], h is [len(idx), inter].
// Only columns [n0, n1) of h are written, so that callers can split the work
// into column tiles. Shapes are the caller's contract (checked by the layer).
func GateUp(h, x []float32, idx []int32, gate, up Matrix, n0, n1 int) {
	gateUp(h, x, nil, nil, idx, gate, up, nil, n0, n1)
}

// gateUp is GateUp with the magnitude ranges of x's rows and its rows
// quantized for the int8-dot mode, each nil when not at hand.
func gateUp(h, x []float32, xr []magRange, xq *dot8Rows, idx []int32, gate, up Matrix, ep *glu, n0, n1 int) {
	if gate.dot8 || up.dot8 || gate.bdot || up.bdot {
		gateUpDot(h, x, xq, idx, gate, up, ep, n0, n1)
		return
	}
	if s := active; s != nil && s.runs(gate) && s.runs(up) && gate.packed == up.packed {
		if gate.packed && gate.Cols > 0 && n0 < n1 && len(idx) > 0 {
			gateUpOuter(s, h, x, xr, idx, gate, up, ep, n0, n1)
			return
		}
		gateUpSIMD(s, h, x, idx, gate, up, ep, n0, n1)
		return
	}
	gateUpGeneric(h, x, idx, gate, up, ep, n0, n1)
}

// Down computes the second projection of an expert, scaled by each row's
// routing weight:
//
//	out[r, n] = scale[r] · (h[r] · down[n])   for n in [n0, n1)
//
// h is [rows, inter], down is [hidden, inter], out is [rows, hidden];
// scale is [rows], or nil for a weight of one.
func Down(out, h []float32, down Matrix, scale []float32, n0, n1 int) {
	gemmRows(out, h, nil, nil, nil, down, nil, scale, n0, n1)
}

// gemmRows is GEMMRows (Down with idx nil) with the magnitude ranges of
// a's rows, or nil.
func gemmRows(out, a []float32, ar []magRange, aq *dot8Rows, idx []int32, b Matrix, bias, scale []float32, n0, n1 int) {
	if b.dot8 || b.bdot {
		downDot(out, a, aq, idx, b, bias, scale, n0, n1)
		return
	}
	if s := active; s != nil && s.runs(b) {
		if b.packed && b.Cols > 0 && n0 < n1 {
			downOuter(s, out, a, ar, idx, b, bias, scale, n0, n1)
			return
		}
		downSIMD(s, out, a, idx, b, bias, scale, n0, n1)
		return
	}
	downGeneric(out, a, idx, b, bias, scale, n0, n1)
}

// RouterLogits computes dst[t, e] = x[t] · w[e] with float64 accumulation,
// x [tokens, hidden], w [experts, hidden], dst [tokens, experts]. Routing
// decisions are discrete; the wider accumulator keeps near ties where an
// exact computation would put them.
func RouterLogits(dst []float64, x []float32, w Matrix) {
	routerLogitsGeneric(dst, x, w, 0, w.Rows)
}

// RouterLogitsExperts is RouterLogits for experts [e0, e1) alone: it
// writes dst[t, e] for those e (dst [tokens, experts] all the same), the
// bits RouterLogits gives them.
func RouterLogitsExperts(dst []float64, x []float32, w Matrix, e0, e1 int) {
	routerLogitsGeneric(dst, x, w, e0, e1)
}

// GEMMRows computes out[r, n] = scale[r] · (a[idx[r]] · b[n]) for n in
// [n0, n1): Down over rows of a [tokens, k] gathered in place through idx.
func GEMMRows(out, a []float32, idx []int32, b Matrix, scale []float32, n0, n1 int) {
	gemmRows(out, a, nil, nil, idx, b, nil, scale, n0, n1) // idx nil: every row of a
}
