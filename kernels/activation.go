package kernels

import (
	"fmt"
	"math"
)

// ActKind is the gated activation of an expert's first projection.
type ActKind uint8

// Activations.
const (
	// SiLU is silu(g)·u, the SwiGLU of most families: the zero value.
	SiLU ActKind = iota
	// ClampedSwiGLU is gpt-oss's: g = min(g, Limit), u = clamp(u, −Limit,
	// Limit), h = g·σ(Alpha·g)·(u + 1).
	ClampedSwiGLU
	// GeGLU is gelu(g)·u with GELU's tanh approximation, gelu(g) =
	// g/2·(1 + tanh(√(2/π)·(g + 0.044715·g³))) (Gemma 4's
	// gelu_pytorch_tanh).
	GeGLU
	// ClampedSiLU is DeepSeek-V4's: g = min(g, Limit), u = clamp(u,
	// −Limit, Limit), h = silu(g)·u.
	ClampedSiLU
)

func (k ActKind) String() string {
	switch k {
	case SiLU:
		return "silu"
	case ClampedSwiGLU:
		return "clamped_swiglu"
	case GeGLU:
		return "geglu_tanh"
	case ClampedSiLU:
		return "clamped_silu"
	}
	return fmt.Sprintf("ActKind(%d)", uint8(k))
}

// Activation is an expert's gated activation with its constants.
type Activation struct {
	Kind         ActKind
	Alpha, Limit float32 // ClampedSwiGLU's; ClampedSiLU's Limit
}

// Validate checks the activation's constants: ClampedSwiGLU needs a
// positive finite limit and a finite alpha, ClampedSiLU a positive finite
// limit.
func (a Activation) Validate() error {
	switch a.Kind {
	case SiLU, GeGLU:
		return nil
	case ClampedSiLU:
		if !(a.Limit > 0) || math.IsInf(float64(a.Limit), 0) {
			return fmt.Errorf("kernels: clamped SiLU needs a positive finite limit, have %v", a.Limit)
		}
		return nil
	case ClampedSwiGLU:
		if !(a.Limit > 0) || math.IsInf(float64(a.Limit), 0) || math.IsNaN(float64(a.Alpha)) || math.IsInf(float64(a.Alpha), 0) {
			return fmt.Errorf("kernels: clamped SwiGLU needs a positive finite limit and a finite alpha, have limit %v, alpha %v", a.Limit, a.Alpha)
		}
		return nil
	}
	return fmt.Errorf("kernels: unknown activation %v", a.Kind)
}

// Apply is the activation of one column: its gate and up projections.
// Like SwiGLU it is computed in float64 and rounded once to float32.
func (a Activation) Apply(g, u float32) float32 {
	switch a.Kind {
	case ClampedSwiGLU:
		return ClampedSwiGLUAct(g, u, a.Alpha, a.Limit)
	case GeGLU:
		return GeGLUAct(g, u)
	case ClampedSiLU:
		return clampedSiLU(a.Limit).apply(g, u)
	}
	return SwiGLU(g, u)
}

// GeGLUAct is gelu(g)·u with GELU's tanh approximation, in float64,
// rounded once to float32. It is computed as g·σ(2z) for z =
// √(2/π)·(g + 0.044715·g³), the same value as g/2·(1 + tanh z) (since
// (1 + tanh z)/2 = σ(2z)) at the cost of one exponential.
func GeGLUAct(g, u float32) float32 { return geluGate.apply(g, u) }

// ClampedSwiGLUAct is gpt-oss's activation: g = min(g, limit), u =
// clamp(u, −limit, limit), g·σ(alpha·g)·(u + 1), in float64, rounded
// once to float32. (The gate has no lower clamp: so both Hugging Face
// and OpenAI's reference define it.)
func ClampedSwiGLUAct(g, u, alpha, limit float32) float32 {
	return clampedSwiGLU(alpha, limit).apply(g, u)
}

// The gated activations are computed, on every implementation and to the
// same bits, as float32(g·σ(t)·m) in float64: σ(t) = 1/(1 + gateExp(−t)),
// the gate g and its multiplier m = u + c (u, and c −0 or 1) clamped
// where the activation says, and t = −nalpha·g (SiLU's and gpt-oss's) or
// GELU's 2·√(2/π)·(g + 0.044715·g³). A NaN in g or u gives NaN.
type gate struct {
	// nalpha is −alpha; limit g's upper clamp and ulimit u's symmetric
	// one (+∞: none); c is added to u (−0 adds nothing, keeping −0).
	nalpha, limit, ulimit, c float64
	gelu                     bool       // t is GELU's (nalpha and the clamps unused)
	prm                      [5]float64 // the kernels': nalpha, limit, ulimit, −ulimit, c
}

var (
	siluGate = newGate(gate{nalpha: -1, limit: math.Inf(1), ulimit: math.Inf(1), c: math.Copysign(0, -1)})
	geluGate = newGate(gate{gelu: true, c: math.Copysign(0, -1)})
	// geluScale is 2·√(2/π), the GELU argument's factor in σ(2z).
	geluScale = 2 * math.Sqrt(2/math.Pi)
)

func clampedSiLU(limit float32) *gate {
	l := float64(limit)
	return newGate(gate{nalpha: -1, limit: l, ulimit: l, c: math.Copysign(0, -1)})
}

func clampedSwiGLU(alpha, limit float32) *gate {
	l := float64(limit)
	return newGate(gate{nalpha: -float64(alpha), limit: l, ulimit: l, c: 1})
}

// apply is the activation of one column. Every product is converted to
// float64 explicitly so that no compiler fuses it into an addition: the
// vector kernels round each operation as written here.
func (p *gate) apply(g, u float32) float32 {
	gf, m, x := p.args(g, u)
	return p.result(gf, m, gateExp(x))
}

// args returns a column's clamped gate, its multiplier m = u + c and the
// exponent x = −t.
func (p *gate) args(g, u float32) (gf, m, x float64) {
	gf, uf := float64(g), float64(u)
	if p.gelu {
		a := float64(0.044715 * gf)
		a = float64(a * gf)
		a = float64(a * gf)
		x = float64(-geluScale * (gf + a))
	} else {
		if p.limit < gf { // NaN kept
			gf = p.limit
		}
		if p.ulimit < uf {
			uf = p.ulimit
		}
		if -p.ulimit > uf {
			uf = -p.ulimit
		}
		x = float64(p.nalpha * gf)
	}
	return gf, uf + p.c, x
}

// result is a column's activation from its args and e^x.
func (p *gate) result(gf, m, e float64) float32 {
	v := gf / (1 + e)
	return float32(v * m)
}

// rowGo is apply over a row, four columns at a time: the same operations
// in four independent chains, which the CPU overlaps (the Go loop of an
// implementation without a kernel, arm64's say).
func (p *gate) rowGo(h, g, u []float32) {
	n := 0
	for ; n+4 <= len(h); n += 4 {
		g0, m0, x0 := p.args(g[n], u[n])
		g1, m1, x1 := p.args(g[n+1], u[n+1])
		g2, m2, x2 := p.args(g[n+2], u[n+2])
		g3, m3, x3 := p.args(g[n+3], u[n+3])
		e0, e1, e2, e3 := gateExp4(x0, x1, x2, x3)
		h[n], h[n+1], h[n+2], h[n+3] = p.result(g0, m0, e0), p.result(g1, m1, e1), p.result(g2, m2, e2), p.result(g3, m3, e3)
	}
	for ; n < len(h); n++ {
		h[n] = p.apply(g[n], u[n])
	}
}

// row is apply over a row: h[n] from g[n] and u[n], by s's kernel where
// it has one.
func (p *gate) row(h, g, u []float32) {
	g, u = g[:len(h)], u[:len(h)]
	n := 0
	if s := active; s != nil && s.gate != nil && len(h) >= gateStep {
		n = len(h) &^ (gateStep - 1)
		k := s.gate
		if p.gelu {
			k = s.gateGELU
		}
		k(&h[0], &g[0], &u[0], n, &p.prm)
	}
	p.rowGo(h[n:], g[n:], u[n:])
}

// gateStep is how many columns the vector kernels take a step.
const gateStep = 8

// newGate is a gate with its kernels' constants.
func newGate(g gate) *gate {
	g.prm = [5]float64{g.nalpha, g.limit, g.ulimit, -g.ulimit, g.c}
	return &g
}

// The exponential of the activations: e^x for x clamped to [expLo, expHi]
// (NaN to expLo), x = n·ln 2 + r with n = x·log2(e) rounded to nearest
// even and r reduced by fused multiply-adds of ln 2's two parts, e^r by
// its Taylor polynomial of degree 11 (Horner, fused multiply-adds) and
// the product by 2^n exact. Its relative error is below 1e-14, and it is
// the same function, bit for bit, in Go and in the kernels. Below expLo,
// 1 + e^x is 1. From x = 709.44 (n = 1024) it is +∞, as e^x overflows
// from 709.78 on: no activation's float32 result changes by it (its
// numerator is at most 2^256) but for an infinite u, which makes it NaN
// rather than ±∞, as it does for any larger x.
const (
	expLo = -64
	expHi = 710
	ln2Hi = 6.93147180369123816490e-01 // ln 2's high 32 bits
	ln2Lo = 1.90821492927058770002e-10 // ln 2 − ln2Hi
)

// expCoef is 1/i!, i = 0…11.
var expCoef = [12]float64{1, 1, 1.0 / 2, 1.0 / 6, 1.0 / 24, 1.0 / 120, 1.0 / 720, 1.0 / 5040, 1.0 / 40320, 1.0 / 362880, 1.0 / 3628800, 1.0 / 39916800}

// gateExp4 is gateExp of four exponents, their steps interleaved.
func gateExp4(x0, x1, x2, x3 float64) (float64, float64, float64, float64) {
	x0, x1, x2, x3 = expClamp(x0), expClamp(x1), expClamp(x2), expClamp(x3)
	n0, n1, n2, n3 := math.RoundToEven(x0*math.Log2E), math.RoundToEven(x1*math.Log2E), math.RoundToEven(x2*math.Log2E), math.RoundToEven(x3*math.Log2E)
	r0, r1, r2, r3 := math.FMA(-n0, ln2Hi, x0), math.FMA(-n1, ln2Hi, x1), math.FMA(-n2, ln2Hi, x2), math.FMA(-n3, ln2Hi, x3)
	r0, r1, r2, r3 = math.FMA(-n0, ln2Lo, r0), math.FMA(-n1, ln2Lo, r1), math.FMA(-n2, ln2Lo, r2), math.FMA(-n3, ln2Lo, r3)
	p0, p1, p2, p3 := expCoef[11], expCoef[11], expCoef[11], expCoef[11]
	for i := 10; i >= 0; i-- {
		c := expCoef[i]
		p0, p1, p2, p3 = math.FMA(p0, r0, c), math.FMA(p1, r1, c), math.FMA(p2, r2, c), math.FMA(p3, r3, c)
	}
	return expScale(p0, n0), expScale(p1, n1), expScale(p2, n2), expScale(p3, n3)
}

// expClamp is gateExp's clamp of x to [expLo, expHi], NaN to expLo.
func expClamp(x float64) float64 {
	if !(x > expLo) {
		x = expLo
	}
	if !(x < expHi) {
		x = expHi
	}
	return x
}

// expScale is p·2^n, exact.
func expScale(p, n float64) float64 {
	return float64(p * math.Float64frombits(uint64(int64(n)+1023)<<52))
}

// gateExp returns e^x as the activation kernels compute it (see expLo).
func gateExp(x float64) float64 {
	x = expClamp(x)
	n := math.RoundToEven(x * math.Log2E)
	r := math.FMA(-n, ln2Hi, x)
	r = math.FMA(-n, ln2Lo, r)
	p := expCoef[11]
	for i := 10; i >= 0; i-- {
		p = math.FMA(p, r, expCoef[i])
	}
	return expScale(p, n)
}

// ExpShifted writes dst[i] = e^(float64(src[i])·scale − shift) for every
// i < len(src), the product and the difference each rounded to float64,
// the exponential as the activation kernels compute it (within 1e-14 of
// math.Exp, relative; arguments below −64 give e^−64, above 710 e^710): a
// softmax's numerators, by SIMD where the machine has it, the same bits
// on every implementation.
func ExpShifted(dst []float64, src []float32, scale, shift float64) {
	dst = dst[:len(src)]
	i := 0
	if s := active; s != nil && s.expShifted != nil && len(src) >= s.expLanes {
		i = len(src) / s.expLanes * s.expLanes
		p := [2]float64{scale, shift}
		s.expShifted(&dst[0], &src[0], i, &p)
	}
	for ; i < len(src); i++ {
		dst[i] = gateExp(float64(float64(src[i])*scale) - shift) // rounded, never fused
	}
}

// glu is a group's first-projection epilogue: the biases of the gate and
// up projections (nil: none) and the activation. A nil *glu is SwiGLU
// without biases, every family's but gpt-oss's.
type glu struct {
	act    Activation
	gate   *gate     // act's
	gb, ub []float32 // [inter]
	// in [rows] scales each row's dot products (the rows of the tile
	// being computed): a routing weight on the expert's input (llama4),
	// expert(s·x) with projections linear in x.
	in []float32
}

// newGLU is the epilogue of g, nil when it is plain SwiGLU.
func newGLU(g *FFNGroup) *glu {
	if g.Act.Kind == SiLU && g.GateBias == nil && g.UpBias == nil && !g.ScaleInput {
		return nil
	}
	return &glu{act: g.Act, gate: gateOf(g.Act), gb: g.GateBias, ub: g.UpBias}
}

// tile is e for rows [r0, r1) of g: its input scales those rows'.
func (e *glu) tile(g *FFNGroup, r0, r1 int) *glu {
	if e == nil || !g.ScaleInput {
		return e
	}
	t := *e
	t.in = g.Scale[r0:r1]
	return &t
}

// apply is the activation of row r, column n from its gate and up dot
// products.
func (e *glu) apply(g, u float32, r, n int) float32 {
	if e == nil {
		return SwiGLU(g, u)
	}
	if e.in != nil { // rounded before the biases' sums, as in row
		g, u = float32(g*e.in[r]), float32(u*e.in[r])
	}
	if e.gb != nil {
		g += e.gb[n]
	}
	if e.ub != nil {
		u += e.ub[n]
	}
	return e.act.Apply(g, u)
}

// gateOf is the activation a as a gate.
func gateOf(a Activation) *gate {
	switch a.Kind {
	case GeGLU:
		return geluGate
	case ClampedSiLU:
		return clampedSiLU(a.Limit)
	case ClampedSwiGLU:
		return clampedSwiGLU(a.Alpha, a.Limit)
	}
	return siluGate
}

// row is apply over a row r of columns [n0, n0+len(h)): h[n] from g[n]
// and u[n]. It scales and biases g and u in place (apply's sums, in its
// order) and then takes the activation a row at a time.
func (e *glu) row(h, g, u []float32, r, n0 int) {
	g, u = g[:len(h)], u[:len(h)]
	if e.in != nil {
		s := e.in[r]
		for n := range h {
			g[n], u[n] = float32(g[n]*s), float32(u[n]*s)
		}
	}
	if e.gb != nil {
		for n, b := range e.gb[n0 : n0+len(h)] {
			g[n] += b
		}
	}
	if e.ub != nil {
		for n, b := range e.ub[n0 : n0+len(h)] {
			u[n] += b
		}
	}
	e.gate.row(h, g, u)
}

// NonFinite is the index of the first NaN or ±Inf in v, or -1: one
// subtraction a value (x − x is 0 for every finite x, NaN otherwise), a
// fraction of the time math.IsNaN and math.IsInf take on a step's full
// vocabulary of logits.
func NonFinite(v []float32) int {
	i := 0
	if s := active; s != nil && s.maxMin != nil { // runs of 1024 checked by SIMD, a bad one searched
		var out [48]float32
		for ; i+1024 <= len(v); i += 1024 {
			s.maxMin(&v[i], 1024, &out)
			var check float32
			for _, c := range out[32:] {
				check += c
			}
			if check != 0 {
				break
			}
		}
	}
	for ; i < len(v); i++ {
		if v[i]-v[i] != 0 {
			return i
		}
	}
	return -1
}
