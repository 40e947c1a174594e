package main

import (
	"bytes"
	"fmt"
	"strings"

	. "github.com/mmcloughlin/avo/build"
	"github.com/mmcloughlin/avo/ir"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The int8-dot kernels (AVX-512 VNNI): the weights' codes as unsigned
// bytes (UINT4 nibbles split by a mask and a shift; INT8 codes stored
// plus 128), the activations' int8 codes broadcast four at a time, and
// vpdpbusd summing four products a lane into each row's int32 group sum;
// at a group's end the sums become floats (INT8: less 128·S, undoing the
// bias) and join each output's fp32 chain as the mode defines (see
// kernels/dot8.go): acc += float(I)·(s·d), then acc += o·(d·S).

// maxDot8MR is the most activation rows of an int8-dot kernel.
const maxDot8MR = 4

// dot8NP is the widest panel count of an int8-dot kernel for MR rows: the
// group sums and the chains (MR·NP each), two weight vectors a panel, two
// broadcasts, the mask and a temporary.
func dot8NP(mr int) int {
	for np := 4; np > 1; np /= 2 {
		if 2*mr*np+2*np+4 <= 32 {
			return np
		}
	}
	return 1
}

var dot8Kinds = []string{"U4", "U4M", "I8", "I8M", "U4KM", "I8K", "I8KM", "S5", "U5M", "S6", "U5KM", "S6K", "M4", "S4",
	"HI8", "HS4", "HU4M", "HS5", "HU5M"}

// The H kinds are their kind's kernels on fp16 scales (and offsets), as
// GGUF's Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 store them: the same streams at
// half the bytes, each panel's 16 widened exactly (vcvtph2ps) where the
// fp32 kinds read theirs.

// dot8F16 says whether kind reads fp16 scales, and returns the kind whose
// codes it reads.
func dot8F16(kind string) (base string, f16 bool) {
	if base, ok := strings.CutPrefix(kind, "H"); ok {
		return base, true
	}
	return kind, false
}

// dot8Code is how a kind's codes are held (see kernels/dot8.go's
// dot8Unit): nibbles (UINT4 and the 5- and 6-bit INT8 codes, planes high
// bits' planes after them) or a byte a code (INT8); stored plus a bias
// (128 for bytes, 16 for S5, 32 for S6, 8 for S4: biasShift the right
// shift that makes it of the records' 128·S, −1 for none).
type dot8Code struct {
	nibbles   bool
	lut       bool // MXFP4: a nibble's code looked up (vpshufb in dot8LUT)
	planes    int
	biasShift int
	unit      int // bytes a unit
}

func dot8CodeOf(kind string) dot8Code {
	switch kind[:2] {
	case "U4":
		return dot8Code{nibbles: true, biasShift: -1, unit: 64}
	case "U5":
		return dot8Code{nibbles: true, planes: 1, biasShift: -1, unit: 80}
	case "S5":
		return dot8Code{nibbles: true, planes: 1, biasShift: 3, unit: 80}
	case "S6":
		return dot8Code{nibbles: true, planes: 2, biasShift: 2, unit: 96}
	case "M4":
		return dot8Code{nibbles: true, lut: true, biasShift: 3, unit: 64}
	case "S4":
		return dot8Code{nibbles: true, biasShift: 4, unit: 64}
	}
	return dot8Code{biasShift: 0, unit: 128}
}

// dot8Doc describes a kind's weights.
func dot8Doc(kind string) string {
	base, f16 := dot8F16(kind)
	if f16 {
		return dot8KindDoc[base] + " on fp16 scales"
	}
	return dot8KindDoc[base]
}

// dot8Field is a kind's field in the Go table (kernels' dot8Kernels).
func dot8Field(kind string) string {
	base, f16 := dot8F16(kind)
	if f16 {
		return "h" + dot8KindField[base]
	}
	return dot8KindField[base]
}

// dot8KindDoc describes a kind's weights.
var dot8KindDoc = map[string]string{
	"U4": "UINT4", "U4M": "UINT4 (with offsets)", "I8": "INT8", "I8M": "INT8 (with offsets)",
	"U4KM": "UINT4 (with offsets, K-quant scales)", "I8K": "INT8 (K-quant scales)", "I8KM": "INT8 (with offsets, K-quant scales)",
	"S5": "5-bit signed INT8", "U5M": "5-bit unsigned INT8 (with offsets)", "S6": "6-bit signed INT8",
	"U5KM": "5-bit unsigned INT8 (with offsets, K-quant scales)", "S6K": "6-bit signed INT8 (K-quant scales)",
	"M4": "MXFP4 (codes twice the e2m1 values)", "S4": "INT4 (nibbles the codes plus 8)",
	"M4V": "MXFP4 (codes twice the e2m1 values, looked up by vpermb: AVX512_VBMI)",
}

// dot8KindField is a kind's field in the Go table (kernels' dot8Kernels).
var dot8KindField = map[string]string{
	"U4": "u4", "U4M": "u4m", "I8": "i8", "I8M": "i8m", "U4KM": "u4km", "I8K": "i8k", "I8KM": "i8km",
	"S5": "s5", "U5M": "u5m", "S6": "s6", "U5KM": "u5km", "S6K": "s6k", "M4": "m4", "S4": "s4",
}

// dot8LUT (made by dot8AVX2Kernels, which run first) is the MXFP4 kinds' table: nibble n's code, twice its e2m1
// value (an integer in [−12, 12]), plus the bias 16; 16 bytes, repeated to
// fill a zmm (vpshufb looks up within each 128-bit lane).
var dot8LUT Mem

func dot8LUTConst() {
	dot8LUT = GLOBL("dot8LUT", RODATA|NOPTR)
	vals := []int{0, 1, 2, 3, 4, 6, 8, 12}
	for i := range 64 {
		n := i % 16
		v := vals[n%8]
		if n >= 8 {
			v = -v
		}
		DATA(i, U8(uint8(v+16)))
	}
	e8Bias = GLOBL("e8Bias", RODATA|NOPTR)
	for i := range 16 {
		DATA(4*i, U32(63))
	}
	e8Off = GLOBL("e8Off", RODATA|NOPTR)
	for i := range 16 {
		DATA(4*i, U32(128))
	}
}

// e8Off (made with dot8LUT) is 128 in each of 16 int32 lanes: see e8Exps.
var e8Off Mem

// e8Exps returns a zmm (made by vec) of the exponents E−128 of the
// int8-dot MXFP4 scales at at, as floats, one a lane: VSCALEFPS by them
// makes d·2^(E−128) with one rounding, the bits of the product d·s of
// e8Scales' exact power of two, in 3 instructions where e8Scales and the
// product take 9.
func e8Exps(vec func() VecVirtual, at Mem) VecVirtual {
	f := vec()
	VPMOVZXBD(at, f)
	VPSUBD(e8Off, f, f)
	VCVTDQ2PS(f, f)
	return f
}

// e8Bias (made with dot8LUT) is 63 in each of 16 int32 lanes: see e8Scales.
var e8Bias Mem

// e8Scales returns a register (made by vec) of the int8-dot MXFP4 scales
// 2^(E−128) of the E8M0 bytes at at, one a lane (see e8Pow).
func e8Scales(vec func() VecVirtual, at Mem) VecVirtual {
	return e8Pow(vec, at, e8Bias, e8Bias)
}

// e8Pow returns a register (made by vec) of 2^(E+hb+lb−254) for the E8M0
// bytes E at at, one a lane: the product of 2^(⌊E/2⌋+hb−127) and
// 2^(E−⌊E/2⌋+lb−127), two normal floats made from their exponent bits
// (hb and lb, int32 lanes, keep both normal for every E), so that the
// subnormal results are exact too.
func e8Pow(vec func() VecVirtual, at Mem, hb, lb Op) VecVirtual {
	f, h := vec(), vec()
	VPMOVZXBD(at, f)
	VPSRLD(U8(1), f, h)
	VPSUBD(h, f, f)
	VPADDD(hb, h, h)
	VPADDD(lb, f, f)
	VPSLLD(U8(23), h, h)
	VPSLLD(U8(23), f, f)
	VMULPS(h, f, f)
	return f
}

// planeBits returns, for each of c's high bits' planes, a zmm of that bit
// in every byte (0x10, then 0x20).
func planeBits(c dot8Code) []VecVirtual {
	bits := make([]VecVirtual, c.planes)
	for pl := range bits {
		bits[pl] = splat(16, 0x10101010<<pl)
	}
	return bits
}

// vpdpbusd emits VPDPBUSD: acc += Σ over each lane's four bytes of
// u8(w)·s8(x). avo does not know the instruction; the Go assembler does.
func vpdpbusd(x, w, acc VecVirtual) {
	Instruction(&ir.Instruction{Opcode: "VPDPBUSD", Operands: []Op{x, w, acc}, Inputs: []Op{x, w, acc}, Outputs: []Op{acc}})
}

// The K kinds (U4KM: Q4_K, I8KM: Q5_K, I8K: Q6_K) take their scales and
// offsets factored as the K-quants store them (see dot8KFunc): at a
// super-block's start its header of d and −dmin, 16 a panel; at each
// group its int8 factors sc and m, 16 a panel; a panel's scale is d·sc and
// its offset −dmin·m, both exact, so the chains get the bits of the kinds
// with fp32 scales.
func dot8Kernel(kind string, mr, np int) {
	name := fmt.Sprintf("dot8AVX512%sx%dp%d", kind, mr, np)
	super := strings.Contains(kind, "K")
	dot8Text(name, super)
	Pragma("noescape")
	Doc(fmt.Sprintf("%s computes %d rows of int8 activation records against %d int8-dot panels of %s weights (see dot8Func%s).", name, mr, np,
		dot8Doc(kind), map[bool]string{false: "", true: " and dot8KFunc"}[super]))
	base, f16 := dot8F16(kind)
	code := dot8CodeOf(base)
	offsets := strings.HasSuffix(kind, "M")

	a, b := rowsAndPanels(mr, np)
	src := loadDot8Src(super, offsets)
	src.e8, src.f16 = code.lut, f16
	vbmi := kind == dot8VBMIKind
	var mask VecVirtual
	if code.nibbles && !vbmi {
		mask = ZMM()
		t := GP32()
		MOVL(U32(0x0F0F0F0F), t)
		VPBROADCASTD(t, mask)
	}
	bits := planeBits(code)
	var lut VecVirtual
	if code.lut {
		lut = ZMM()
		VMOVDQU64(dot8LUT, lut)
	}
	acc := make([][]VecVirtual, mr)
	sums := make([][]VecVirtual, mr)
	for m := range acc {
		acc[m], sums[m] = make([]VecVirtual, np), make([]VecVirtual, np)
		for j := range acc[m] {
			acc[m][j], sums[m][j] = ZMM(), ZMM()
		}
	}
	tile := dot8Tile(acc, 64)
	g, o := dot8Open(name, acc, tile, src)
	for m := range sums {
		for _, r := range sums[m] {
			VPXORD(r, r, r)
		}
	}
	u := Load(Param("units"), GP64())
	Comment("Eight steps of k: two weight vectors a panel, two broadcasts a row.")
	Label(name + "_unit")
	// Every line of the unit, pfDist8 ahead, whatever the rows: at 4 rows
	// these kernels still wait on memory (unlike the exact mode's).
	for _, bj := range b {
		for at := 0; at < code.unit; at += 64 {
			PREFETCHT0(Mem{Base: bj, Index: o, Scale: 1, Disp: pfDist8 + at})
		}
	}
	lo, hi := make([]VecVirtual, np), make([]VecVirtual, np)
	for j := range np {
		lo[j], hi[j] = ZMM(), ZMM()
		at := Mem{Base: b[j], Index: o, Scale: 1}
		if vbmi {
			// vpermb looks up by an index's low 6 bits in a table of 64
			// (dot8LUT, 16 entries repeated): a nibble's code without
			// masking off the bits above it.
			VMOVDQU64(at, hi[j])
			VPERMB(lut, hi[j], lo[j])
			VPSRLW(U8(4), hi[j], hi[j])
			VPERMB(lut, hi[j], hi[j])
		} else if code.nibbles {
			VMOVDQU64(at, hi[j])
			VPANDD(mask, hi[j], lo[j])
			VPSRLW(U8(4), hi[j], hi[j])
			VPANDD(mask, hi[j], hi[j])
			if lut != nil { // MXFP4: the nibbles' codes
				VPSHUFB(lo[j], lut, lo[j])
				VPSHUFB(hi[j], lut, hi[j])
			}
			// The high bits: each plane's words as masks, the bit added
			// where set.
			for pl, bit := range bits {
				for v, r := range []VecVirtual{lo[j], hi[j]} {
					k := K()
					KMOVQ(at.Offset(64+16*pl+8*v), k)
					VPADDB(bit, r, k, r)
				}
			}
		} else {
			VMOVDQU64(at, lo[j])
			VMOVDQU64(at.Offset(64), hi[j])
		}
	}
	for m := range a {
		x0, x1 := ZMM(), ZMM()
		VPBROADCASTD(Mem{Base: a[m]}, x0)
		VPBROADCASTD(Mem{Base: a[m], Disp: 4}, x1)
		for j := range np {
			vpdpbusd(x0, lo[j], sums[m][j])
		}
		for j := range np {
			vpdpbusd(x1, hi[j], sums[m][j])
		}
		ADDQ(U32(8), a[m])
	}
	ADDQ(U32(code.unit), o)
	DECQ(u)
	JNZ(LabelRef(name + "_unit"))

	Comment("The group's end: each row's sums into its chains.")
	src.prefetch(np) // the scales' (and offsets') streams, 16 groups ahead
	// scaleOf and offsetOf are panel j's scales and offsets of the group:
	// operands in memory, or (K kinds) registers computed from the factors.
	sv, ov := make([]Op, np), make([]Op, np)
	for j := range np {
		if src.e8 { // MXFP4: exponents, which scale d below (see e8Exps)
			sv[j] = e8Exps(ZMM, Mem{Base: src.s, Disp: 16 * j})
			continue
		}
		sv[j], ov[j] = src.scales(ZMM, 16*j)
	}
	for m := range a {
		d := ZMM()
		VBROADCASTSS(Mem{Base: a[m]}, d)
		var cB, vB VecVirtual
		if code.biasShift >= 0 { // bias·S, from the record's 128·S
			cB = ZMM()
			VPBROADCASTD(Mem{Base: a[m], Disp: 8}, cB)
			if code.biasShift > 0 {
				VPSRAD(U8(code.biasShift), cB, cB)
			}
		}
		if offsets {
			vB = ZMM()
			VBROADCASTSS(Mem{Base: a[m], Disp: 4}, vB)
		}
		for j := range np {
			if cB != nil {
				VPSUBD(cB, sums[m][j], sums[m][j])
			}
			VCVTDQ2PS(sums[m][j], sums[m][j])
			t := ZMM()
			if src.e8 {
				VSCALEFPS(sv[j], d, t)
			} else {
				VMULPS(sv[j], d, t)
			}
			VFMADD231PS(t, sums[m][j], acc[m][j])
			if offsets {
				if super {
					VFMADD231PS(vB, ov[j], acc[m][j])
				} else {
					VFMADD231PS(ov[j], vB, acc[m][j])
				}
			}
		}
		ADDQ(U32(16), a[m])
	}
	dot8Close(name, tile, g, src)
}

// dot8Text declares an int8-dot kernel: dot8Func's signature, or with
// super dot8KFunc's.
func dot8Text(name string, super bool) {
	if super {
		TEXT(name, NOSPLIT, fmt.Sprintf("func(a *[%d]*byte, b *byte, stride int, groups int, c *float32, ldc int, flags int, meta *byte, lane int, units int, per int)", maxDot8MR))
	} else {
		TEXT(name, NOSPLIT, fmt.Sprintf("func(a *[%d]*byte, b *byte, stride int, groups int, c *float32, ldc int, flags int, s *float32, o *float32, units int, rec int, ss int)", maxDot8MR))
	}
}

// dot8Src is where an int8-dot kernel finds a group's scales and offsets:
// the streams s and o (16 floats a panel; MXFP4's s 16 E8M0 bytes a panel,
// see e8Scales), or for the K kinds the factors
// at meta (hdr: the current super-block's header; left: its groups not yet
// run; lane: the first panel's place in its run).
type dot8Src struct {
	super, offsets              bool
	e8                          bool // MXFP4: s holds E8M0 exponents, a byte a scale (see e8Scales)
	f16                         bool // the H kinds: s and o hold fp16 values
	s, o, meta, hdr, lane, left Register
	hdrBytes, grpBytes          int // a super-block's d (and −dmin); a group's sc (and m)
}

func loadDot8Src(super, offsets bool) dot8Src {
	src := dot8Src{super: super, offsets: offsets, hdrBytes: 256, grpBytes: 64}
	if super {
		src.meta, src.lane = Load(Param("meta"), GP64()), Load(Param("lane"), GP64())
		src.hdr, src.left = GP64(), GP64()
		XORQ(src.left, src.left) // groups left in the super-block: none yet
	} else {
		src.s = Load(Param("s"), GP64())
		if offsets {
			src.o = Load(Param("o"), GP64())
		}
	}
	if offsets {
		src.hdrBytes, src.grpBytes = 512, 128
	}
	return src
}

// prefetch emits prefetches of the scale streams (or factors) pfDist ahead:
// every line a group of np panels reads, so that none of them waits on
// memory (a group's factors, or a run's scales, are more than a line).
func (src dot8Src) prefetch(np int) {
	if src.super {
		for at := 0; at < src.grpBytes; at += 64 {
			PREFETCHT0(Mem{Base: src.meta, Disp: pfDist + at})
		}
		return
	}
	width := 64 // a panel's scales' bytes
	switch {
	case src.e8:
		width = 16
	case src.f16:
		width = 32
	}
	ats := []int{}
	for at := 0; at < width*np; at += 64 {
		ats = append(ats, at)
	}
	if width < 64 {
		// A run's panels from one inside it: their scales may start
		// inside a line and end in the next.
		ats = append(ats, width*np-1)
	}
	for _, at := range ats {
		PREFETCHT0(Mem{Base: src.s, Disp: pfDist + at})
		if src.offsets {
			PREFETCHT0(Mem{Base: src.o, Disp: pfDist + at})
		}
	}
}

// scales returns the group's scales and offsets (nil without) of the
// rows at lane offset at (bytes into a 16-row panel's int8 factors, a
// quarter of that into its floats): operands in memory, or for the K kinds
// registers (made by vec) computed from the factors, d·sc and −dmin·m.
func (src dot8Src) scales(vec func() VecVirtual, at int) (s, o Op) {
	if src.e8 {
		return e8Scales(vec, Mem{Base: src.s, Disp: at}), nil
	}
	if src.f16 { // widened exactly
		f := vec()
		VCVTPH2PS(Mem{Base: src.s, Disp: 2 * at}, f)
		if src.offsets {
			g := vec()
			VCVTPH2PS(Mem{Base: src.o, Disp: 2 * at}, g)
			return f, g
		}
		return f, nil
	}
	if !src.super {
		s = Mem{Base: src.s, Disp: 4 * at}
		if src.offsets {
			o = Mem{Base: src.o, Disp: 4 * at}
		}
		return s, o
	}
	f := vec()
	VPMOVSXBD(Mem{Base: src.meta, Index: src.lane, Scale: 1, Disp: at}, f)
	VCVTDQ2PS(f, f)
	VMULPS(Mem{Base: src.hdr, Index: src.lane, Scale: 4, Disp: 4 * at}, f, f) // d·sc
	s = f
	if src.offsets {
		f := vec()
		VPMOVSXBD(Mem{Base: src.meta, Index: src.lane, Scale: 1, Disp: 64 + at}, f)
		VCVTDQ2PS(f, f)
		VMULPS(Mem{Base: src.hdr, Index: src.lane, Scale: 4, Disp: 256 + 4*at}, f, f) // −dmin·m
		o = f
	}
	return s, o
}

// dot8Tile returns what applies f to each chain register acc[m][v] with
// its place in the tile c: row m at c + m·ldc, vector v width·v bytes on.
func dot8Tile(acc [][]VecVirtual, width int) func(f func(r VecVirtual, at Mem)) {
	return func(f func(r VecVirtual, at Mem)) {
		c := Load(Param("c"), GP64())
		ldc := Load(Param("ldc"), GP64())
		for m := range acc {
			if m > 0 {
				ADDQ(ldc, c)
			}
			for v, r := range acc[m] {
				f(r, Mem{Base: c, Disp: width * v})
			}
		}
	}
}

// dot8Open emits an int8-dot kernel's opening: its chains from the tile
// in c (flags bit 0) or from zero, then the head of the group loop (to
// name_store when no group is left) with, for the K kinds, a super-block's
// start. It returns the groups left and the byte offset into the panels.
func dot8Open(name string, acc [][]VecVirtual, tile func(func(VecVirtual, Mem)), src dot8Src) (g, o GPVirtual) {
	outerStart(name, acc, func() { tile(func(r VecVirtual, at Mem) { VMOVUPS(at, r) }) })
	g = Load(Param("groups"), GP64()).(GPVirtual)
	o = GP64() // byte offset into each panel
	XORQ(o, o)

	Label(name + "_group")
	TESTQ(g, g)
	JZ(LabelRef(name + "_store"))
	if src.super {
		Comment("A super-block's start: its header, then its groups' factors.")
		TESTQ(src.left, src.left)
		JNZ(LabelRef(name + "_factors"))
		MOVQ(src.meta, src.hdr)
		ADDQ(U32(src.hdrBytes), src.meta)
		Load(Param("per"), src.left)
		Label(name + "_factors")
	}
	return g, o
}

func dot8Kernels() {
	for _, kind := range append(dot8Kinds, dot8VBMIKind) {
		for mr := 1; mr <= maxDot8MR; mr++ {
			for np := 1; np <= dot8NP(mr); np++ {
				dot8Kernel(kind, mr, np)
			}
		}
	}
}

// dot8VBMIKind is MXFP4's kernels for CPUs with AVX512_VBMI beside VNNI
// (kernels' dot8AVX512M4V, which replaces dot8AVX512's m4 there): the
// nibbles looked up by vpermb, 3 instructions a weight vector pair where
// the masks and vpshufb take 5; the same codes, so the same bits.
const dot8VBMIKind = "M4V"

// writeDot8Table appends the Go table of the int8-dot kernels to b, and
// the VBMI MXFP4 kernels' table.
func writeDot8Table(b *bytes.Buffer) {
	writeKernelTable(b, "AVX-512 VNNI int8-dot kernels", "dot8AVX512", maxDot8MR, dot8NP, func(kind string, mr, np int) string {
		return fmt.Sprintf("dot8AVX512%sx%dp%d", kind, mr, np)
	})
	fmt.Fprintf(b, "// dot8AVX512M4V holds the AVX-512 VNNI int8-dot kernels for MXFP4 that need AVX512_VBMI.\nvar dot8AVX512M4V = dot8Table{\n")
	for mr := 1; mr <= maxDot8MR; mr++ {
		fmt.Fprintf(b, "%d: {", mr)
		for np := 1; np <= dot8NP(mr); np++ {
			fmt.Fprintf(b, "%d: dot8AVX512%sx%dp%d, ", np, dot8VBMIKind, mr, np)
		}
		b.WriteString("},\n")
	}
	b.WriteString("}\n")
}

// dot8Close emits an int8-dot kernel's end: the group's scales (or the
// K kinds' factors) passed, the loop's next group, and the tile stored.
func dot8Close(name string, tile func(func(VecVirtual, Mem)), g GPVirtual, src dot8Src) {
	if src.super {
		ADDQ(U32(src.grpBytes), src.meta)
		DECQ(src.left)
	} else {
		ADDQ(paramAddr("ss"), src.s)
		if src.o != nil {
			ADDQ(paramAddr("ss"), src.o)
		}
	}
	DECQ(g)
	JMP(LabelRef(name + "_group"))

	Label(name + "_store")
	tile(func(r VecVirtual, at Mem) { VMOVUPS(r, at) })
	VZEROUPPER()
	RET()
}

// writeKernelTable appends to b the Go table v of int8-dot kernels: for
// each kind, rows 1…maxMR, the panel counts nps(mr) named by name.
func writeKernelTable(b *bytes.Buffer, doc, v string, maxMR int, nps func(mr int) int, name func(kind string, mr, np int) string) {
	fmt.Fprintf(b, "// %s holds the %s.\nvar %s = dot8Kernels{\n", v, doc, v)
	for _, kind := range dot8Kinds {
		typ := "dot8Table"
		if strings.Contains(kind, "K") {
			typ = "dot8KTable"
		}
		fmt.Fprintf(b, "%s: %s{\n", dot8Field(kind), typ)
		for mr := 1; mr <= maxMR; mr++ {
			fmt.Fprintf(b, "%d: {", mr)
			for np := 1; np <= nps(mr); np++ {
				fmt.Fprintf(b, "%d: %s, ", np, name(kind, mr, np))
			}
			b.WriteString("},\n")
		}
		b.WriteString("},\n")
	}
	b.WriteString("}\n")
}
