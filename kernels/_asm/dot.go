//go:generate go run . -out ../simd_amd64.s -stubs ../simd_amd64_stubs.go -pkg kernels

// Command _asm generates the micro-kernels of package kernels with avo: the
// outer-product kernels on packed weights (outer.go), the Go table of them,
// and the register-blocked dot-product kernels on row-major weights: for an
// ISA (AVX2+FMA with 8 lanes, AVX-512 with 16), a weight dtype (F32, BF16,
// F16) and a row count MR, the kernel computes the MR×4 dot products of MR activation rows (fp32) with 4 weight
// rows (in their stored dtype, widened in registers) over k elements, k a
// multiple of the lane count:
//
//	out[m·4+n] = reduce(lanes of Σ_k a[m][k]·b[n][k])
//
// Each output has one vector accumulator; lane j sums k ≡ j (mod lanes) in
// ascending k with FMA, and the lanes are then added in a fixed tree. The
// order is the same for every MR, so a row's result never depends on the
// rows computed beside it. dot_ref_test.go in package kernels holds an exact
// emulation of this order.
//
// The four-row kernels also run a k range in blocks: flags bit 0 starts the
// accumulators from acc (one 64-byte slot per output) instead of zero, and
// without bit 1 they are stored back to acc instead of reduced into out.
// Lanes carried in memory between blocks keep the order exactly, so a
// blocked product has the bits of an unblocked one.
package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// maxMR is the size of the row-pointer array every kernel takes.
const maxMR = 6

// prefetchLines is how many 64-byte lines of each next weight row the
// eight-row kernels prefetch.
const prefetchLines = 4

type isa struct {
	name   string
	lanes  int
	maxMR  int // rows of the 4-column kernels
	maxMR8 int // rows of the 8-column kernels
	vec    func() VecVirtual
}

var isas = []isa{
	{"AVX2", 8, 3, 1, YMM},
	{"AVX512", 16, 6, 3, ZMM},
}

func main() {
	ConstraintExpr("amd64,!purego")
	for _, is := range isas {
		for _, dt := range []string{"F32", "BF16", "F16"} {
			for mr := 1; mr <= is.maxMR; mr++ {
				dot(is, dt, mr, 4)
			}
			// Few rows against eight weight rows: more weight streams in
			// flight for the memory-bound decode case.
			for mr := 1; mr <= is.maxMR8; mr++ {
				dot(is, dt, mr, 8)
			}
			outerKernels(is, dt)
		}
		outerKernels(is, "F8")
		outerKernels(is, "Q8")
		outerKernels(is, "Q8M")
		narrowKernels(is)
		kscalesKernels(is)
		if is.lanes == 8 {
			dot8AVX2Kernels()
			quant8AVX2Kernels()
			routerDotLoop(true)
			for _, offsets := range []bool{false, true} {
				for mr := 1; mr <= is.maxMR; mr++ {
					for np := 1; np <= outerQ4AVX2NP(mr, offsets); np++ {
						outerQ4AVX2(mr, np, offsets)
					}
				}
			}
		}
		if is.lanes == 16 {
			for _, v := range []struct{ pow2, offsets bool }{{false, false}, {true, false}, {false, true}} {
				for mr := 1; mr <= maxMR; mr++ {
					for np := 1; np <= outerQ4NP(mr); np++ {
						outerQ4(mr, np, v.pow2, v.offsets)
					}
				}
			}
			for _, dt := range []string{"F8", "Q4", "Q4M", "Q8", "Q8M"} {
				dequant(dt)
			}
			dot8Kernels()
			quant8Kernels()
			bdotKernels()
			attnKernels()
			readLoop()
			routerDotLoop(false)
		}
	}
	gateKernels()
	prefetchRuns()
	Generate()
	writeOuterTable("../outer_table_amd64.go")
}

func dot(is isa, dt string, mr, nr int) {
	name := fmt.Sprintf("dot%s%sx%d", is.name, dt, mr)
	sig := fmt.Sprintf("func(a *[%d]*float32, b *[4]*byte, k int, acc *[%d]float32, flags int, out *[%d]float32)", maxMR, 4*maxMR*16, 4*maxMR)
	if nr != 4 {
		name = fmt.Sprintf("dot%s%sx%dn%d", is.name, dt, mr, nr)
		sig = fmt.Sprintf("func(a *[%d]*float32, b *[%d]*byte, next *[%d]*byte, k int, out *[%d]float32)", maxMR, nr, nr, nr*maxMR)
	}
	TEXT(name, NOSPLIT, sig)
	Pragma("noescape")
	Doc(fmt.Sprintf("%s computes the %d×%d lane-ordered dot products of %d fp32 rows with %d %s rows; k is a multiple of %d.",
		name, mr, nr, mr, nr, dt, is.lanes))

	a := make([]GPVirtual, mr)
	aPtr := Load(Param("a"), GP64())
	for m := range a {
		a[m] = GP64()
		MOVQ(Mem{Base: aPtr, Disp: 8 * m}, a[m])
	}
	if nr == 8 {
		// Decode streams weights from memory: start the next call's rows
		// (given in next) now, so their first lines do not wait for the
		// hardware prefetcher to notice a new page.
		Comment("Prefetch the first lines of the next call's weight rows.")
		nextPtr := Load(Param("next"), GP64())
		for n := 0; n < nr; n++ {
			p := GP64()
			MOVQ(Mem{Base: nextPtr, Disp: 8 * n}, p)
			for line := 0; line < prefetchLines; line++ {
				PREFETCHT0(Mem{Base: p, Disp: 64 * line})
			}
		}
	}
	bPtr := Load(Param("b"), GP64())
	b := make([]GPVirtual, nr)
	for n := range b {
		b[n] = GP64()
		MOVQ(Mem{Base: bPtr, Disp: 8 * n}, b[n])
	}
	k := Load(Param("k"), GP64())
	i := GP64()
	XORQ(i, i)

	acc := make([][]VecVirtual, mr)
	for m := range acc {
		acc[m] = make([]VecVirtual, nr)
		for n := range acc[m] {
			acc[m][n] = is.vec()
		}
	}
	blocked := nr == 4
	if blocked {
		Comment("Start from the lanes carried in acc (flags bit 0), or from zero.")
		flags := Load(Param("flags"), GP64())
		TESTQ(U32(1), flags)
		JZ(LabelRef(name + "_zero"))
		accPtr := Load(Param("acc"), GP64())
		for m := range acc {
			for n := range acc[m] {
				VMOVUPS(Mem{Base: accPtr, Disp: 64 * (nr*m + n)}, acc[m][n])
			}
		}
		JMP(LabelRef(name + "_loop"))
		Label(name + "_zero")
	}
	for m := range acc {
		for n := range acc[m] {
			VXORPS(acc[m][n], acc[m][n], acc[m][n])
		}
	}

	Comment("Main loop: one vector of lanes per row per step.")
	Label(name + "_loop")
	CMPQ(i, k)
	JGE(LabelRef(name + "_reduce"))
	av := make([]VecVirtual, mr)
	for m := range av {
		av[m] = is.vec()
		VMOVUPS(Mem{Base: a[m], Index: i, Scale: 4}, av[m])
	}
	for n := range b {
		bv := is.vec()
		switch dt {
		case "F32":
			VMOVUPS(Mem{Base: b[n], Index: i, Scale: 4}, bv)
		case "BF16": // bf16 is the top half of an fp32: zero-extend, shift up
			VPMOVZXWD(Mem{Base: b[n], Index: i, Scale: 2}, bv)
			VPSLLD(U8(16), bv, bv)
		case "F16":
			VCVTPH2PS(Mem{Base: b[n], Index: i, Scale: 2}, bv)
		}
		for m := range av {
			VFMADD231PS(bv, av[m], acc[m][n])
		}
	}
	ADDQ(U32(is.lanes), i)
	JMP(LabelRef(name + "_loop"))

	Label(name + "_reduce")
	if blocked {
		Comment("Without flags bit 1, carry the lanes in acc to the next block.")
		flags := Load(Param("flags"), GP64())
		TESTQ(U32(2), flags)
		JNZ(LabelRef(name + "_sum"))
		accPtr := Load(Param("acc"), GP64())
		for m := range acc {
			for n := range acc[m] {
				VMOVUPS(acc[m][n], Mem{Base: accPtr, Disp: 64 * (nr*m + n)})
			}
		}
		VZEROUPPER()
		RET()
		Label(name + "_sum")
	}
	Comment("Reduce each accumulator: halves added until one lane is left.")
	out := Load(Param("out"), GP64())
	for m := range acc {
		for n := range acc[m] {
			v := acc[m][n]
			if is.lanes == 16 {
				// EVEX forms only: accumulators may live in Z16–Z31.
				t := ZMM()
				VSHUFF64X2(U8(0x4e), v, v, t) // swap 256-bit halves
				VADDPS(t, v, v)               // lane j + lane j+8
				VSHUFF64X2(U8(0xb1), v, v, t) // swap 128-bit lanes
				VADDPS(t, v, v)               // lane j + lane j+4
				VPERMILPS(U8(0x4e), v, t)     // swap 64-bit halves
				VADDPS(t, v, v)               // lane j + lane j+2
				VMOVSHDUP(v, t)
				VADDSS(t.AsX(), v.AsX(), v.AsX()) // lane 0 + lane 1
				VMOVSS(v.AsX(), Mem{Base: out, Disp: 4 * (nr*m + n)})
				continue
			}
			x, y := v.AsX(), v.AsY()
			hx := XMM()
			VEXTRACTF128(U8(1), y, hx)
			VADDPS(hx, x, x) // lane j + lane j+4
			t := XMM()
			VMOVHLPS(x, x, t)
			VADDPS(t, x, x) // lane j + lane j+2
			VMOVSHDUP(x, t)
			VADDSS(t, x, x) // lane 0 + lane 1
			VMOVSS(x, Mem{Base: out, Disp: 4 * (nr*m + n)})
		}
	}
	VZEROUPPER()
	RET()
}
