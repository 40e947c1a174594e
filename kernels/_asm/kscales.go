package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The exact mode's scales from the K-quants' factors: a packed matrix
// holds its scales (and offsets) only as the factors (kernels' kmeta, the
// int8-dot layout: a super-block's d and −dmin for 16 rows a panel, then
// each group's int8 sc and m), and a call makes the fp32 ones its kernels
// read, d·sc and −dmin·m (exact products), for the groups it runs.

// kscalesKernel emits kscales<isa><M>: for groups groups of one panel,
// scales to s (and with offsets the offsets to o), 16 floats a group,
// moving on ss bytes a group. base is the current super-block's start
// (d at base + 4·lane, −dmin 256 bytes on), fac its next group's factors
// (sc at fac + lane, m 64 bytes on), left the groups of the super-block
// from fac on; per the groups of a super-block.
func kscalesKernel(is isa, offsets bool) {
	name := "kscales" + is.name
	hdr, grp := 256, 64
	if offsets {
		name += "M"
		hdr, grp = 512, 128
	}
	TEXT(name, NOSPLIT, "func(s *float32, o *float32, base *byte, fac *byte, lane int, left int, per int, groups int, ss int)")
	Pragma("noescape")
	Doc(fmt.Sprintf("%s writes a panel's fp32 scales%s for groups groups from the K-quants' factors (see kernels' kscales).", name,
		map[bool]string{true: " and offsets", false: ""}[offsets]))
	s := Load(Param("s"), GP64())
	var o GPVirtual
	if offsets {
		o = GP64()
		Load(Param("o"), o)
	}
	base := Load(Param("base"), GP64())
	fac := Load(Param("fac"), GP64())
	lane := Load(Param("lane"), GP64())
	left := Load(Param("left"), GP64())
	n := Load(Param("groups"), GP64())
	ss := Load(Param("ss"), GP64())
	Label(name + "_loop")
	TESTQ(n, n)
	JZ(LabelRef(name + "_done"))
	TESTQ(left, left)
	JNZ(LabelRef(name + "_group"))
	Comment("The next super-block: its header, then its groups.")
	MOVQ(fac, base)
	LEAQ(Mem{Base: fac, Disp: hdr}, fac)
	Load(Param("per"), left)
	Label(name + "_group")
	for v := range panelWidth / is.lanes {
		for h, dst := range []Register{s, o} {
			if h == 1 && !offsets {
				continue
			}
			x := is.vec()
			VPMOVSXBD(Mem{Base: fac, Index: lane, Scale: 1, Disp: 64*h + is.lanes*v}, x)
			VCVTDQ2PS(x, x)
			VMULPS(Mem{Base: base, Index: lane, Scale: 4, Disp: 256*h + 4*is.lanes*v}, x, x)
			VMOVUPS(x, Mem{Base: dst, Disp: 4 * is.lanes * v})
		}
	}
	ADDQ(U32(grp), fac)
	ADDQ(ss, s)
	if offsets {
		ADDQ(ss, o)
	}
	DECQ(left)
	DECQ(n)
	JMP(LabelRef(name + "_loop"))
	Label(name + "_done")
	VZEROUPPER()
	RET()
}

func kscalesKernels(is isa) {
	kscalesKernel(is, false)
	kscalesKernel(is, true)
	halfRunsKernel(is)
	e8RunsKernel(is)
}

// halfRunsKernel emits halfRuns<isa>: the exact mode's fp32 scales (or
// offsets) of a call from a packed matrix's fp16 ones (kernels' h16): runs
// runs of n values (a multiple of 16), widened exactly (vcvtph2ps), from
// src moving on ss bytes a run to dst moving on ds bytes a run.
func halfRunsKernel(is isa) {
	name := "halfRuns" + is.name
	TEXT(name, NOSPLIT, "func(dst *float32, src *uint16, runs int, n int, ss int, ds int)")
	Pragma("noescape")
	Doc(fmt.Sprintf("%s widens runs runs of n fp16 values at src (ss bytes apart) to fp32 at dst (ds bytes apart), exactly (see kernels' kscales).", name))
	dst := Load(Param("dst"), GP64())
	src := Load(Param("src"), GP64())
	runs := Load(Param("runs"), GP64())
	ss := Load(Param("ss"), GP64())
	ds := Load(Param("ds"), GP64())
	Label(name + "_run")
	TESTQ(runs, runs)
	JZ(LabelRef(name + "_done"))
	n := Load(Param("n"), GP64())
	i := GP64()
	XORQ(i, i)
	Label(name + "_loop")
	// A call's runs are one stream (see kernels' kscales): the lines
	// 1 KiB on, so that the pass does not wait on memory line by line.
	PREFETCHT0(Mem{Base: src, Index: i, Scale: 2, Disp: 1024})
	for v := range panelWidth / is.lanes {
		x := is.vec()
		VCVTPH2PS(Mem{Base: src, Index: i, Scale: 2, Disp: 2 * is.lanes * v}, x)
		VMOVUPS(x, Mem{Base: dst, Index: i, Scale: 4, Disp: 4 * is.lanes * v})
	}
	ADDQ(U8(panelWidth), i)
	CMPQ(i, n)
	JB(LabelRef(name + "_loop"))
	ADDQ(ss, src)
	ADDQ(ds, dst)
	DECQ(runs)
	JMP(LabelRef(name + "_run"))
	Label(name + "_done")
	VZEROUPPER()
	RET()
}

// e8RunsKernel emits e8Runs<isa>: the exact mode's fp32 scales of a call
// from a packed MXFP4 matrix's E8M0 exponents (kernels' e8): runs runs of
// n bytes (a multiple of 16), each E made 2^(E−127) exactly, from src
// moving on ss bytes a run to dst moving on ds bytes a run. The value is
// the product of two normal floats, 2^(⌊E/2⌋−63) and 2^(E−⌊E/2⌋−64),
// so that E = 0 (2^−127, subnormal) is exact too.
func e8RunsKernel(is isa) {
	name := "e8Runs" + is.name
	TEXT(name, NOSPLIT, "func(dst *float32, src *uint8, runs int, n int, ss int, ds int)")
	Pragma("noescape")
	Doc(fmt.Sprintf("%s makes runs runs of n E8M0 exponents at src (ss bytes apart) into the scales 2^(E−127) at dst (ds bytes apart), exactly (see kernels' kscales).", name))
	dst := Load(Param("dst"), GP64())
	src := Load(Param("src"), GP64())
	runs := Load(Param("runs"), GP64())
	ss := Load(Param("ss"), GP64())
	ds := Load(Param("ds"), GP64())
	c64, c63 := splat(is.lanes, 64), splat(is.lanes, 63)
	Label(name + "_run")
	TESTQ(runs, runs)
	JZ(LabelRef(name + "_done"))
	n := Load(Param("n"), GP64())
	i := GP64()
	XORQ(i, i)
	Label(name + "_loop")
	PREFETCHT0(Mem{Base: src, Index: i, Scale: 1, Disp: 512})
	for v := range panelWidth / is.lanes {
		e, h := is.vec(), is.vec()
		VPMOVZXBD(Mem{Base: src, Index: i, Scale: 1, Disp: is.lanes * v}, e)
		VPSRLD(U8(1), e, h)
		VPSUBD(h, e, e)
		VPADDD(c64, h, h)
		VPADDD(c63, e, e)
		VPSLLD(U8(23), h, h)
		VPSLLD(U8(23), e, e)
		VMULPS(h, e, e)
		VMOVUPS(e, Mem{Base: dst, Index: i, Scale: 4, Disp: 4 * is.lanes * v})
	}
	ADDQ(U8(panelWidth), i)
	CMPQ(i, n)
	JB(LabelRef(name + "_loop"))
	ADDQ(ss, src)
	ADDQ(ds, dst)
	DECQ(runs)
	JMP(LabelRef(name + "_run"))
	Label(name + "_done")
	VZEROUPPER()
	RET()
}
