package main

import (
	"bytes"
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	"github.com/mmcloughlin/avo/ir"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

// The bf16-dot kernels (AVX-512 BF16): a panel of bf16 weights holds a
// row's two k steps side by side (a 32-bit pair), sixteen rows a vector;
// each row's pair of activations (bf16) is broadcast, and vdpbf16ps adds
// both products to every lane's fp32 chain: the odd step's first, each
// addition rounded, inputs and results flushed to zero when subnormal
// (kernels/bf16dot.go defines the order the generic code reproduces).
// Neither avo nor the Go assembler knows vdpbf16ps, so these kernels use
// fixed registers and emit the instruction's EVEX bytes.

// maxBdotMR is the most activation rows of a bf16-dot kernel.
const maxBdotMR = 6

// bdotNP is the widest panel count for MR rows: the chains, a vector a
// panel and the broadcast in 32 registers.
func bdotNP(mr int) int {
	for np := 4; np > 1; np /= 2 {
		if mr*np+np+1 <= 32 {
			return np
		}
	}
	return 1
}

// zmmIndex is the number of a physical zmm register.
func zmmIndex(r reg.VecPhysical) int {
	for i, z := range []reg.VecPhysical{reg.Z0, reg.Z1, reg.Z2, reg.Z3, reg.Z4, reg.Z5, reg.Z6, reg.Z7, reg.Z8, reg.Z9, reg.Z10,
		reg.Z11, reg.Z12, reg.Z13, reg.Z14, reg.Z15, reg.Z16, reg.Z17, reg.Z18, reg.Z19, reg.Z20, reg.Z21, reg.Z22, reg.Z23,
		reg.Z24, reg.Z25, reg.Z26, reg.Z27, reg.Z28, reg.Z29, reg.Z30, reg.Z31} {
		if z == r {
			return i
		}
	}
	panic("not a zmm register")
}

// zmm is physical zmm register i.
func zmm(i int) reg.VecPhysical {
	return []reg.VecPhysical{reg.Z0, reg.Z1, reg.Z2, reg.Z3, reg.Z4, reg.Z5, reg.Z6, reg.Z7, reg.Z8, reg.Z9, reg.Z10,
		reg.Z11, reg.Z12, reg.Z13, reg.Z14, reg.Z15, reg.Z16, reg.Z17, reg.Z18, reg.Z19, reg.Z20, reg.Z21, reg.Z22, reg.Z23,
		reg.Z24, reg.Z25, reg.Z26, reg.Z27, reg.Z28, reg.Z29, reg.Z30, reg.Z31}[i]
}

// vdpbf16ps emits VDPBF16PS dst, src1, src2 (register forms, 512 bits):
// EVEX.512.F3.0F38.W0 52 /r, dst in ModRM.reg (with EVEX.R and R'), src1
// in EVEX.vvvv (with V'), src2 in ModRM.rm (with EVEX.B and X).
func vdpbf16ps(dst, src1, src2 reg.VecPhysical) {
	d, s1, s2 := zmmIndex(dst), zmmIndex(src1), zmmIndex(src2)
	inv := func(v, bit int) byte { return byte(^(v >> bit) & 1) }
	p0 := inv(d, 3)<<7 | inv(s2, 4)<<6 | inv(s2, 3)<<5 | inv(d, 4)<<4 | 0x2
	p1 := byte(^s1&15)<<3 | 1<<2 | 0x2
	p2 := byte(2)<<5 | inv(s1, 4)<<3
	modrm := byte(0xC0) | byte(d&7)<<3 | byte(s2&7)
	Comment(fmt.Sprintf("VDPBF16PS Z%d, Z%d, Z%d (Z%d += bf16 pairs of Z%d · Z%d)", s2, s1, d, d, s1, s2))
	for _, b := range []byte{0x62, p0, p1, p2, 0x52, modrm} {
		Instruction(&ir.Instruction{Opcode: "BYTE", Operands: []Op{U8(b)}})
	}
}

func bdotKernel(mr, np int) {
	name := fmt.Sprintf("bdotAVX512x%dp%d", mr, np)
	TEXT(name, NOSPLIT, fmt.Sprintf("func(a *[%d]*uint16, b *byte, stride int, k int, c *float32, ldc int, flags int)", maxBdotMR))
	Pragma("noescape")
	Doc(fmt.Sprintf("%s adds, for k steps (k even), the products of %d bf16 rows with %d bf16-dot panels to the %d×%d tile c (row stride ldc bytes), starting from c (flags bit 0) or from zero (see bdotFunc).",
		name, mr, np, mr, np*panelWidth))
	gps := []reg.Physical{reg.R8, reg.R9, reg.R10, reg.R11, reg.R12, reg.R13}
	a := gps[:mr]
	bps := []reg.Physical{reg.RSI, reg.RDI, reg.RDX, reg.RBX}
	b := bps[:np]
	aPtr, i, o, kEnd := reg.RAX, reg.RCX, reg.R14, reg.R15
	Load(Param("a"), aPtr)
	for m, r := range a {
		MOVQ(Mem{Base: aPtr, Disp: 8 * m}, r)
	}
	Load(Param("b"), b[0])
	if np > 1 {
		Load(Param("stride"), aPtr) // a's pointers are read: reuse
		for j := 1; j < np; j++ {
			LEAQ(Mem{Base: b[j-1], Index: aPtr, Scale: 1}, b[j])
		}
	}
	acc := func(m, j int) reg.VecPhysical { return zmm(m*np + j) }
	w := func(j int) reg.VecPhysical { return zmm(mr*np + j) }
	x := zmm(mr*np + np)
	tile := func(f func(m, j int, at Mem)) {
		c, ldc := reg.RAX, reg.R14
		Load(Param("c"), c)
		Load(Param("ldc"), ldc)
		for m := range mr {
			if m > 0 {
				ADDQ(ldc, c)
			}
			for j := range np {
				f(m, j, Mem{Base: c, Disp: 64 * j})
			}
		}
	}
	Comment("Start from the tile in c (flags bit 0), or from zero.")
	Load(Param("flags"), i)
	TESTQ(U32(1), i)
	JZ(LabelRef(name + "_zero"))
	tile(func(m, j int, at Mem) { VMOVUPS(at, acc(m, j)) })
	JMP(LabelRef(name + "_start"))
	Label(name + "_zero")
	for m := range mr {
		for j := range np {
			VPXORD(acc(m, j), acc(m, j), acc(m, j))
		}
	}
	Label(name + "_start")
	Load(Param("k"), kEnd)
	XORQ(i, i) // k step (even)
	XORQ(o, o) // byte offset into each panel
	Comment("Two steps of k: a vector a panel, a broadcast pair a row.")
	Label(name + "_loop")
	CMPQ(i, kEnd)
	JGE(LabelRef(name + "_store"))
	if mr <= 3 {
		for _, bj := range b {
			PREFETCHT0(Mem{Base: bj, Index: o, Scale: 1, Disp: 1024})
		}
	}
	for j := range np {
		VMOVDQU64(Mem{Base: b[j], Index: o, Scale: 1}, w(j))
	}
	for m := range mr {
		VPBROADCASTD(Mem{Base: a[m], Index: i, Scale: 2}, x)
		for j := range np {
			vdpbf16ps(acc(m, j), x, w(j))
		}
	}
	ADDQ(U32(2), i)
	ADDQ(U32(64), o)
	JMP(LabelRef(name + "_loop"))
	Label(name + "_store")
	tile(func(m, j int, at Mem) { VMOVUPS(acc(m, j), at) })
	VZEROUPPER()
	RET()
}

// bdotPeak is the vdpbf16ps peak probe: n rounds of 12 independent
// vdpbf16ps on registers (each 32 multiply-adds: 64 flops).
func bdotPeak() {
	TEXT("bdotPeakAVX512", NOSPLIT, "func(n int) float32")
	Pragma("noescape")
	Doc("bdotPeakAVX512 runs n rounds of 12 independent vdpbf16ps (64 flops each) and returns a lane of their sum, so that the work is kept.")
	n := reg.RAX
	Load(Param("n"), n)
	for r := 0; r < 14; r++ {
		VPXORD(zmm(r), zmm(r), zmm(r))
	}
	Label("bdotpeak_loop")
	TESTQ(n, n)
	JZ(LabelRef("bdotpeak_done"))
	for r := 0; r < 12; r++ {
		vdpbf16ps(zmm(r), zmm(12), zmm(13))
	}
	DECQ(n)
	JMP(LabelRef("bdotpeak_loop"))
	Label("bdotpeak_done")
	for r := 1; r < 12; r++ {
		VADDPS(zmm(r), zmm(0), zmm(0))
	}
	Store(reg.X0, ReturnIndex(0))
	VZEROUPPER()
	RET()
}

func bdotKernels() {
	for mr := 1; mr <= maxBdotMR; mr++ {
		for np := 1; np <= bdotNP(mr); np++ {
			bdotKernel(mr, np)
		}
	}
	bdotPeak()
}

// writeBdotTable appends the Go table of the bf16-dot kernels to b.
func writeBdotTable(b *bytes.Buffer) {
	b.WriteString("// bdotAVX512 holds the AVX-512 BF16 bf16-dot kernels by rows and panels.\nvar bdotAVX512 = bdotTable{\n")
	for mr := 1; mr <= maxBdotMR; mr++ {
		fmt.Fprintf(b, "%d: {", mr)
		for np := 1; np <= bdotNP(mr); np++ {
			fmt.Fprintf(b, "%d: bdotAVX512x%dp%d, ", np, mr, np)
		}
		b.WriteString("},\n")
	}
	b.WriteString("}\n")
}
