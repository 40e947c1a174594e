//go:build cuda

package cuda

import (
	"context"
	_ "embed"
	"fmt"
	"math"
	"runtime"
	"sync"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/moex-project/moex/kernels"
)

// fatbin is kernels/cuda/moex.cu built by nvcc for sm_80, sm_90 and PTX
// (`make cuda-check` writes it here).
//
//go:embed moex_kernels.fatbin
var fatbin string

// Kernel launch shapes, as in kernels/cuda.
const (
	gateThreads  = 256
	alignThreads = 256
	mlaThreads   = 128
	gemmBM       = 64
	gemmBN       = 64
	gemmThreads  = 128
)

// Device is one GPU with moex's kernels loaded. It is safe for concurrent
// use: each call holds its lock with the context bound to the calling OS
// thread.
type Device struct {
	mu      sync.Mutex
	dev     cu.Device
	ordinal int
	ctx     cu.CUContext
	mod     cu.Module
	fns     map[string]cu.Function
	rec     *[]launchRec // while capturing: launches recorded, not run
}

// bind makes the context current on this goroutine's OS thread, pinned
// (and the Device locked) until the returned function runs.
func (d *Device) bind() (func(), error) {
	d.mu.Lock()
	runtime.LockOSThread()
	if err := cu.SetCurrentContext(d.ctx); err != nil {
		runtime.UnlockOSThread()
		d.mu.Unlock()
		return nil, fmt.Errorf("cuda: binding the context: %w", err)
	}
	return func() {
		runtime.UnlockOSThread()
		d.mu.Unlock()
	}, nil
}

// Open makes a context on GPU ordinal and loads the kernels.
func Open(ordinal int) (*Device, error) {
	runtime.LockOSThread() // the new context is current on this thread only
	defer runtime.UnlockOSThread()
	dev, err := cu.GetDevice(ordinal)
	if err != nil {
		return nil, fmt.Errorf("cuda: device %d: %w", ordinal, err)
	}
	// The primary context: the one the CUDA runtime, NCCL and PyTorch use,
	// so that buffers and streams are shared with them.
	ctx, err := dev.RetainPrimaryCtx()
	if err != nil {
		return nil, fmt.Errorf("cuda: context on device %d: %w", ordinal, err)
	}
	if err := cu.SetCurrentContext(ctx); err != nil {
		dev.ReleasePrimaryCtx()
		return nil, fmt.Errorf("cuda: context on device %d: %w", ordinal, err)
	}
	mod, err := cu.LoadFatBinary(fatbin)
	if err != nil {
		dev.ReleasePrimaryCtx()
		return nil, fmt.Errorf("cuda: loading the kernels: %w", err)
	}
	d := &Device{dev: dev, ordinal: ordinal, ctx: ctx, mod: mod, fns: map[string]cu.Function{}}
	for _, name := range []string{"moex_gate", "moex_align", "moex_combine", "moex_mla_decode_f32", "moex_mla_decode_bf16",
		"moex_mla_merge", "moex_grouped_gemm_bf16", "moex_grouped_gemm_swiglu_bf16", "moex_grouped_gemm_fp8",
		"moex_grouped_gemm_swiglu_fp8", "moex_grouped_gemm_q4", "moex_grouped_gemm_swiglu_q4", "moex_f32_to_bf16", "moex_rmsnorm", "moex_rope", "moex_copy_rows"} {
		fn, err := mod.Function(name)
		if err != nil {
			d.Close()
			return nil, fmt.Errorf("cuda: kernel %s: %w", name, err)
		}
		d.fns[name] = fn
	}
	return d, nil
}

// Close unloads the kernels and destroys the context.
func (d *Device) Close() error {
	done, err := d.bind()
	if err != nil {
		return err
	}
	defer done()
	err = cu.Synchronize() // the work launched before (launches do not wait)
	if uerr := d.mod.Unload(); err == nil {
		err = uerr
	}
	if rerr := d.dev.ReleasePrimaryCtx(); err == nil {
		err = rerr
	}
	return err
}

// Count is the number of CUDA devices.
func Count() (int, error) { return cu.NumDevices() }

// Ordinal is the device's index.
func (d *Device) Ordinal() int { return d.ordinal }

// Bind makes the device's context current on the calling OS thread, which
// stays locked to the goroutine until the returned function runs: for
// libraries that use the current device (NCCL's communicator setup).
func (d *Device) Bind() (func(), error) { return d.bind() }

var _ Launcher = (*Device)(nil)

func (b Buffer) dev() cu.DevicePtr { return cu.DevicePtr(b.id) }

// Alloc allocates bytes of device memory (at least one byte).
func (d *Device) Alloc(bytes int64) (Buffer, error) {
	done, err := d.bind()
	if err != nil {
		return Buffer{}, err
	}
	defer done()
	p, err := cu.MemAlloc(max(bytes, 1))
	if err != nil {
		return Buffer{}, fmt.Errorf("cuda: allocating %d bytes: %w", bytes, err)
	}
	return Buffer{id: uint64(p), Bytes: bytes}, nil
}

// Free releases a buffer once the work launched before has finished
// (launches do not wait; see launchKernel).
func (d *Device) Free(b Buffer) {
	if b.id == 0 {
		return
	}
	if done, err := d.bind(); err == nil {
		cu.Synchronize() // cuCtxSynchronize
		cu.MemFree(b.dev())
		done()
	}
}

// ToDevice copies n bytes from the host.
func (d *Device) ToDevice(dst Buffer, src unsafe.Pointer, n int64) error {
	return d.ToDeviceAt(dst, 0, src, n)
}

// ToDeviceAt copies n bytes from the host to dst at byte offset off.
func (d *Device) ToDeviceAt(dst Buffer, off int64, src unsafe.Pointer, n int64) error {
	if off < 0 || off+n > dst.Bytes {
		return fmt.Errorf("cuda: copy of %d bytes at %d into %d", n, off, dst.Bytes)
	}
	return d.copy(func() error { return cu.MemcpyHtoD(dst.dev()+cu.DevicePtr(off), src, n) })
}

// ToHost copies n bytes to the host.
func (d *Device) ToHost(dst unsafe.Pointer, src Buffer, n int64) error {
	if n > src.Bytes {
		return fmt.Errorf("cuda: copy of %d bytes from %d", n, src.Bytes)
	}
	return d.copy(func() error { return cu.MemcpyDtoH(dst, src.dev(), n) })
}

// copy runs a copy with the context bound; a capture's recorder refuses it.
func (d *Device) copy(f func() error) error {
	if d.rec != nil {
		return errCopyInGraph
	}
	done, err := d.bind()
	if err != nil {
		return err
	}
	defer done()
	return f()
}

// args holds kernel arguments, each scalar and pointer in its own 8-byte
// slot (gorgonia.org/cu's Launch passes one pointer per argument; the
// driver reads the parameter's own size from it).
type args struct {
	slots []unsafe.Pointer
	sizes []int // bytes behind each slot (a graph copies them)
}

func (a *args) ptr(b Buffer) *args {
	p := new(uint64)
	*p = b.id // 0 for the zero Buffer: a null pointer
	a.slots = append(a.slots, unsafe.Pointer(p))
	a.sizes = append(a.sizes, 8)
	return a
}

func (a *args) int(v int) *args {
	if v != int(int32(v)) {
		panic(fmt.Sprintf("cuda: kernel argument %d does not fit an int", v)) // sizes are checked before launches
	}
	p := new(uint64)
	*p = uint64(uint32(int32(v)))
	a.slots = append(a.slots, unsafe.Pointer(p))
	a.sizes = append(a.sizes, 8)
	return a
}

func (a *args) f32(v float32) *args {
	p := new(uint64)
	*p = uint64(math.Float32bits(v))
	a.slots = append(a.slots, unsafe.Pointer(p))
	a.sizes = append(a.sizes, 8)
	return a
}

func (a *args) f64(v float64) *args {
	p := new(uint64)
	*p = math.Float64bits(v)
	a.slots = append(a.slots, unsafe.Pointer(p))
	a.sizes = append(a.sizes, 8)
	return a
}

// raw passes a by-value struct argument of size bytes.
// epilogue appends a grouped GEMM's epilogue parameters (kernels/cuda's
// Epilogue: bias, bias2, act, alpha, limit, inScale).
func (a *args) epilogue(ep Epilogue) *args {
	return a.ptr(ep.Bias).ptr(ep.Bias2).int(int(ep.Act.Kind)).f32(ep.Act.Alpha).f32(ep.Act.Limit).ptr(ep.InScale)
}

func (a *args) raw(p unsafe.Pointer, size uintptr) *args {
	a.slots = append(a.slots, p)
	a.sizes = append(a.sizes, int(size))
	return a
}

func (d *Device) launch(name string, grid [3]int, block int, a *args) error {
	if d.rec != nil {
		*d.rec = append(*d.rec, launchRec{name: name, fn: d.fns[name], grid: grid, block: block, args: a})
		return nil
	}
	done, err := d.bind()
	if err != nil {
		return err
	}
	defer done()
	if grid[0] < 1 || grid[1] < 1 || grid[2] < 1 {
		return fmt.Errorf("cuda: %s: empty grid %v", name, grid)
	}
	return launchKernel(name, d.fns[name], grid, block, a, nil)
}

// Collective runs op with the context current, on the legacy default
// stream (0), or records it while capturing.
func (d *Device) Collective(ctx context.Context, name string, op func(ctx context.Context, stream uintptr) error) error {
	if d.rec != nil {
		*d.rec = append(*d.rec, launchRec{name: name, coll: op, ctx: ctx})
		return nil
	}
	done, err := d.bind()
	if err != nil {
		return err
	}
	defer done()
	if err := op(ctx, 0); err != nil {
		return fmt.Errorf("cuda: %s: %w", name, err)
	}
	return nil
}

// Gate launches the gating kernel: logits [tokens, experts] fp32, bias
// [experts] (noaux_tc; zero Buffer otherwise) → ids, weights [tokens, top_k].
func (d *Device) Gate(k kernels.GateArgs, logits, bias, ids, weights Buffer, tokens int) error {
	if tokens == 0 {
		return nil
	}
	a := (&args{}).ptr(logits).ptr(bias).raw(unsafe.Pointer(&k), unsafe.Sizeof(k)).ptr(ids).ptr(weights)
	return d.launch("moex_gate", [3]int{tokens, 1, 1}, gateThreads, a)
}

// Align launches the dispatch-layout kernel over n = tokens·top_k ids and
// the experts lo … lo+experts-1.
func (d *Device) Align(al AlignArgs) error {
	ids, n, lo, experts, block, maxBlocks := al.IDs, al.N, al.Lo, al.Experts, al.Block, al.MaxBlocks
	counts, offsets, sorted, blockExpert, rows := al.Counts, al.Offsets, al.Sorted, al.BlockExpert, al.Rows
	a := (&args{}).ptr(ids).int(n).int(lo).int(experts).int(block).int(maxBlocks).ptr(counts).ptr(offsets).ptr(sorted).ptr(blockExpert).ptr(rows)
	return d.launch("moex_align", [3]int{1, 1, 1}, alignThreads, a)
}

// RMSNorm launches the RMSNorm kernel, a block per row.
func (d *Device) RMSNorm(x Buffer, rows, stride, col, width int, w Buffer, eps float64) error {
	if rows == 0 {
		return nil
	}
	a := (&args{}).ptr(x).int(stride).int(col).int(width).ptr(w).f64(eps)
	return d.launch("moex_rmsnorm", [3]int{rows, 1, 1}, normThreads, a)
}

// Rope launches the rotary-embedding kernel, a block per row.
func (d *Device) Rope(x Buffer, rows, stride, col, width, perPos int, pos, freq Buffer) error {
	if rows == 0 {
		return nil
	}
	if width%2 != 0 || width > MaxRope || perPos < 1 {
		return fmt.Errorf("cuda: rope of %d values, %d rows per position (want even, ≤ %d)", width, perPos, MaxRope)
	}
	a := (&args{}).ptr(x).int(stride).int(col).int(width).int(perPos).ptr(pos).ptr(freq)
	return d.launch("moex_rope", [3]int{rows, 1, 1}, ropeThreads, a)
}

// CopyRows launches the row-copy kernel, a block per row.
func (d *Device) CopyRows(cr CopyRowsArgs) error {
	src, srcStride, srcCol, srcMap, dst, dstBF16 := cr.Src, cr.SrcStride, cr.SrcCol, cr.SrcMap, cr.Dst, cr.DstBF16
	dstStride, dstCol, dstMap, rows, width := cr.DstStride, cr.DstCol, cr.DstMap, cr.Rows, cr.Width
	if rows == 0 {
		return nil
	}
	b := 0
	if dstBF16 {
		b = 1
	}
	a := (&args{}).ptr(src).int(srcStride).int(srcCol).ptr(srcMap).ptr(dst).int(b).int(dstStride).int(dstCol).ptr(dstMap).int(width)
	return d.launch("moex_copy_rows", [3]int{rows, 1, 1}, copyThreads, a)
}

// Combine launches the combine kernel; shared may be the zero Buffer.
func (d *Device) Combine(out, rows Buffer, tokens, topK, hidden int, shared, y Buffer) error {
	if tokens == 0 {
		return nil
	}
	a := (&args{}).ptr(out).ptr(rows).int(topK).int(hidden).ptr(shared).ptr(y)
	return d.launch("moex_combine", [3]int{tokens, 1, 1}, 64, a)
}

// attnShape is kernels/cuda's AttnShape, passed by value.
type attnShape struct{ heads, kvHeads, d, dk, dv, voff, window int32 }

// AttnDecode launches split-KV decode attention and the merge (see
// AttnDecodeArgs).
func (d *Device) AttnDecode(md AttnDecodeArgs) error {
	md = md.shape()
	name := "moex_attn_decode_f32"
	if md.BF16 {
		name = "moex_attn_decode_bf16"
	}
	sh := &attnShape{int32(md.Heads), int32(md.KVHeads), int32(md.Dim), int32(md.KeyDim), int32(md.ValueDim), int32(md.ValueOff), int32(md.Window)}
	a := (&args{}).ptr(md.Q).ptr(md.Cache).ptr(md.BlockTable).ptr(md.SeqLens).raw(unsafe.Pointer(sh), unsafe.Sizeof(*sh)).int(md.BlockSize).
		int(md.MaxBlocks).int(md.SplitRows).int(md.Splits).f32(md.Scale).ptr(md.PartO).ptr(md.PartL)
	if err := d.launch(name, [3]int{md.Batch * md.Heads, md.Splits, 1}, mlaThreads, a); err != nil {
		return err
	}
	m := (&args{}).ptr(md.PartO).ptr(md.PartL).int(md.Splits).int(md.ValueDim).ptr(md.Sinks).int(md.Heads).ptr(md.Out).ptr(md.LSE)
	return d.launch("moex_attn_merge", [3]int{md.Batch * md.Heads, 1, 1}, 128, m)
}

// GroupedGEMM launches the second-projection GEMM over a layout of
// paddedRows rows (blocks of 64): c [paddedRows, N]; weights may be the
// zero Buffer.
func (d *Device) GroupedGEMM(ga GEMMArgs, w Weights, weights, c Buffer) error {
	a, ep, sorted, blockExpert, paddedRows := ga.A, ga.Epilogue, ga.Sorted, ga.BlockExpert, ga.PaddedRows
	topK, pairs, gatherA, N, K := ga.TopK, ga.Pairs, ga.GatherA, ga.N, ga.K
	if paddedRows == 0 {
		return nil
	}
	gather := 0
	if gatherA {
		gather = 1
	}
	grid := [3]int{paddedRows / gemmBM, (N + gemmBN - 1) / gemmBN, 1}
	switch w.Format {
	case FP8:
		g := (&args{}).ptr(a).ptr(w.W).ptr(w.Scales).int(w.BlockRows).int(w.BlockCols).ptr(sorted).ptr(blockExpert).int(topK).
			int(pairs).int(gather).int(N).int(K).ptr(weights).epilogue(ep).ptr(c)
		return d.launch("moex_grouped_gemm_fp8", grid, gemmThreads, g)
	case MXFP4, INT4, UINT4, INT8, INT5, UINT5, INT6:
		g := (&args{}).ptr(a).ptr(w.W).ptr(w.Scales).ptr(w.Offsets).int(w.BlockCols).int(w.codeKind()).ptr(w.Factors).int(w.Super).ptr(sorted).ptr(blockExpert).int(topK).
			int(pairs).int(gather).int(N).int(K).ptr(weights).epilogue(ep).ptr(c)
		return d.launch("moex_grouped_gemm_codes", grid, gemmThreads, g)
	}
	g := (&args{}).ptr(a).ptr(w.W).ptr(sorted).ptr(blockExpert).int(topK).int(pairs).int(gather).int(N).int(K).ptr(weights).epilogue(ep).ptr(c)
	return d.launch("moex_grouped_gemm_bf16", grid, gemmThreads, g)
}

// GroupedSwiGLU launches the fused first projection: h = silu(a·gateᵀ) ·
// (a·upᵀ) [paddedRows, N].
func (d *Device) GroupedSwiGLU(ga GEMMArgs, gate, up Weights, h Buffer) error {
	a, ep, sorted, blockExpert, paddedRows := ga.A, ga.Epilogue, ga.Sorted, ga.BlockExpert, ga.PaddedRows
	topK, pairs, N, K := ga.TopK, ga.Pairs, ga.N, ga.K
	if paddedRows == 0 {
		return nil
	}
	if !sameFormat(gate, up) {
		return fmt.Errorf("cuda: grouped swiglu: gate and up weights of different formats")
	}
	grid := [3]int{paddedRows / gemmBM, (N + gemmBN - 1) / gemmBN, 1}
	switch gate.Format {
	case FP8:
		g := (&args{}).ptr(a).ptr(gate.W).ptr(gate.Scales).ptr(up.W).ptr(up.Scales).int(gate.BlockRows).int(gate.BlockCols).
			ptr(sorted).ptr(blockExpert).int(topK).int(pairs).int(N).int(K).epilogue(ep).ptr(h)
		return d.launch("moex_grouped_gemm_swiglu_fp8", grid, gemmThreads, g)
	case MXFP4, INT4, UINT4, INT8, INT5, UINT5, INT6:
		g := (&args{}).ptr(a).ptr(gate.W).ptr(gate.Scales).ptr(gate.Offsets).ptr(up.W).ptr(up.Scales).ptr(up.Offsets).int(gate.BlockCols).int(gate.codeKind()).
			ptr(gate.Factors).ptr(up.Factors).int(gate.Super).
			ptr(sorted).ptr(blockExpert).int(topK).int(pairs).int(N).int(K).epilogue(ep).ptr(h)
		return d.launch("moex_grouped_gemm_swiglu_codes", grid, gemmThreads, g)
	}
	g := (&args{}).ptr(a).ptr(gate.W).ptr(up.W).ptr(sorted).ptr(blockExpert).int(topK).int(pairs).int(N).int(K).epilogue(ep).ptr(h)
	return d.launch("moex_grouped_gemm_swiglu_bf16", grid, gemmThreads, g)
}

// F32ToBF16 launches the conversion kernel over n values.
func (d *Device) F32ToBF16(src, dst Buffer, n int) error {
	if n == 0 {
		return nil
	}
	a := (&args{}).ptr(src).ptr(dst).int(n)
	return d.launch("moex_f32_to_bf16", [3]int{min(1024, (n+255)/256), 1, 1}, 256, a)
}
