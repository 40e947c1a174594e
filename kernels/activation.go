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
		return SwiGLU(min(g, a.Limit), max(-a.Limit, min(u, a.Limit)))
	}
	return SwiGLU(g, u)
}

// GeGLUAct is gelu(g)·u with GELU's tanh approximation, in float64,
// rounded once to float32. It is computed as g·σ(2z) for z =
// √(2/π)·(g + 0.044715·g³), the same value as g/2·(1 + tanh z) (since
// (1 + tanh z)/2 = σ(2z)) at the cost of one exponential.
func GeGLUAct(g, u float32) float32 {
	x := float64(g)
	z := 2 * math.Sqrt(2/math.Pi) * (x + 0.044715*x*x*x)
	return float32(x / (1 + math.Exp(-z)) * float64(u))
}

// ClampedSwiGLUAct is gpt-oss's activation: g = min(g, limit), u =
// clamp(u, −limit, limit), g·σ(alpha·g)·(u + 1), in float64, rounded
// once to float32. (The gate has no lower clamp: so both Hugging Face
// and OpenAI's reference define it.)
func ClampedSwiGLUAct(g, u, alpha, limit float32) float32 {
	// Comparisons rather than math.Min/Max: the same values (a NaN stays
	// NaN either way), without their branches for signed zeros.
	if g > limit {
		g = limit
	}
	if u > limit {
		u = limit
	} else if u < -limit {
		u = -limit
	}
	gf := float64(g)
	return float32(gf / (1 + math.Exp(-float64(alpha)*gf)) * (float64(u) + 1))
}

// glu is a group's first-projection epilogue: the biases of the gate and
// up projections (nil: none) and the activation. A nil *glu is SwiGLU
// without biases, every family's but gpt-oss's.
type glu struct {
	act    Activation
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
	return &glu{act: g.Act, gb: g.GateBias, ub: g.UpBias}
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
	if e.in != nil {
		g, u = g*e.in[r], u*e.in[r]
	}
	if e.gb != nil {
		g += e.gb[n]
	}
	if e.ub != nil {
		u += e.ub[n]
	}
	return e.act.Apply(g, u)
}

// row is apply over a row r of columns [n0, n0+len(h)): h[n] from g[n]
// and u[n]; an activation without biases or input scales is looped over
// without apply's per-column branches.
func (e *glu) row(h, g, u []float32, r, n0 int) {
	if e.in == nil && e.gb == nil && e.ub == nil {
		switch e.act.Kind {
		case GeGLU:
			for n := range h {
				h[n] = GeGLUAct(g[n], u[n])
			}
			return
		case ClampedSiLU:
			l := e.act.Limit
			for n := range h {
				h[n] = SwiGLU(min(g[n], l), max(-l, min(u[n], l)))
			}
			return
		}
	}
	if e.in == nil && e.gb != nil && e.ub != nil && e.act.Kind == ClampedSwiGLU {
		// gpt-oss: both biases, no input scale; apply's sums without its
		// per-column branches.
		gb, ub := e.gb[n0:n0+len(h)], e.ub[n0:n0+len(h)]
		a, l := e.act.Alpha, e.act.Limit
		for n := range h {
			h[n] = ClampedSwiGLUAct(g[n]+gb[n], u[n]+ub[n], a, l)
		}
		return
	}
	for n := range h {
		h[n] = e.apply(g[n], u[n], r, n0+n)
	}
}
