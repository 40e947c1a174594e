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
	bf16RunsKernel(is)
	e8RunsKernel(is)
}

// bf16RunsKernel emits bf16Runs<isa>: runs of bf16 values widened to fp32
// (the bits moved up 16, exact), src moving on ss bytes a run and dst on
// ds: an attention cache's rows, one key/value head's columns of each.
func bf16RunsKernel(is isa) {
	runsKernel(is, "bf16Runs", "*uint16", 2, "widens runs runs of n bf16 values at src (ss bytes apart) to fp32", func() func(Mem) VecVirtual {
		return func(at Mem) VecVirtual {
			x := is.vec()
			VPMOVZXWD(at, x)
			VPSLLD(U8(16), x, x)
			return x
		}
	})
}

// halfRunsKernel emits halfRuns<isa>: the exact mode's fp32 scales (or
// offsets) of a call from a packed matrix's fp16 ones (kernels' h16): runs
// runs of n values (a multiple of 16), widened exactly (vcvtph2ps), from
// src moving on ss bytes a run to dst moving on ds bytes a run.
func halfRunsKernel(is isa) {
	runsKernel(is, "halfRuns", "*uint16", 2, "widens runs runs of n fp16 values at src (ss bytes apart) to fp32", func() func(Mem) VecVirtual {
		return func(at Mem) VecVirtual {
			x := is.vec()
			VCVTPH2PS(at, x)
			return x
		}
	})
}

// e8RunsKernel emits e8Runs<isa>: the exact mode's fp32 scales of a call
// from a packed MXFP4 matrix's E8M0 exponents (kernels' e8): runs runs of
// n bytes (a multiple of 16), each E made 2^(E−127) exactly (see e8Pow:
// E = 0's subnormal 2^−127 too), from src moving on ss bytes a run to dst
// moving on ds bytes a run.
func e8RunsKernel(is isa) {
	runsKernel(is, "e8Runs", "*uint8", 1, "makes runs runs of n E8M0 exponents at src (ss bytes apart) into the scales 2^(E−127)", func() func(Mem) VecVirtual {
		c64, c63 := splat(is.lanes, 64), splat(is.lanes, 63)
		return func(at Mem) VecVirtual { return e8Pow(is.vec, at, c64, c63) }
	})
}

// runsKernel emits name<isa>(dst *float32, src srcType, runs, n, ss, ds
// int): runs runs of n values (a multiple of 16, elem bytes each at src)
// made fp32 by the widen that prep returns (is.lanes of them from at;
// prep emits its constants, ahead of the loops) into dst, src moving on ss
// bytes a run and dst on ds. A call's runs are one stream (see kernels'
// kscales): each loop prefetches the line 512 values on, so that the pass
// does not wait on memory line by line.
func runsKernel(is isa, name, srcType string, elem int, doc string, prep func() func(at Mem) VecVirtual) {
	name += is.name
	TEXT(name, NOSPLIT, fmt.Sprintf("func(dst *float32, src %s, runs int, n int, ss int, ds int)", srcType))
	Pragma("noescape")
	Doc(fmt.Sprintf("%s %s at dst (ds bytes apart), exactly (see kernels' kscales).", name, doc))
	dst := Load(Param("dst"), GP64())
	src := Load(Param("src"), GP64())
	runs := Load(Param("runs"), GP64())
	ss := Load(Param("ss"), GP64())
	ds := Load(Param("ds"), GP64())
	widen := prep()
	Label(name + "_run")
	TESTQ(runs, runs)
	JZ(LabelRef(name + "_done"))
	n := Load(Param("n"), GP64())
	i := GP64()
	XORQ(i, i)
	Label(name + "_loop")
	PREFETCHT0(Mem{Base: src, Index: i, Scale: uint8(elem), Disp: 512 * elem})
	for v := range panelWidth / is.lanes {
		x := widen(Mem{Base: src, Index: i, Scale: uint8(elem), Disp: elem * is.lanes * v})
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

// prefetchRuns emits prefetchRuns(src *byte, runs, n, ss int): a
// PREFETCHT0 of each 64-byte line of runs runs of n bytes (n ≥ 1) at src, ss bytes
// apart (an attention cache's rows, one key/value head's columns of each):
// plain x86-64, for every ISA.
func prefetchRuns() {
	TEXT("prefetchRuns", NOSPLIT, "func(src *byte, runs int, n int, ss int)")
	Pragma("noescape")
	Doc("prefetchRuns prefetches the lines of runs runs of n bytes at src, ss bytes apart, into every cache level.")
	src := Load(Param("src"), GP64())
	runs := Load(Param("runs"), GP64())
	n := Load(Param("n"), GP64())
	ss := Load(Param("ss"), GP64())
	Label("prefetchRuns_run")
	TESTQ(runs, runs)
	JZ(LabelRef("prefetchRuns_done"))
	i := GP64()
	XORQ(i, i)
	Label("prefetchRuns_line")
	PREFETCHT0(Mem{Base: src, Index: i, Scale: 1})
	ADDQ(U8(64), i)
	CMPQ(i, n)
	JB(LabelRef("prefetchRuns_line"))
	PREFETCHT0(Mem{Base: src, Index: n, Scale: 1, Disp: -1}) // a run's last line, when src is not aligned
	ADDQ(ss, src)
	DECQ(runs)
	JMP(LabelRef("prefetchRuns_run"))
	Label("prefetchRuns_done")
	RET()
}
