//go:build cudaemu && !cuda

package cuda

import (
	"context"
	"fmt"
	"sync"
	"unsafe"

	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/kernels/cudaemu"
)

// Emu is the CPU emulation as a Launcher: buffers are host memory, kernels
// run through kernels/cudaemu on CPU threads.
type Emu struct {
	*emuState
	rec *[]emuOp // a capture's recorder: kernels recorded, not run
}

// emuOp is one recorded step of a graph: a kernel, or a collective.
type emuOp struct {
	kernel func()
	coll   func(ctx context.Context, stream uintptr) error
}

// emuState is the emulated device, shared by it and its recorders.
type emuState struct {
	mu   sync.Mutex
	next uint64
	mem  map[uint64][]uint64 // 8-byte words: every buffer 8-byte aligned
	// run serialises kernels: the emulation keeps a kernel's __shared__
	// memory in static storage, as one GPU would run one launch at a time
	// on one stream.
	run sync.Mutex
}

// NewEmu makes an emulated device.
func NewEmu() *Emu { return &Emu{emuState: &emuState{mem: map[uint64][]uint64{}}} }

var _ Launcher = (*Emu)(nil)

func (e *Emu) Alloc(bytes int64) (Buffer, error) {
	if bytes < 0 {
		return Buffer{}, fmt.Errorf("cuda: emu: allocating %d bytes", bytes)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.next++
	e.mem[e.next] = make([]uint64, (bytes+7)/8+1)
	return Buffer{id: e.next, Bytes: bytes}, nil
}

func (e *Emu) Free(b Buffer) {
	e.mu.Lock()
	delete(e.mem, b.id)
	e.mu.Unlock()
}

// p is the host address of a buffer, nil for the zero Buffer.
func (e *Emu) p(b Buffer) unsafe.Pointer {
	if b.id == 0 {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return unsafe.Pointer(&e.mem[b.id][0])
}

// Bytes is the first n bytes of b's memory (host memory on the
// emulation), for a communicator that moves them as NCCL would.
func (e *Emu) Bytes(b Buffer, n int64) []byte {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(e.p(b)), n)
}

func (e *Emu) ToDevice(dst Buffer, src unsafe.Pointer, n int64) error {
	if e.capturing() {
		return errCopyInGraph
	}
	if n > dst.Bytes {
		return fmt.Errorf("cuda: emu: copy of %d bytes into %d", n, dst.Bytes)
	}
	copy(unsafe.Slice((*byte)(e.p(dst)), n), unsafe.Slice((*byte)(src), n))
	return nil
}

func (e *Emu) ToDeviceAt(dst Buffer, off int64, src unsafe.Pointer, n int64) error {
	if e.capturing() {
		return errCopyInGraph
	}
	if off < 0 || off+n > dst.Bytes {
		return fmt.Errorf("cuda: emu: copy of %d bytes at %d into %d", n, off, dst.Bytes)
	}
	copy(unsafe.Slice((*byte)(unsafe.Add(e.p(dst), off)), n), unsafe.Slice((*byte)(src), n))
	return nil
}

func (e *Emu) ToHost(dst unsafe.Pointer, src Buffer, n int64) error {
	if e.capturing() {
		return errCopyInGraph
	}
	if n > src.Bytes {
		return fmt.Errorf("cuda: emu: copy of %d bytes from %d", n, src.Bytes)
	}
	copy(unsafe.Slice((*byte)(dst), n), unsafe.Slice((*byte)(e.p(src)), n))
	return nil
}

func (e *Emu) Gate(k kernels.GateArgs, logits, bias, ids, weights Buffer, tokens int) error {
	return e.kernel(func() {
		cudaemu.GateRaw(e.p(logits), e.p(bias), tokens, k, e.p(ids), e.p(weights))
	})
}

func (e *Emu) Align(al AlignArgs) error {
	ids, n, lo, experts, block, maxBlocks := al.IDs, al.N, al.Lo, al.Experts, al.Block, al.MaxBlocks
	counts, offsets, sorted, blockExpert, rows := al.Counts, al.Offsets, al.Sorted, al.BlockExpert, al.Rows
	return e.kernel(func() {
		cudaemu.AlignRaw(e.p(ids), n, lo, experts, block, maxBlocks, e.p(counts), e.p(offsets), e.p(sorted), e.p(blockExpert), e.p(rows))
	})
}

func (e *Emu) Combine(out, rows Buffer, tokens, topK, hidden int, shared, y Buffer) error {
	return e.kernel(func() {
		cudaemu.CombineRaw(e.p(out), e.p(rows), tokens, topK, hidden, e.p(shared), e.p(y))
	})
}

func (e *Emu) GroupedGEMM(ga GEMMArgs, w Weights, weights, c Buffer) error {
	a, ep, sorted, blockExpert, paddedRows := ga.A, ga.Epilogue, ga.Sorted, ga.BlockExpert, ga.PaddedRows
	topK, pairs, gatherA, N, K := ga.TopK, ga.Pairs, ga.GatherA, ga.N, ga.K
	if paddedRows == 0 {
		return nil
	}
	switch w.Format {
	case FP8:
		return e.kernel(func() {
			cudaemu.GroupedGEMMFP8Raw(e.p(a), e.p(w.W), e.p(w.Scales), w.BlockRows, w.BlockCols, e.p(sorted), e.p(blockExpert),
				paddedRows, topK, pairs, gatherA, N, K, e.p(weights), e.epilogue(ep), e.p(c))
		})
	case MXFP4, INT4, UINT4, INT8, INT5, UINT5, INT6:
		return e.kernel(func() {
			cudaemu.GroupedGEMMCodesRaw(e.p(a), e.p(w.W), e.p(w.Scales), e.p(w.Offsets), w.BlockCols, w.codeKind(), e.p(w.Factors), w.Super, e.p(sorted), e.p(blockExpert),
				paddedRows, topK, pairs, gatherA, N, K, e.p(weights), e.epilogue(ep), e.p(c))
		})
	}
	return e.kernel(func() {
		cudaemu.GroupedGEMMRaw(e.p(a), e.p(w.W), e.p(sorted), e.p(blockExpert), paddedRows, topK, pairs, gatherA, N, K, e.p(weights), e.epilogue(ep), e.p(c))
	})
}

func (e *Emu) GroupedSwiGLU(ga GEMMArgs, gate, up Weights, h Buffer) error {
	a, ep, sorted, blockExpert, paddedRows := ga.A, ga.Epilogue, ga.Sorted, ga.BlockExpert, ga.PaddedRows
	topK, pairs, N, K := ga.TopK, ga.Pairs, ga.N, ga.K
	if paddedRows == 0 {
		return nil
	}
	if !sameFormat(gate, up) {
		return fmt.Errorf("cuda: grouped swiglu: gate and up weights of different formats")
	}
	switch gate.Format {
	case FP8:
		return e.kernel(func() {
			cudaemu.GroupedSwiGLUFP8Raw(e.p(a), e.p(gate.W), e.p(gate.Scales), e.p(up.W), e.p(up.Scales), gate.BlockRows, gate.BlockCols,
				e.p(sorted), e.p(blockExpert), paddedRows, topK, pairs, N, K, e.epilogue(ep), e.p(h))
		})
	case MXFP4, INT4, UINT4, INT8, INT5, UINT5, INT6:
		return e.kernel(func() {
			cudaemu.GroupedSwiGLUCodesRaw(e.p(a), e.p(gate.W), e.p(gate.Scales), e.p(gate.Offsets), e.p(up.W), e.p(up.Scales), e.p(up.Offsets), gate.BlockCols, gate.codeKind(),
				e.p(gate.Factors), e.p(up.Factors), gate.Super,
				e.p(sorted), e.p(blockExpert), paddedRows, topK, pairs, N, K, e.epilogue(ep), e.p(h))
		})
	}
	return e.kernel(func() {
		cudaemu.GroupedSwiGLURaw(e.p(a), e.p(gate.W), e.p(up.W), e.p(sorted), e.p(blockExpert), paddedRows, topK, pairs, N, K, e.epilogue(ep), e.p(h))
	})
}

// epilogue is ep in the emulation's pointers.
func (e *Emu) epilogue(ep Epilogue) cudaemu.Epilogue {
	return cudaemu.Epilogue{Bias: e.p(ep.Bias), Bias2: e.p(ep.Bias2), Act: int(ep.Act.Kind), Alpha: ep.Act.Alpha, Limit: ep.Act.Limit,
		InScale: e.p(ep.InScale)}
}

func (e *Emu) F32ToBF16(src, dst Buffer, n int) error {
	if n > 0 {
		return e.kernel(func() {
			cudaemu.F32ToBF16Raw(e.p(src), e.p(dst), n)
		})
	}
	return nil
}

func (e *Emu) AttnDecode(md AttnDecodeArgs) error {
	md = md.shape()
	return e.kernel(func() {
		cudaemu.AttnDecodeRaw(md.BF16, e.p(md.Q), e.p(md.Cache), e.p(md.BlockTable), e.p(md.SeqLens), md.Batch, md.Heads, md.KVHeads,
			md.Dim, md.KeyDim, md.ValueDim, md.ValueOff, md.Window, md.BlockSize, md.MaxBlocks, md.SplitRows, md.Splits, md.Scale,
			e.p(md.Sinks), e.p(md.PartO), e.p(md.PartL), e.p(md.Out), e.p(md.LSE))
	})
}

func (e *Emu) RMSNorm(x Buffer, rows, stride, col, width int, w Buffer, eps float64) error {
	if rows == 0 {
		return nil
	}
	return e.kernel(func() { cudaemu.RMSNormRaw(e.p(x), rows, stride, col, width, e.p(w), eps) })
}

func (e *Emu) Rope(x Buffer, rows, stride, col, width, perPos int, pos, freq Buffer) error {
	if rows == 0 {
		return nil
	}
	if width%2 != 0 || width > MaxRope || perPos < 1 {
		return fmt.Errorf("cuda: emu: rope of %d values, %d rows per position (want even, ≤ %d)", width, perPos, MaxRope)
	}
	return e.kernel(func() { cudaemu.RopeRaw(e.p(x), rows, stride, col, width, perPos, e.p(pos), e.p(freq)) })
}

func (e *Emu) CopyRows(cr CopyRowsArgs) error {
	src, srcStride, srcCol, srcMap, dst, dstBF16 := cr.Src, cr.SrcStride, cr.SrcCol, cr.SrcMap, cr.Dst, cr.DstBF16
	dstStride, dstCol, dstMap, rows, width := cr.DstStride, cr.DstCol, cr.DstMap, cr.Rows, cr.Width
	if rows == 0 {
		return nil
	}
	return e.kernel(func() {
		cudaemu.CopyRowsRaw(e.p(src), srcStride, srcCol, e.p(srcMap), e.p(dst), dstBF16, dstStride, dstCol, e.p(dstMap), rows, width)
	})
}

// kernel runs f, one kernel at a time, or records it on a recorder.
func (e *Emu) kernel(f func()) error {
	if e.rec != nil {
		*e.rec = append(*e.rec, emuOp{kernel: f})
		return nil
	}
	e.run.Lock()
	defer e.run.Unlock()
	f()
	return nil
}

// Collective runs op at once (the emulation's stream is synchronous) or
// records it; it runs outside the kernels' lock, since it waits for the
// other ranks, which may share this emulated device.
func (e *Emu) Collective(ctx context.Context, name string, op func(ctx context.Context, stream uintptr) error) error {
	if e.rec != nil {
		*e.rec = append(*e.rec, emuOp{coll: op})
		return nil
	}
	if err := op(ctx, 0); err != nil {
		return fmt.Errorf("cuda: emu: %s: %w", name, err)
	}
	return nil
}

// Capture gives record a recorder of this device: the kernels it launches
// there are recorded (not run; copies are refused) as a Graph that runs them
// in order. Other users of the device are not affected.
func (e *Emu) Capture(record func(rec Launcher) error) (Graph, error) {
	var ops []emuOp
	if err := record(&Emu{emuState: e.emuState, rec: &ops}); err != nil {
		return nil, err
	}
	return &emuGraph{e: e, ops: ops}, nil
}

type emuGraph struct {
	e   *Emu
	ops []emuOp
}

func (g *emuGraph) Replay(ctx context.Context) error {
	for _, op := range g.ops {
		var err error
		if op.coll != nil {
			err = op.coll(ctx, 0)
		} else {
			err = g.e.kernel(op.kernel)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (g *emuGraph) Close() error { g.ops = nil; return nil }

func (e *Emu) capturing() bool { return e.rec != nil }
