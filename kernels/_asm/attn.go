package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// Grouped-query attention over an attention cache read in place (AVX-512):
// a head's keys and values are runs of a cache row, kd or vd values of the
// cache's dtype, rows stride bytes apart. Two kernels, each in the order
// of the kernels it stands for, so that their bits are those of widening
// the rows to fp32 first:
//
//   - attnScores: the scores of 4 query rows against 4 keys at a time,
//     each the lane-ordered dot product of the dot kernels (dot.go: lane j
//     sums k ≡ j mod 16 by FMA in ascending k; the lanes then added j+8,
//     j+4, j+2, j+1). The 16 accumulators are reduced together, each pair
//     of lanes the halving adds meeting in one vector add, so the sums are
//     the halving's, at 45 instructions for 16 outputs instead of 128.
//   - attnWeigh: the probabilities times the values, an FMA chain a value
//     over the rows in ascending order (the packed GEMM's chain, outer.go,
//     with the values as its k steps), continued from part, or from zero
//     and then added to part.

// attnDims are the head dimensions the kernels are made for.
var attnDims = []int{64, 128, 256, 512, 576}

func attnKernels() {
	maxMin()
	for _, dt := range []string{"F32", "BF16", "F16"} {
		for _, d := range attnDims {
			attnScores(dt, d)
			for _, rows := range []int{4, 8} {
				attnWeigh(dt, d, rows)
			}
		}
	}
}

// attnLoad widens 16 values of dtype dt at m into v.
func attnLoad(dt string, m Mem, v VecVirtual) {
	switch dt {
	case "F32":
		VMOVUPS(m, v)
	case "BF16":
		VPMOVZXWD(m, v)
		VPSLLD(U8(16), v, v)
	case "F16":
		VCVTPH2PS(m, v)
	}
}

func attnSize(dt string) int {
	if dt == "F32" {
		return 4
	}
	return 2
}

// attnScores emits attnScoresAVX512<dt>D<kd>: for n keys (a multiple of
// 4) at keys, stride bytes apart, out[m·ldo + j] = q[m]·key j for the 4
// query rows of q ([4, kd] fp32); ldo in bytes.
func attnScores(dt string, kd int) {
	name := fmt.Sprintf("attnScoresAVX512%sD%d", dt, kd)
	TEXT(name, NOSPLIT, "func(q *float32, keys *byte, stride int, n int, out *float32, ldo int)")
	Pragma("noescape")
	Doc(fmt.Sprintf("%s computes the lane-ordered dot products of 4 fp32 rows of %d with n %s keys, 4 at a time.", name, kd, dt))
	q := Load(Param("q"), GP64())
	kp := Load(Param("keys"), GP64())
	stride := Load(Param("stride"), GP64())
	n := Load(Param("n"), GP64())
	out := Load(Param("out"), GP64())
	ldo := Load(Param("ldo"), GP64())
	ldo3 := GP64()
	LEAQ(Mem{Base: ldo, Index: ldo, Scale: 2}, ldo3)
	es := attnSize(dt)

	Label(name + "_loop")
	CMPQ(n, U8(4))
	JL(LabelRef(name + "_done"))
	k := [4]Register{kp, GP64(), GP64(), GP64()}
	LEAQ(Mem{Base: kp, Index: stride, Scale: 1}, k[1])
	LEAQ(Mem{Base: kp, Index: stride, Scale: 2}, k[2])
	LEAQ(Mem{Base: k[1], Index: stride, Scale: 2}, k[3])
	var acc [4][4]VecVirtual // [query row][key]
	for m := range acc {
		for c := range acc[m] {
			acc[m][c] = ZMM()
			VXORPS(acc[m][c], acc[m][c], acc[m][c])
		}
	}
	for s := 0; s < kd/16; s++ {
		var qv, kv [4]VecVirtual
		for m := range qv {
			qv[m] = ZMM()
			VMOVUPS(Mem{Base: q, Disp: 4 * (m*kd + 16*s)}, qv[m])
		}
		for c := range kv {
			kv[c] = ZMM()
			attnLoad(dt, Mem{Base: k[c], Disp: es * 16 * s}, kv[c])
		}
		for m := range acc {
			for c := range acc[m] {
				VFMADD231PS(kv[c], qv[m], acc[m][c])
			}
		}
	}
	Comment("Reduce the 16 accumulators together: lanes j+8, j+4, j+2, j+1.")
	add := func(imm1, imm2 uint8, shuf func(...Op), b, a VecVirtual) VecVirtual {
		lo, hi := ZMM(), ZMM()
		shuf(U8(imm1), b, a, lo)
		shuf(U8(imm2), b, a, hi)
		VADDPS(hi, lo, lo)
		return lo
	}
	var x [4]VecVirtual
	for c := range x {
		// [acc(0,c) lanes j + j+8 | acc(1,c)'s], then rows 2 and 3.
		p := add(0x44, 0xee, VSHUFF64X2, acc[1][c], acc[0][c])
		r := add(0x44, 0xee, VSHUFF64X2, acc[3][c], acc[2][c])
		// 128-bit lane m: row m's lanes j + j+4.
		x[c] = add(0x88, 0xdd, VSHUFF64X2, r, p)
	}
	v := add(0x44, 0xee, VSHUFPS, x[1], x[0]) // lane m: (m, 0)'s j + j+2, (m, 1)'s
	w := add(0x44, 0xee, VSHUFPS, x[3], x[2])
	res := add(0x88, 0xdd, VSHUFPS, w, v) // lane m: (m, 0..3)
	VMOVUPS(res.AsX(), Mem{Base: out})
	VEXTRACTF32X4(U8(1), res, Mem{Base: out, Index: ldo, Scale: 1})
	VEXTRACTF32X4(U8(2), res, Mem{Base: out, Index: ldo, Scale: 2})
	VEXTRACTF32X4(U8(3), res, Mem{Base: out, Index: ldo3, Scale: 1})
	ADDQ(U8(16), out)
	LEAQ(Mem{Base: k[3], Index: stride, Scale: 1}, kp)
	SUBQ(U8(4), n)
	JMP(LabelRef(name + "_loop"))
	Label(name + "_done")
	VZEROUPPER()
	RET()
}

// attnWeigh emits attnWeighAVX512<dt>D<vd>R<rows>: for n values at vals,
// stride bytes apart, the FMA chain over ascending j of Σ_j p[m·ldp + j]·
// value j [x] for its rows rows m, from part[m·vd + x] (add 0: the chain
// continued, stored back) or from zero (add 1: the chain then added to
// part in one rounding); ldp in bytes. 16 accumulators: rows × 16/rows
// vectors of values at a time.
func attnWeigh(dt string, vd, rows int) {
	name := fmt.Sprintf("attnWeighAVX512%sD%dR%d", dt, vd, rows)
	TEXT(name, NOSPLIT, "func(p *float32, ldp int, vals *byte, stride int, n int, part *float32, add int)")
	Pragma("noescape")
	Doc(fmt.Sprintf("%s continues in %d rows of part (fp32, %d a row), or adds to them, the FMA chains of p's rows times n %s values.", name, rows, vd, dt))
	es := attnSize(dt)
	nv := 16 / rows // vectors of values a pass
	part := Load(Param("part"), GP64())
	add := Load(Param("add"), GP64())
	for pass := 0; pass < vd/(16*nv); pass++ {
		x0 := 16 * nv * pass // the pass's first value
		acc := make([][]VecVirtual, rows)
		for m := range acc {
			acc[m] = make([]VecVirtual, nv)
			for u := range acc[m] {
				acc[m][u] = ZMM()
			}
		}
		lbl := fmt.Sprintf("%s_p%d", name, pass)
		TESTQ(add, add)
		JNZ(LabelRef(lbl + "_zero"))
		for m := range acc {
			for u := range acc[m] {
				VMOVUPS(Mem{Base: part, Disp: 4 * (m*vd + x0 + 16*u)}, acc[m][u])
			}
		}
		JMP(LabelRef(lbl + "_start"))
		Label(lbl + "_zero")
		for m := range acc {
			for u := range acc[m] {
				VXORPS(acc[m][u], acc[m][u], acc[m][u])
			}
		}
		Label(lbl + "_start")
		// Row m's probabilities at p + m·ldp: bases p, p + 3·ldp and
		// p + 6·ldp, with ldp scaled by 1, 2 or 4 where needed.
		p := Load(Param("p"), GP64())
		ldp := Load(Param("ldp"), GP64())
		var p3, p6 Register
		if rows > 3 {
			p3 = GP64()
			LEAQ(Mem{Base: p, Index: ldp, Scale: 2}, p3)
			ADDQ(ldp, p3)
		}
		if rows > 6 {
			p6 = GP64()
			LEAQ(Mem{Base: p3, Index: ldp, Scale: 2}, p6)
			ADDQ(ldp, p6)
		}
		row := func(m int) Mem {
			switch m {
			case 0:
				return Mem{Base: p}
			case 1, 2, 4:
				return Mem{Base: p, Index: ldp, Scale: uint8(m)}
			case 3:
				return Mem{Base: p3}
			case 5:
				return Mem{Base: p3, Index: ldp, Scale: 2}
			case 6:
				return Mem{Base: p6}
			default:
				return Mem{Base: p6, Index: ldp, Scale: 1}
			}
		}
		vp := Load(Param("vals"), GP64())
		stride := Load(Param("stride"), GP64())
		n := Load(Param("n"), GP64())
		Label(lbl)
		TESTQ(n, n)
		JZ(LabelRef(lbl + "_done"))
		vals := make([]VecVirtual, nv)
		for u := range vals {
			vals[u] = ZMM()
			attnLoad(dt, Mem{Base: vp, Disp: es * (x0 + 16*u)}, vals[u])
		}
		for m := range acc {
			b := ZMM()
			VBROADCASTSS(row(m), b)
			for u := range acc[m] {
				VFMADD231PS(vals[u], b, acc[m][u])
			}
		}
		ADDQ(U8(4), p)
		if rows > 3 {
			ADDQ(U8(4), p3)
		}
		if rows > 6 {
			ADDQ(U8(4), p6)
		}
		ADDQ(stride, vp)
		DECQ(n)
		JMP(LabelRef(lbl))
		Label(lbl + "_done")
		TESTQ(add, add)
		JZ(LabelRef(lbl + "_store"))
		for m := range acc {
			for u := range acc[m] {
				VADDPS(Mem{Base: part, Disp: 4 * (m*vd + x0 + 16*u)}, acc[m][u], acc[m][u])
			}
		}
		Label(lbl + "_store")
		for m := range acc {
			for u := range acc[m] {
				VMOVUPS(acc[m][u], Mem{Base: part, Disp: 4 * (m*vd + x0 + 16*u)})
			}
		}
	}
	VZEROUPPER()
	RET()
}

// maxMin emits maxMinAVX512: for n values at x (a multiple of 16, at
// least 16), out[0:16] the lanes' maxima, out[16:32] their minima and
// out[32:48] their sums of v − v (NaN where a value is not finite).
func maxMin() {
	TEXT("maxMinAVX512", NOSPLIT, "func(x *float32, n int, out *[48]float32)")
	Pragma("noescape")
	Doc("maxMinAVX512 writes the lane maxima, minima and non-finite checks of n fp32 values (see MaxMin).")
	x := Load(Param("x"), GP64())
	n := Load(Param("n"), GP64())
	hi, lo, chk := ZMM(), ZMM(), ZMM()
	VMOVUPS(Mem{Base: x}, hi)
	VMOVUPS(hi, lo)
	VSUBPS(hi, hi, chk)
	ADDQ(U8(64), x)
	SUBQ(U8(16), n)
	Label("maxMinAVX512_loop")
	TESTQ(n, n)
	JZ(LabelRef("maxMinAVX512_done"))
	v, d := ZMM(), ZMM()
	VMOVUPS(Mem{Base: x}, v)
	VMAXPS(v, hi, hi)
	VMINPS(v, lo, lo)
	VSUBPS(v, v, d)
	VADDPS(d, chk, chk)
	ADDQ(U8(64), x)
	SUBQ(U8(16), n)
	JMP(LabelRef("maxMinAVX512_loop"))
	Label("maxMinAVX512_done")
	out := Load(Param("out"), GP64())
	VMOVUPS(hi, Mem{Base: out})
	VMOVUPS(lo, Mem{Base: out, Disp: 64})
	VMOVUPS(chk, Mem{Base: out, Disp: 128})
	VZEROUPPER()
	RET()
}
