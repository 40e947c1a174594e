package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The int8-dot mode's activation quantizer (kernels/dot8.go's
// quantizeRow) on AVX-512: per block of 32, amax = max|x| (vmaxps, exact
// whatever the order), d = amax/127 and its inverse (0 for d = 0) in
// fp32 scalars as the Go code divides, q = x·(1/d) kept in [−127, 127]
// (0 where NaN) and rounded to nearest even (vcvtps2dq under Go's default
// rounding), then each group's record: its g codes, d, d·float32(S),
// 128·S and a zero word. The same bytes as the Go loop (a NaN's payload
// aside).

// quant8Scale emits, from the magnitudes' bits in the 8 lanes of y, the
// block's d = amax/127 and 1/d (0 where d is 0) in lane 0 of each: amax
// by vpmaxud, the divisions in fp32 scalars as the Go loop divides. one
// holds 1.0 and zero 0 in lane 0.
func quant8Scale(y VecVirtual, c127 Op, one, zero VecVirtual) (d, id VecVirtual) {
	v := XMM()
	VEXTRACTI128(U8(1), y, v)
	VPMAXUD(v, y.AsX(), v)
	w := XMM()
	VPSHUFD(U8(0x4E), v, w)
	VPMAXUD(w, v, v)
	VPSHUFD(U8(0xB1), v, w)
	VPMAXUD(w, v, v) // amax in lane 0
	d, id, nz := XMM(), XMM(), XMM()
	VDIVSS(c127, v, d) // d = amax/127
	VDIVSS(d, one, id) // 1/d
	VCMPSS(U8(4), zero, d, nz)
	VANDPS(nz, id, id) // 0 where d = 0
	return d, id
}

// quant8Record emits a group's record at at: its codes (written by
// codes), d, d·float32(S) and 128·S (S lane 0 of sum), a zero word.
func quant8Record(at Mem, g int, d VecVirtual, codes func(at Mem), sum VecVirtual) {
	codes(at)
	s := GP32()
	VMOVD(sum, s)
	f := XMM()
	VCVTSI2SSL(s, f, f)
	VMULSS(d, f, f)
	VMOVSS(d, at.Offset(g))
	VMOVSS(f, at.Offset(g+4))
	SHLL(U8(7), s)
	MOVL(s, at.Offset(g+8))
	MOVL(U32(0), at.Offset(g+12))
}

// hsum8 adds the 8 int32 lanes of y into lane 0 of the result.
func hsum8(y VecVirtual) VecVirtual {
	v := XMM()
	VEXTRACTI128(U8(1), y, v)
	VPADDD(v, y.AsX(), v)
	w := XMM()
	VPSHUFD(U8(0x4E), v, w)
	VPADDD(w, v, v)
	VPSHUFD(U8(0xB1), v, w)
	VPADDD(w, v, v)
	return v
}

// quant8Kernel emits quant8AVX512G<g>: blocks blocks of 32 from x into
// records of g+16 bytes at out.
func quant8Kernel(g int) {
	name := fmt.Sprintf("quant8AVX512G%d", g)
	out, x, n := quant8Text(name, fmt.Sprintf("%s quantizes blocks blocks of 32 activations at x into int8-dot records for groups of %d at out (see quantizeRow).", name, g))
	abs := splat(16, 0x7FFFFFFF)
	hi, lo := splat(16, 0x42FE0000), splat(16, 0xC2FE0000) // ±127.0
	t := GP32()
	c127, one, zero := XMM(), XMM(), XMM()
	MOVL(U32(0x42FE0000), t) // 127.0
	VMOVD(t, c127)
	MOVL(U32(0x3F800000), t) // 1.0
	VMOVD(t, one)
	VXORPS(zero, zero, zero)
	rec := g + 16
	quant8Block(name, g, x, out, n, func() {
		a0, a1 := ZMM(), ZMM()
		VMOVUPS(Mem{Base: x}, a0)
		VMOVUPS(Mem{Base: x, Disp: 64}, a1)
		// amax on the magnitudes' bits (vpmaxud): the same order as the
		// floats', and a NaN, above every other, is kept as Go's max keeps it.
		m := ZMM()
		m1 := ZMM()
		VPANDD(abs, a0, m)
		VPANDD(abs, a1, m1)
		VPMAXUD(m1, m, m)
		y := YMM()
		VEXTRACTI64X4(U8(1), m, y)
		VPMAXUD(y, m.AsY(), y)
		d, id := quant8Scale(y, c127, one, zero)
		ib := ZMM()
		VBROADCASTSS(id, ib)
		// q: x·(1/d) kept in [−127, 127] (±∞ there too), NaN lanes (0·∞)
		// zero, rounded to nearest even.
		q := []VecVirtual{ZMM(), ZMM()}
		for i, a := range []VecVirtual{a0, a1} {
			VMULPS(ib, a, q[i])
			k := K()
			VCMPPS(U8(7), q[i], q[i], k) // ordered: not NaN
			VMINPS(hi, q[i], q[i])
			VMAXPS(lo, q[i], q[i])
			VCVTPS2DQ_Z(q[i], k, q[i])
		}
		// Each group's codes and sum: g lanes of q.
		record := func(r int, codes func(at Mem), sum VecVirtual) {
			quant8Record(Mem{Base: out, Disp: r * rec}, g, d, codes, sum)
		}
		halves := func(z VecVirtual) (lo, hi VecVirtual) {
			hi = YMM()
			VEXTRACTI64X4(U8(1), z, hi)
			return z.AsY().(VecVirtual), hi
		}
		switch g {
		case 32:
			s := ZMM()
			VPADDD(q[1], q[0], s)
			l, h := halves(s)
			y := YMM()
			VPADDD(h, l, y)
			record(0, func(at Mem) {
				VPMOVSDB(q[0], at)
				VPMOVSDB(q[1], at.Offset(16))
			}, hsum8(y))
		case 16:
			for i := range 2 {
				l, h := halves(q[i])
				y := YMM()
				VPADDD(h, l, y)
				record(i, func(at Mem) { VPMOVSDB(q[i], at) }, hsum8(y))
			}
		case 8:
			for i := range 2 {
				l, h := halves(q[i])
				for j, part := range []VecVirtual{l, h} {
					record(2*i+j, func(at Mem) { VPMOVSDB(part, at) }, hsum8(part))
				}
			}
		}
	})
}

func quant8Kernels() {
	for _, g := range []int{8, 16, 32} {
		quant8Kernel(g)
	}
}

// quant8AVX2Kernel emits quant8AVX2G<g>: quant8AVX512G<g> on AVX2, the
// same bytes. Four vectors of eight a block; NaN lanes zeroed by an
// ordered-compare mask; the codes packed to bytes (vpackssdw, vpacksswb)
// and put back in order (vpermd).
func quant8AVX2Kernel(g int) {
	name := fmt.Sprintf("quant8AVX2G%d", g)
	out, x, n := quant8Text(name, fmt.Sprintf("%s is quant8AVX512G%d on AVX2: the same bytes.", name, g))
	// The constants in memory (16 registers are few): the magnitude mask,
	// ±127.0, 127.0 and 1.0 as scalars, and the order of the packed
	// bytes' dwords (vpermd).
	if g == 8 {
		table := func(name string, v func(i int) uint32) Mem {
			m := GLOBL(name, RODATA|NOPTR)
			for i := range 8 {
				DATA(4*i, U32(v(i)))
			}
			return m
		}
		quant8Consts.abs = table("quant8Abs", func(int) uint32 { return 0x7FFFFFFF })
		quant8Consts.hi = table("quant8Hi", func(int) uint32 { return 0x42FE0000 })
		quant8Consts.lo = table("quant8Lo", func(int) uint32 { return 0xC2FE0000 })
		quant8Consts.order = table("quant8Order", func(i int) uint32 { return []uint32{0, 4, 1, 5, 2, 6, 3, 7}[i] })
		quant8Consts.one = table("quant8One", func(int) uint32 { return 0x3F800000 })
	}
	abs, hi, lo, c127 := quant8Consts.abs, quant8Consts.hi, quant8Consts.lo, quant8Consts.hi
	rec := g + 16
	quant8Block(name, g, x, out, n, func() {
		a := make([]VecVirtual, 4)
		m := YMM()
		for i := range a {
			a[i] = YMM()
			VMOVUPS(Mem{Base: x, Disp: 32 * i}, a[i])
			if i == 0 {
				VPAND(abs, a[i], m)
				continue
			}
			u := YMM()
			VPAND(abs, a[i], u)
			VPMAXUD(u, m, m)
		}
		zero, one := XMM(), XMM()
		VXORPS(zero, zero, zero)
		VMOVSS(quant8Consts.one, one)
		d, id := quant8Scale(m, c127, one, zero)
		ib := YMM()
		VBROADCASTSS(id, ib)
		q := a // in place
		for i := range a {
			VMULPS(ib, a[i], q[i])
			ord := YMM()
			VCMPPS(U8(7), q[i], q[i], ord) // ordered: not NaN
			VMINPS(hi, q[i], q[i])
			VMAXPS(lo, q[i], q[i])
			VCVTPS2DQ(q[i], q[i])
			VPAND(ord, q[i], q[i])
		}
		p01, p23, bytes := YMM(), YMM(), YMM()
		VPACKSSDW(q[1], q[0], p01)
		VPACKSSDW(q[3], q[2], p23)
		VPACKSSWB(p23, p01, bytes)
		order := YMM()
		VMOVDQU(quant8Consts.order, order)
		VPERMD(bytes, order, bytes) // x[0…31]'s codes in order
		record := func(r int, codes func(at Mem), sum VecVirtual) {
			quant8Record(Mem{Base: out, Disp: r * rec}, g, d, codes, sum)
		}
		add := func(a, b VecVirtual) VecVirtual {
			s := YMM()
			VPADDD(b, a, s)
			return s
		}
		high := XMM()
		VEXTRACTI128(U8(1), bytes, high)
		switch g {
		case 32:
			record(0, func(at Mem) { VMOVDQU(bytes, at) }, hsum8(add(add(q[0], q[1]), add(q[2], q[3]))))
		case 16:
			record(0, func(at Mem) { VMOVDQU(bytes.AsX(), at) }, hsum8(add(q[0], q[1])))
			record(1, func(at Mem) { VMOVDQU(high, at) }, hsum8(add(q[2], q[3])))
		case 8:
			for i := range 4 {
				src := bytes.AsX()
				if i >= 2 {
					src = high
				}
				record(i, func(at Mem) {
					if i%2 == 0 {
						VMOVQ(src, at)
					} else {
						VPEXTRQ(U8(1), src, at)
					}
				}, hsum8(q[i]))
			}
		}
	})
}

// quant8Consts are the AVX2 quantizer's constants (see quant8AVX2Kernel).
var quant8Consts struct{ abs, hi, lo, one, order Mem }

func quant8AVX2Kernels() {
	for _, g := range []int{8, 16, 32} {
		quant8AVX2Kernel(g)
	}
}

// quant8Text declares a quantizer kernel name (doc its comment) and loads
// its parameters: the records' out, the activations' x and the blocks n.
func quant8Text(name, doc string) (out, x, n GPVirtual) {
	TEXT(name, NOSPLIT, "func(out *byte, x *float32, blocks int)")
	Pragma("noescape")
	Doc(doc)
	return Load(Param("out"), GP64()).(GPVirtual), Load(Param("x"), GP64()).(GPVirtual), Load(Param("blocks"), GP64()).(GPVirtual)
}

// quant8Block emits a quantizer's loop: block, for each of the n blocks
// of 32 activations at x, then x and out moved on to the next block and
// its records (groups of g), and the kernel's end.
func quant8Block(name string, g int, x, out, n GPVirtual, block func()) {
	Label(name + "_block")
	TESTQ(n, n)
	JZ(LabelRef(name + "_done"))
	block()
	ADDQ(U32(128), x)
	ADDQ(U32(32/g*(g+16)), out)
	DECQ(n)
	JMP(LabelRef(name + "_block"))
	Label(name + "_done")
	VZEROUPPER()
	RET()
}
