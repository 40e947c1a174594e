package main

import (
	"math"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The gated activations (kernels/activation.go's gate): each column's
// gate and up products widened to float64, clamped, the exponential as
// gateExp computes it (the same clamps, rounding to nearest even, the
// reduction's and the polynomial's fused multiply-adds, the exact product
// by 2^n), the division and the product by the multiplier, rounded once
// to float32: the same bits as the Go loop. Min and max take their
// operands in the order that keeps a NaN as the Go comparisons keep it.

// gateTab holds the kernels' float64 constants, each in 8 lanes (64
// bytes): see gateConst.
var gateTab Mem

// The constants' places in gateTab.
const (
	gLo = iota // gateExp's clamps
	gHi
	gLog2E
	gLn2Hi
	gLn2Lo
	gMagic // 2^52 + 1023: n + 1023 in the low bits of n + gMagic
	gOne
	gCubic    // GELU's 0.044715
	gNegScale // −2·√(2/π)
	gCoef     // 1/i!, i = 0…11, from here
	gCount    = gCoef + 12
)

func gateConst(i int) Mem { return gateTab.Offset(64 * i) }

// gateConsts emits gateTab (once, before the kernels).
func gateConsts() {
	gateTab = GLOBL("gateConsts", RODATA|NOPTR)
	vals := make([]float64, gCount)
	vals[gLo], vals[gHi] = -64, 710
	vals[gLog2E] = math.Log2E
	vals[gLn2Hi], vals[gLn2Lo] = 6.93147180369123816490e-01, 1.90821492927058770002e-10
	vals[gMagic] = 1<<52 + 1023
	vals[gOne] = 1
	vals[gCubic] = 0.044715
	vals[gNegScale] = -(2 * math.Sqrt(2/math.Pi))
	f := 1.0
	for i := range 12 {
		if i > 1 {
			f *= float64(i)
		}
		vals[gCoef+i] = 1 / f // i! is exact in float64 for i ≤ 11
	}
	for i, v := range vals {
		for l := range 8 {
			DATA(64*i+8*l, U64(math.Float64bits(v)))
		}
	}
}

// gateKernel emits gate<ISA>[GELU]: lanes float64 lanes a vector (8 on
// AVX-512, 4 on AVX2), one vector of columns a step.
func gateKernel(avx2, gelu bool) {
	name, vec, lanes := "gateAVX512", ZMM, 8
	if avx2 {
		name, vec, lanes = "gateAVX2", YMM, 4
	}
	if gelu {
		name += "GELU"
	}
	TEXT(name, NOSPLIT, "func(h, gt, up *float32, n int, p *[5]float64)")
	Pragma("noescape")
	doc := " writes h[i] = float32(g·σ(−nalpha·g)·m) for g = gt[i], m = up[i] + c, i in [0, n) (n a multiple of 8), clamped as p says (nalpha, limit, ulimit, −ulimit, c): kernels' gate.row."
	if gelu {
		doc = " writes h[i] = float32(g·σ(2z)·u) for g = gt[i], u = up[i], GELU's z, i in [0, n) (n a multiple of 8; p unread): kernels' gate.row."
	}
	Doc(name + doc)
	h := Load(Param("h"), GP64())
	g := Load(Param("gt"), GP64())
	u := Load(Param("up"), GP64())
	n := Load(Param("n"), GP64())
	p := Load(Param("p"), GP64())
	var nalpha, limit, ulimit, nulimit, c VecVirtual
	if !gelu {
		nalpha, limit, ulimit, nulimit, c = vec(), vec(), vec(), vec(), vec()
		for i, r := range []VecVirtual{nalpha, limit, ulimit, nulimit, c} {
			VBROADCASTSD(Mem{Base: p, Disp: 8 * i}, r)
		}
	}
	Label(name + "_loop")
	CMPQ(n, U8(lanes))
	JL(LabelRef(name + "_done"))
	gv, uv, x := vec(), vec(), vec()
	VCVTPS2PD(Mem{Base: g}, gv)
	VCVTPS2PD(Mem{Base: u}, uv)
	if gelu {
		a := vec()
		VMULPD(gateConst(gCubic), gv, a)
		VMULPD(gv, a, a)
		VMULPD(gv, a, a)
		VADDPD(a, gv, a)
		VMULPD(gateConst(gNegScale), a, x)
	} else {
		VMINPD(gv, limit, gv) // limit < g ? limit : g
		VMINPD(uv, ulimit, uv)
		VMAXPD(uv, nulimit, uv) // −ulimit > u ? −ulimit : u
		VMULPD(nalpha, gv, x)
	}
	e := emitExp(avx2, vec, x)
	VADDPD(gateConst(gOne), e, e)
	VDIVPD(e, gv, gv) // g/(1 + e^x)
	if !gelu {
		VADDPD(c, uv, uv)
	}
	VMULPD(uv, gv, gv)
	if avx2 {
		o := XMM()
		VCVTPD2PSY(gv, o)
		VMOVUPS(o, Mem{Base: h})
	} else {
		o := YMM()
		VCVTPD2PS(gv, o)
		VMOVUPS(o, Mem{Base: h})
	}
	for _, r := range []Op{h, g, u} {
		ADDQ(U8(4*lanes), r)
	}
	SUBQ(U8(lanes), n)
	JMP(LabelRef(name + "_loop"))
	Label(name + "_done")
	VZEROUPPER()
	RET()
}

// emitExp emits e^x as gateExp computes it (x > lo ? x : lo, then
// x < hi ? x : hi; the reduction's and the polynomial's fused
// multiply-adds; the exact product by 2^n) and returns the register that
// holds it; x is overwritten.
func emitExp(avx2 bool, vec func() VecVirtual, x VecVirtual) VecVirtual {
	VMAXPD(gateConst(gLo), x, x)
	VMINPD(gateConst(gHi), x, x)
	nf := vec()
	VMULPD(gateConst(gLog2E), x, nf)
	if avx2 {
		VROUNDPD(U8(0), nf, nf)
	} else {
		VRNDSCALEPD(U8(0), nf, nf)
	}
	VFNMADD231PD(gateConst(gLn2Hi), nf, x) // r = x − n·ln2Hi, fused
	VFNMADD231PD(gateConst(gLn2Lo), nf, x)
	e := vec()
	VMOVUPD(gateConst(gCoef+11), e)
	for i := 10; i >= 0; i-- {
		VFMADD213PD(gateConst(gCoef+i), x, e) // e = e·r + 1/i!
	}
	VADDPD(gateConst(gMagic), nf, nf)
	VPSLLQ(U8(52), nf, nf) // 2^n
	VMULPD(nf, e, e)
	return e
}

// expShiftedKernel emits expShifted<ISA>: dst[i] = e^(float64(src[i])·p[0]
// − p[1]) for i in [0, n) (n a multiple of the lanes: 8 on AVX-512, 4 on
// AVX2), the product and the difference each rounded, the exponential as
// gateExp: kernels' ExpShifted (a softmax's numerators).
func expShiftedKernel(avx2 bool) {
	name, vec, lanes := "expShiftedAVX512", ZMM, 8
	if avx2 {
		name, vec, lanes = "expShiftedAVX2", YMM, 4
	}
	TEXT(name, NOSPLIT, "func(dst *float64, src *float32, n int, p *[2]float64)")
	Pragma("noescape")
	Doc(name + " writes dst[i] = gateExp(float64(src[i])·p[0] − p[1]) for i in [0, n), n a multiple of the lanes: kernels' ExpShifted.")
	d := Load(Param("dst"), GP64())
	src := Load(Param("src"), GP64())
	n := Load(Param("n"), GP64())
	p := Load(Param("p"), GP64())
	scale, shift := vec(), vec()
	VBROADCASTSD(Mem{Base: p}, scale)
	VBROADCASTSD(Mem{Base: p, Disp: 8}, shift)
	Label(name + "_loop")
	CMPQ(n, U8(lanes))
	JL(LabelRef(name + "_done"))
	x := vec()
	VCVTPS2PD(Mem{Base: src}, x)
	VMULPD(scale, x, x)
	VSUBPD(shift, x, x)
	e := emitExp(avx2, vec, x)
	VMOVUPD(e, Mem{Base: d})
	ADDQ(U8(4*lanes), src)
	ADDQ(U8(8*lanes), d)
	SUBQ(U8(lanes), n)
	JMP(LabelRef(name + "_loop"))
	Label(name + "_done")
	VZEROUPPER()
	RET()
}

// gateKernels emits the four gate kernels and the two expShifted ones.
func gateKernels() {
	gateConsts()
	for _, avx2 := range []bool{true, false} {
		for _, gelu := range []bool{false, true} {
			gateKernel(avx2, gelu)
		}
	}
	for _, avx2 := range []bool{true, false} {
		expShiftedKernel(avx2)
	}
}
