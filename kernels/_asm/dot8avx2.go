package main

import (
	"bytes"
	"fmt"
	"strings"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The int8-dot kernels on AVX2 (no VNNI): the same mode, the same bits as
// the AVX-512 ones (see dot8.go and kernels/dot8.go), one panel a call in
// two halves of eight rows, one or two activation rows. A group's integer
// sums, exact either way, come from vpmaddubsw (unsigned bytes times
// signed bytes, pairs added in int16) and vpmaddwd by ones (pairs into
// int32):
//
//   - UINT4: nibbles times int8 codes, a pair at most 2·15·127 = 3810, so a
//     group of up to 32 steps (four units, both nibbles) sums in int16
//     without overflow (≤ 30480) and widens once, at its end (INT4's
//     nibbles, the codes plus 8, the same way, less 8·S at the end);
//   - INT8 (stored plus 128): the codes back to signed (xor 0x80), then
//     |c| times the activation with c's sign (vpabsb, vpsignb): a pair at
//     most 2·128·127 = 32512, no saturation; each unit widens to int32.
//
// At a group's end the sums join the fp32 chains exactly as on AVX-512.

// dot8AVX2MR is the most activation rows of an AVX2 int8-dot kernel: two
// rows' chains and group sums (four registers each) beside the weights,
// broadcasts and constants fill the sixteen.
const dot8AVX2MR = 2

func dot8AVX2Kernel(kind string, mr int) {
	name := fmt.Sprintf("dot8AVX2%sx%d", kind, mr)
	super := strings.Contains(kind, "K")
	dot8Text(name, super)
	Pragma("noescape")
	Doc(fmt.Sprintf("%s is dot8AVX512%sx%dp1 on AVX2 (vpmaddubsw, vpmaddwd): the same bits.", name, kind, mr))
	base, f16 := dot8F16(kind)
	code := dot8CodeOf(base)
	u4 := code.nibbles && code.planes == 0 && !code.lut
	offsets := strings.HasSuffix(kind, "M")

	a := make([]GPVirtual, mr)
	aPtr := Load(Param("a"), GP64())
	for m := range a {
		a[m] = GP64()
		MOVQ(Mem{Base: aPtr, Disp: 8 * m}, a[m])
	}
	b := Load(Param("b"), GP64())
	src := loadDot8Src(super, offsets)
	src.e8, src.f16 = code.lut, f16
	t := GP32()
	mask := YMM() // nibbles: the low nibble of each byte; INT8: the bias bit
	if code.nibbles {
		MOVL(U32(0x0F0F0F0F), t)
	} else {
		MOVL(U32(0x80808080), t)
	}
	VMOVD(t, mask.AsX())
	VPBROADCASTD(mask.AsX(), mask)
	var lut VecVirtual
	if code.lut {
		lut = YMM()
		VMOVDQU(dot8LUT, lut)
	}
	ones := YMM() // int16 ones: vpmaddwd adds pairs
	MOVL(U32(0x00010001), t)
	VMOVD(t, ones.AsX())
	VPBROADCASTD(ones.AsX(), ones)

	acc := make([][]VecVirtual, mr)  // [m][half] fp32 chains
	sums := make([][]VecVirtual, mr) // [m][half] the group's sums: int16 pairs (UINT4) or int32
	for m := range acc {
		acc[m], sums[m] = make([]VecVirtual, 2), make([]VecVirtual, 2)
		for h := range 2 {
			acc[m][h], sums[m][h] = YMM(), YMM()
		}
	}
	tile := dot8Tile(acc, 32)
	g, o := dot8Open(name, acc, tile, src)
	for m := range sums {
		for _, r := range sums[m] {
			VPXOR(r, r, r)
		}
	}
	u := Load(Param("units"), GP64())
	Comment("Eight steps of k, half a panel (eight rows) at a time.")
	Label(name + "_unit")
	if mr <= 3 {
		PREFETCHT0(Mem{Base: b, Index: o, Scale: 1, Disp: pfDist})
		if code.unit > 64 {
			PREFETCHT0(Mem{Base: b, Index: o, Scale: 1, Disp: pfDist + 64})
		}
	}
	for h := range 2 {
		at := Mem{Base: b, Index: o, Scale: 1, Disp: 32 * h}
		if code.planes > 0 || code.lut {
			// Codes of 5 or 6 bits: the nibbles, each plane's bits of
			// these eight rows (32 a vector) spread to their bytes
			// (vpshufb a byte to eight lanes, one bit each, compared),
			// then u8 codes (≤ 63) times s8 activations: a pair at most
			// 2·63·127 = 16002, the unit's two in int16 (≤ 32004),
			// widened a unit at a time.
			lo, hi := YMM(), YMM()
			VMOVDQU(at, hi)
			VPAND(mask, hi, lo)
			VPSRLW(U8(4), hi, hi)
			VPAND(mask, hi, hi)
			if code.lut { // MXFP4: the nibbles' codes (the table's first 32 bytes)
				VPSHUFB(lo, lut, lo)
				VPSHUFB(hi, lut, hi)
			}
			for pl := range code.planes {
				for v, r := range []VecVirtual{lo, hi} {
					t := YMM()
					VPBROADCASTD(Mem{Base: b, Index: o, Scale: 1, Disp: 64 + 16*pl + 8*v + 4*h}, t)
					VPSHUFB(planeConsts.spread, t, t)
					VPAND(planeConsts.bit, t, t)
					VPCMPEQB(planeConsts.bit, t, t)
					VPAND(planeConsts.high[pl], t, t)
					VPOR(t, r, r)
				}
			}
			for m := range a {
				x, p := YMM(), YMM()
				VPBROADCASTD(Mem{Base: a[m]}, x)
				VPMADDUBSW(x, lo, p)
				VPBROADCASTD(Mem{Base: a[m], Disp: 4}, x)
				VPMADDUBSW(x, hi, x)
				VPADDW(x, p, p)
				VPMADDWD(ones, p, p)
				VPADDD(p, sums[m][h], sums[m][h])
			}
			continue
		}
		if u4 {
			lo, hi := YMM(), YMM()
			VMOVDQU(at, hi)
			VPAND(mask, hi, lo)
			VPSRLW(U8(4), hi, hi)
			VPAND(mask, hi, hi)
			for m := range a {
				x, p := YMM(), YMM()
				VPBROADCASTD(Mem{Base: a[m]}, x)
				VPMADDUBSW(x, lo, p)
				VPADDW(p, sums[m][h], sums[m][h])
				VPBROADCASTD(Mem{Base: a[m], Disp: 4}, x)
				VPMADDUBSW(x, hi, p)
				VPADDW(p, sums[m][h], sums[m][h])
			}
			continue
		}
		for step := range 2 { // steps 0…3, then 4…7: the unit's two 64-byte halves
			w, aw := YMM(), YMM()
			VPXOR(at.Offset(64*step), mask, w) // the signed codes
			VPABSB(w, aw)
			for m := range a {
				x := YMM()
				VPBROADCASTD(Mem{Base: a[m], Disp: 4 * step}, x)
				VPSIGNB(w, x, x)
				VPMADDUBSW(x, aw, x)
				VPMADDWD(ones, x, x)
				VPADDD(x, sums[m][h], sums[m][h])
			}
		}
	}
	for m := range a {
		ADDQ(U32(8), a[m])
	}
	ADDQ(U32(code.unit), o)
	DECQ(u)
	JNZ(LabelRef(name + "_unit"))

	Comment("The group's end: each row's sums into its chains.")
	if mr <= 3 {
		src.prefetch(1)
	}
	for h := range 2 {
		sv, ov := src.scales(YMM, 8*h)
		for m := range a {
			s := sums[m][h]
			if u4 {
				VPMADDWD(ones, s, s)
			}
			if code.nibbles && code.biasShift >= 0 { // less bias·S, from the record's 128·S
				cB := YMM()
				VPBROADCASTD(Mem{Base: a[m], Disp: 8}, cB)
				VPSRAD(U8(code.biasShift), cB, cB)
				VPSUBD(cB, s, s)
			}
			VCVTDQ2PS(s, s)
			d := YMM()
			VBROADCASTSS(Mem{Base: a[m]}, d)
			VMULPS(sv, d, d)
			VFMADD231PS(d, s, acc[m][h])
			if offsets {
				v := YMM()
				VBROADCASTSS(Mem{Base: a[m], Disp: 4}, v)
				if super {
					VFMADD231PS(v, ov, acc[m][h])
				} else {
					VFMADD231PS(ov, v, acc[m][h])
				}
			}
		}
	}
	for m := range a {
		ADDQ(U32(16), a[m])
	}
	dot8Close(name, tile, g, src)
}

// planeConsts are the AVX2 kernels' constants for the high bits' planes:
// spread (vpshufb) takes byte i/8 of a broadcast 32-bit word to byte i,
// bit picks bit i%8 of it, high[p] is plane p's bit (0x10, 0x20).
var planeConsts struct {
	spread, bit Mem
	high        [2]Mem
}

func dot8AVX2Consts() {
	planeConsts.spread = GLOBL("dot8Spread", RODATA|NOPTR)
	for i := range 32 {
		DATA(i, U8(i/8))
	}
	planeConsts.bit = GLOBL("dot8Bit", RODATA|NOPTR)
	for i := range 32 {
		DATA(i, U8(1<<(i%8)))
	}
	for p := range planeConsts.high {
		planeConsts.high[p] = GLOBL(fmt.Sprintf("dot8High%d", p), RODATA|NOPTR)
		for i := range 32 {
			DATA(i, U8(0x10<<p))
		}
	}
}

func dot8AVX2Kernels() {
	dot8AVX2Consts()
	dot8LUTConst()
	for _, kind := range dot8Kinds {
		for mr := 1; mr <= dot8AVX2MR; mr++ {
			dot8AVX2Kernel(kind, mr)
		}
	}
}

// writeDot8AVX2Table appends the Go table of the AVX2 int8-dot kernels to b.
func writeDot8AVX2Table(b *bytes.Buffer) {
	writeKernelTable(b, "AVX2 int8-dot kernels (one panel a call)", "dot8AVX2", dot8AVX2MR, func(int) int { return 1 }, func(kind string, mr, _ int) string {
		return fmt.Sprintf("dot8AVX2%sx%d", kind, mr)
	})
}
