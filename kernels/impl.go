package kernels

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/klauspost/cpuid/v2"
)

// An implementation of the dot-product kernels: generic Go (always there)
// or a SIMD one registered by the architecture's files when the CPU has
// the instructions.
type simd struct {
	// routerDot adds the router logits' products into their 32 partial
	// sums (see routerDot); nil: the generic loop.
	routerDot func(x, w *float32, n int, part *[32]float64)
	name      string
	lanes     int // vector width in fp32 lanes; k runs in steps of it
	maxMR     int // most activation rows per kernel call
	// kern[dtype][mr] computes the mr×4 dot products; see _asm/dot.go.
	kern [F16 + 1][maxKernelRows + 1]kernelFunc
	// kern8[dtype][mr] computes mr ≤ maxMR8 rows against 8 weight rows:
	// more weight streams in flight for the memory-bound decode case.
	kern8  [F16 + 1][maxKernelRows + 1]kernel8Func
	maxMR8 int
	// outer holds the outer-product kernels for packed weights; outerFP8
	// those for packed FP8 weights.
	outer    outerTable
	outerFP8 outerFP8Table
	// outerQ4 holds those for packed 4-bit weights (MXFP4, INT4), outerQ4P
	// those for MXFP4 on rows pow2Exact allows; empty where s has none.
	outerQ4, outerQ4P outerQ4Table
	// outerQ8 and outerQ8M hold those for packed INT8 weights without and
	// with offsets, outerQ4M those for packed 4-bit weights with offsets.
	outerQ8, outerQ8M, outerQ4M outerQTable
	// outerS5, outerU5M and outerS6 hold those for packed INT8 codes of 5
	// and 6 bits (see Pack), dqS5, dqU5M and dqS6 their widening (nil
	// where the implementation has none).
	outerS5, outerU5M, outerS6 outerQTable
	// kscale and kscaleM make the exact kernels' scales (and offsets)
	// from K-quant factors (see kscales); nil: the Go loop.
	kscale, kscaleM func(s, o *float32, base, fac *byte, lane, left, per, groups, ss int)
	// half widens runs of fp16 scales to fp32, e8 makes runs of E8M0
	// exponents into their fp32 scales (see kscales); nil: a Go loop.
	half func(dst *float32, src *uint16, runs, n, ss, ds int)
	e8   func(dst *float32, src *uint8, runs, n, ss, ds int)
	// bf16 widens runs of bf16 values to fp32 (an attention cache's
	// rows); nil: a Go loop.
	bf16 func(dst *float32, src *uint16, runs, n, ss, ds int)
	// prefetch asks for the lines of runs of n bytes, ss apart, to be
	// brought into the caches; nil: none.
	prefetch func(src *byte, runs, n, ss int)
	// attnScores[dtype][d] and attnWeigh[dtype][d][rows/8] read an
	// attention cache's keys and values in place (see attention.go), d
	// indexing attnDims; nil where the implementation has none.
	attnScores [F16 + 1][len(attnDims)]attnScoresFunc
	attnWeigh  [F16 + 1][len(attnDims)][2]attnWeighFunc
	// maxMin writes the lane maxima, minima and finiteness sums of a
	// multiple of 16 values (see MaxMin); nil: the Go loop.
	maxMin            func(x *float32, n int, out *[48]float32)
	dqS5, dqU5M, dqS6 func(dst *float32, b *byte, k int, s, o *float32)
	// dqFP8, dqQ4, dqQ8, dqQ8M and dqQ4M widen k steps of one quantized
	// panel into fp32 (see outerGEMMWiden); nil where the implementation
	// has none.
	dqFP8       func(dst *float32, b *byte, k int, s *float32)
	dqQ4        func(dst *float32, b *byte, k int, s, t *float32)
	dqQ8, dqQ8M func(dst *float32, b *byte, k int, s, o *float32)
	dqQ4M       func(dst *float32, b *byte, k int, s, t, o *float32)
	// dot8 holds the int8-dot kernels (see PackInt8Dot); nil where the
	// implementation has none.
	dot8 *dot8Kernels
	// quant8 quantizes blocks of 32 activations for the int8-dot mode
	// (see quantizeRow), by group size (8, 16, 32); nil: the Go loop.
	quant8 [dot8Block + 1]func(out *byte, x *float32, blocks int)
	// gate and gateGELU write n (a multiple of gateStep) columns of a
	// gated activation (see gate): σ's argument −nalpha·g, or GELU's;
	// nil: the Go loop.
	gate, gateGELU gateFunc
	// expShifted writes e^(x·scale − shift) of n (a multiple of its lanes)
	// values (see ExpShifted); expLanes is its lanes.
	expShifted func(dst *float64, src *float32, n int, p *[2]float64)
	expLanes   int
	// bdot holds the bf16-dot kernels (see PackBF16Dot); nil where the
	// implementation has none.
	bdot *bdotTable
}

// gateFunc is a gated activation's kernel: h[i] = act(g[i], u[i]) for i
// in [0, n), with p the gate's nalpha, limit, ulimit, −ulimit and c.
type gateFunc func(h, g, u *float32, n int, p *[5]float64)

// runs says whether s has kernels for m: every fp32, bf16 and fp16 matrix;
// a quantized one when it is packed, its scales allow the kernels'
// widening and s has kernels for its dtype. Others take the generic path.
func (s *simd) runs(m Matrix) bool {
	switch m.DType {
	case F8E4M3:
		return m.packed && m.q.panel != nil && len(s.outerFP8[1]) > 1
	case MXFP4, INT4, UINT4, INT8:
		return m.packed && (m.q.panel != nil || m.q.kmeta != nil || m.q.e8 != nil || m.q.h16 != nil) && s.qWidest(m, 1) > 0
	}
	return true
}

// qTable is s's kernels for the packed INT8 matrix m or the 4-bit one
// with offsets, by rows and panel count; nil for the other 4-bit ones
// (outerQ4).
func (s *simd) qTable(m Matrix) *outerQTable {
	switch {
	case m.planes == 1 && m.bias != 0:
		return &s.outerS5
	case m.planes == 1:
		return &s.outerU5M
	case m.planes == 2:
		return &s.outerS6
	case m.DType == INT8 && m.q.hasOffsets():
		return &s.outerQ8M
	case m.DType == INT8:
		return &s.outerQ8
	case m.q.hasOffsets():
		return &s.outerQ4M
	}
	return nil
}

// qWidest is the widest panel count of s's kernels for mr rows of the
// packed 4- or 8-bit matrix m (below 1: none).
func (s *simd) qWidest(m Matrix, mr int) int {
	if t := s.qTable(m); t != nil {
		return len(t[mr]) - 1
	}
	return len(s.outerQ4[mr]) - 1
}

// widens says whether s widens m's panels (see outerGEMMWiden) rather
// than running its kernels when a call has many rows.
func (s *simd) widens(m Matrix) bool {
	if dq := s.dqNarrow(m); m.planes > 0 {
		return dq != nil
	}
	switch {
	case m.DType == F8E4M3:
		return s.dqFP8 != nil
	case m.DType == INT8 && m.q.hasOffsets():
		return s.dqQ8M != nil
	case m.DType == INT8:
		return s.dqQ8 != nil
	case m.q.hasOffsets():
		return s.dqQ4M != nil
	}
	return s.dqQ4 != nil
}

// dqNarrow is s's widening of the packed INT8 matrix m whose codes are
// held in 5 or 6 bits; nil for others, or where s has none.
func (s *simd) dqNarrow(m Matrix) func(dst *float32, b *byte, k int, s, o *float32) {
	switch {
	case m.planes == 1 && m.bias != 0:
		return s.dqS5
	case m.planes == 1:
		return s.dqU5M
	case m.planes == 2:
		return s.dqS6
	}
	return nil
}

// kernel8Func computes mr×8 dot products of fp32 rows a[:mr] with 8 weight
// rows b, prefetching the start of the rows in next; see _asm/dot.go.
type kernel8Func func(a *[maxKernelRows]*float32, b, next *[8]*byte, k int, out *[8 * maxKernelRows]float32)

// kernelFunc computes mr×4 dot products of fp32 rows a[:mr] with 4 weight
// rows b over k elements, k a multiple of the lane count, starting from the
// lanes in acc (flags bit 0) and reducing into out (flags bit 1) or storing
// the lanes back to acc; see _asm/dot.go.
type kernelFunc func(a *[maxKernelRows]*float32, b *[4]*byte, k int, acc *laneAcc, flags int, out *[4 * maxKernelRows]float32)

// maxKernelRows is the size of the row-pointer array of every kernel.
const maxKernelRows = 6

var (
	implMu   sync.Mutex
	simds    []*simd // registered and runnable, best last
	active   *simd   // nil: generic
	l2Bytes  = cacheOr(cpuid.CPU.Cache.L2, 1<<20)
	l1dBytes = cacheOr(cpuid.CPU.Cache.L1D, 32<<10)
)

func cacheOr(n, def int) int {
	if n <= 0 {
		return def
	}
	return n
}

// register adds a runnable SIMD implementation and makes it the active one
// (implementations register in increasing order of preference).
func register(s *simd) {
	simds = append(simds, s)
	active = s
}

// Implementations lists the kernel implementations this machine can run:
// "generic" first, then the SIMD ones, best last.
func Implementations() []string {
	implMu.Lock()
	defer implMu.Unlock()
	names := []string{"generic"}
	for _, s := range simds {
		names = append(names, s.name)
	}
	return names
}

// Implementation returns the name of the implementation in use.
func Implementation() string {
	implMu.Lock()
	defer implMu.Unlock()
	if active == nil {
		return "generic"
	}
	return active.name
}

// Use makes the named implementation ("generic", "avx2", "avx512", or
// "auto" for the best available) the one every kernel call uses, and
// returns a function that restores the previous one. It is for tests and
// benchmarks: switching while kernels run is not safe.
func Use(name string) (restore func(), err error) {
	implMu.Lock()
	defer implMu.Unlock()
	prev := active
	restore = func() {
		implMu.Lock()
		active = prev
		implMu.Unlock()
	}
	switch name {
	case "generic":
		active = nil
		return restore, nil
	case "auto":
		active = nil
		if len(simds) > 0 {
			active = simds[len(simds)-1]
		}
		return restore, nil
	}
	for _, s := range simds {
		if s.name == name {
			active = s
			return restore, nil
		}
	}
	return func() {}, fmt.Errorf("kernels: implementation %q is not available on this machine (have %v)", name, namesLocked())
}

func namesLocked() []string {
	names := []string{"generic"}
	for _, s := range simds {
		names = append(names, s.name)
	}
	return names
}

// rowPtr points at the first element of row n; m.Cols must be positive.
func (m Matrix) rowPtr(n int) *byte {
	switch m.DType {
	case F32:
		return (*byte)(unsafe.Pointer(&m.f32[n*m.Cols]))
	case F8E4M3:
		return &m.u8[n*m.Cols]
	}
	return (*byte)(unsafe.Pointer(&m.u16[n*m.Cols]))
}
