package main

import (
	"bytes"
	"fmt"
	"strings"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The exact mode's kernels on INT8 codes of 5 and 6 bits (kernels.Pack
// holds GGUF's Q5_0, Q5_1, Q5_K and Q6_K so): a panel's units of eight k
// steps are 64 bytes of nibbles (byte 16p + l: row l's steps 2p, low, and
// 2p+1) and each high bit's plane (16 bytes: a 64-bit word of the even
// steps' bits, then one of the odd steps', bit 16p + l as the nibbles'
// byte). AVX-512 takes a unit's codes as bytes: the nibbles split (the
// even steps, the odd), each plane's words as masks adding the high bits,
// less the bias they are stored plus (16 for S5, 32 for S6); a step's 16
// then widen to int32 from their 128-bit lane. AVX2 widens a step's
// nibbles to int32 and spreads each plane's byte to its eight lanes. The
// codes are converted to fp32 and scaled as the INT8 kernels scale theirs
// (times the scale, or one FMA with the offset): the weights of the Q8
// kernels, the same FMA chains, the same bits.

var narrowKinds = []string{"S5", "U5M", "S6"}

// outerNarrowNP is the widest panel count of a narrow kernel for MR rows:
// the accumulators, a step's weights, a broadcast and the constants.
func outerNarrowNP(is isa, kind string, mr int) int {
	regs, extra := 32, 6
	if is.lanes == 8 {
		regs, extra = 16, 3
	}
	if strings.HasSuffix(kind, "M") {
		extra++
	}
	vpp, held := panelWidth/is.lanes, 1 // AVX-512 holds a unit's codes: two vectors a panel more
	if is.lanes == 16 {
		held = 3
	}
	for np := 4; np > 1; np /= 2 {
		if (mr*np+held*np)*vpp+extra <= regs {
			return np
		}
	}
	return 1
}

// narrowConsts are the AVX2 narrow kernels' constants in memory: lane i's
// bit (1 << i, eight dwords), the high bits (16 and 32 in every dword) and
// the biases.
var narrowConsts struct {
	bit    Mem
	high   [2]Mem
	bias16 Mem
	bias32 Mem
}

func narrowAVX2Consts() {
	narrowConsts.bit = GLOBL("narrowBit", RODATA|NOPTR)
	for i := range 8 {
		DATA(4*i, U32(1<<i))
	}
	for p := range narrowConsts.high {
		narrowConsts.high[p] = GLOBL(fmt.Sprintf("narrowHigh%d", p), RODATA|NOPTR)
		for i := range 8 {
			DATA(4*i, U32(16<<p))
		}
	}
	narrowConsts.bias16, narrowConsts.bias32 = narrowConsts.high[0], narrowConsts.high[1]
}

func outerNarrow(is isa, kind string, mr, np int) {
	name := fmt.Sprintf("op%s%sx%dp%d", is.name, kind, mr, np)
	code := dot8CodeOf(kind)
	offsets := strings.HasSuffix(kind, "M")
	TEXT(name, NOSPLIT, fmt.Sprintf("func(a *[%d]*float32, b *byte, stride int, k int, c *float32, ldc int, flags int, s *float32, t *float32, o *float32, bk int, ss int)", maxMR))
	Pragma("noescape")
	Doc(fmt.Sprintf("%s adds, for k steps (a multiple of 8), the products of %d fp32 rows with %d panels of %d-bit codes%s to the %d×%d tile c (row stride ldc bytes), starting from c (flags bit 0) or from zero.",
		name, mr, np, 4+code.planes, map[bool]string{true: " (stored plus their bias)", false: ""}[code.biasShift >= 0], mr, np*panelWidth),
		"A weight is its code times its row's scale in s (16 per panel)"+map[bool]string{true: " plus its row's offset in o (one rounding)", false: ""}[offsets]+
			"; t unused; s (and o) move on ss bytes every bk steps, to the next group's.")
	vpp := panelWidth / is.lanes
	avx2 := is.lanes == 8
	scales := Load(Param("s"), GP64())
	var offs Register
	if offsets {
		offs = Load(Param("o"), GP64())
	}
	broadcast := func(v uint32) VecVirtual { return splat(is.lanes, v) }
	var mask VecVirtual
	var bits []VecVirtual
	var bias VecVirtual
	if avx2 {
		mask = broadcast(15)
	} else { // byte constants
		mask = broadcast(0x0F0F0F0F)
		for pl := range code.planes {
			bits = append(bits, broadcast(0x10101010<<pl))
		}
		if code.biasShift >= 0 {
			bias = broadcast(0x08080808 << code.planes) // 16 or 32
		}
	}

	a, b := rowsAndPanels(mr, np)
	acc := make([][]VecVirtual, mr)
	for m := range acc {
		acc[m] = make([]VecVirtual, np*vpp)
		for v := range acc[m] {
			acc[m][v] = is.vec()
		}
	}
	tile := outerTile(is, acc)
	outerStart(name, acc, func() { tile(func(m, v int, at Mem) { VMOVUPS(at, acc[m][v]) }) })
	end := GP64()
	Load(Param("bk"), end)
	i := GP64() // k index into the activation rows
	o := GP64() // byte offset of step i's unit into each panel
	XORQ(i, i)
	XORQ(o, o)

	Comment("A unit of eight steps: a step's weights a panel at a time, a broadcast per row.")
	scaleBlockHead(name, i, end, scales, offs)
	prefetch(mr, b, o)
	if mr <= 3 {
		for _, bj := range b {
			PREFETCHT0(Mem{Base: bj, Index: o, Scale: 1, Disp: pfDist + 64})
		}
	}
	// codes[j] are panel j's unit as bytes (AVX-512): the even steps'
	// codes, then the odd steps'.
	var codes [][2]VecVirtual
	if !avx2 {
		codes = make([][2]VecVirtual, np)
		for j := range np {
			codes[j] = narrowUnitBytes(Mem{Base: b[j], Index: o, Scale: 1}, code, mask, bits, bias)
		}
	}
	for s := range 8 {
		p, h := s/2, s%2
		w := make([]VecVirtual, np*vpp)
		for j := range np {
			for v := range vpp {
				x := is.vec()
				w[j*vpp+v] = x
				if avx2 {
					VPMOVZXBD(Mem{Base: b[j], Index: o, Scale: 1, Disp: 16*p + 8*v}, x)
					if h == 0 {
						VPAND(mask, x, x)
					} else {
						VPSRLD(U8(4), x, x)
					}
					for pl := range code.planes { // the byte of this half's eight rows, spread
						y := is.vec()
						VPBROADCASTB(Mem{Base: b[j], Index: o, Scale: 1, Disp: narrowPlaneAt(pl, s) + v}, y)
						VPAND(narrowConsts.bit, y, y)
						VPCMPEQD(narrowConsts.bit, y, y)
						VPAND(narrowConsts.high[pl], y, y)
						VPOR(y, x, x)
					}
					if code.biasShift >= 0 {
						VPSUBD(map[int]Mem{1: narrowConsts.bias16, 2: narrowConsts.bias32}[code.planes], x, x)
					}
				} else {
					stepCodes(codes[j][h], p, x)
				}
				VCVTDQ2PS(x, x)
				at := Mem{Base: scales, Disp: 4 * (j*panelWidth + v*is.lanes)}
				if offsets {
					sv := is.vec()
					VMOVUPS(at, sv)
					VFMADD213PS(Mem{Base: offs, Disp: 4 * (j*panelWidth + v*is.lanes)}, sv, x)
				} else {
					VMULPS(at, x, x)
				}
			}
		}
		for m := range a {
			x := is.vec()
			VBROADCASTSS(Mem{Base: a[m], Index: i, Scale: 4, Disp: 4 * s}, x)
			for v, wv := range w {
				VFMADD231PS(wv, x, acc[m][v])
			}
		}
	}
	ADDQ(U32(8), i)
	ADDQ(U32(code.unit), o)
	JMP(LabelRef(name + "_loop"))

	Label(name + "_store")
	tile(func(m, v int, at Mem) { VMOVUPS(acc[m][v], at) })
	VZEROUPPER()
	RET()
}

// splat emits v in every 32-bit lane of a new vector of lanes lanes (16:
// zmm, 8: ymm).
func splat(lanes int, v uint32) VecVirtual {
	t := GP32()
	MOVL(U32(v), t)
	if lanes == 8 {
		z, x := YMM(), XMM()
		VMOVD(t, x)
		VPBROADCASTD(x, z)
		return z
	}
	z := ZMM()
	VPBROADCASTD(t, z)
	return z
}

// narrowPlaneAt is where in a unit plane pl's bits of step s start.
func narrowPlaneAt(pl, s int) int { return 64 + 16*pl + 8*(s%2) + 2*(s/2) }

// narrowUnitBytes loads the unit at u as the codes' bytes (AVX-512): the
// even steps' (step 2p's 16 rows in 128-bit lane p) and the odd steps',
// each with its high bits and less its bias: signed bytes.
func narrowUnitBytes(u Mem, code dot8Code, mask VecVirtual, bits []VecVirtual, bias VecVirtual) [2]VecVirtual {
	even, odd := ZMM(), ZMM()
	VMOVDQU64(u, odd)
	VPANDD(mask, odd, even)
	VPSRLW(U8(4), odd, odd)
	VPANDD(mask, odd, odd)
	for pl, bit := range bits {
		for h, r := range []VecVirtual{even, odd} {
			k := K()
			KMOVQ(u.Offset(64+16*pl+8*h), k)
			VPADDB(bit, r, k, r)
		}
	}
	if bias != nil {
		VPSUBB(bias, even, even)
		VPSUBB(bias, odd, odd)
	}
	return [2]VecVirtual{even, odd}
}

// stepCodes widens lane p of a unit's bytes (a step's 16 codes) to int32
// in x.
func stepCodes(src VecVirtual, p int, x VecVirtual) {
	if p == 0 {
		VPMOVSXBD(src.AsX(), x)
		return
	}
	t := XMM()
	VEXTRACTI32X4(U8(p), src, t)
	VPMOVSXBD(t, x)
}

// dqNarrow emits dqAVX512<kind>: the narrow codes' widening of outerNarrow
// for k steps (a multiple of 8) of one panel, into dst (16 floats a step).
func dqNarrow(kind string) {
	name := "dqAVX512" + kind
	code := dot8CodeOf(kind)
	offsets := strings.HasSuffix(kind, "M")
	TEXT(name, NOSPLIT, "func(dst *float32, b *byte, k int, s *float32, o *float32)")
	Pragma("noescape")
	Doc(fmt.Sprintf("%s widens k steps (a multiple of 8) of one panel of %d-bit codes at b, each code times its row's scale in s%s, into dst (16 floats a step).",
		name, 4+code.planes, map[bool]string{true: " plus its row's offset in o (16 each, one rounding)", false: " (16; o unused)"}[offsets]))
	dst := Load(Param("dst"), GP64())
	b := Load(Param("b"), GP64())
	k := Load(Param("k"), GP64())
	sc := ZMM()
	VMOVUPS(Mem{Base: Load(Param("s"), GP64())}, sc)
	var off VecVirtual
	if offsets {
		off = ZMM()
		VMOVUPS(Mem{Base: Load(Param("o"), GP64())}, off)
	}
	broadcast := func(v uint32) VecVirtual { return splat(16, v) }
	mask := broadcast(0x0F0F0F0F)
	var bits []VecVirtual
	for pl := range code.planes {
		bits = append(bits, broadcast(0x10101010<<pl))
	}
	var bias VecVirtual
	if code.biasShift >= 0 {
		bias = broadcast(0x08080808 << code.planes)
	}
	i := GP64()
	XORQ(i, i)
	Label(name + "_loop")
	CMPQ(i, k)
	JGE(LabelRef(name + "_done"))
	codes := narrowUnitBytes(Mem{Base: b}, code, mask, bits, bias)
	for s := range 8 {
		x := ZMM()
		stepCodes(codes[s%2], s/2, x)
		VCVTDQ2PS(x, x)
		if off != nil {
			VFMADD213PS(off, sc, x)
		} else {
			VMULPS(sc, x, x)
		}
		VMOVUPS(x, Mem{Base: dst, Disp: 64 * s})
	}
	ADDQ(U32(code.unit), b)
	ADDQ(U32(8*64), dst)
	ADDQ(U32(8), i)
	JMP(LabelRef(name + "_loop"))
	Label(name + "_done")
	VZEROUPPER()
	RET()
}

func narrowKernels(is isa) {
	if is.lanes == 8 {
		narrowAVX2Consts()
	}
	for _, kind := range narrowKinds {
		for mr := 1; mr <= is.maxMR; mr++ {
			for np := 1; np <= outerNarrowNP(is, kind, mr); np++ {
				outerNarrow(is, kind, mr, np)
			}
		}
		if is.lanes == 16 {
			dqNarrow(kind)
		}
	}
}

// writeNarrowTables appends the Go tables of the narrow kernels to b.
func writeNarrowTables(b *bytes.Buffer, is isa) {
	for _, kind := range narrowKinds {
		fmt.Fprintf(b, "// outer%s%s holds the %s outer-product kernels on %s codes by rows and panels.\n", kind, is.name, is.name, dot8KindDoc[kind])
		fmt.Fprintf(b, "var outer%s%s = outerQTable{\n", kind, is.name)
		for mr := 1; mr <= is.maxMR; mr++ {
			fmt.Fprintf(b, "%d: {", mr)
			for np := 1; np <= outerNarrowNP(is, kind, mr); np++ {
				fmt.Fprintf(b, "%d: op%s%sx%dp%d, ", np, is.name, kind, mr, np)
			}
			b.WriteString("},\n")
		}
		b.WriteString("}\n\n")
	}
}
