//go:build cuda

package cuda

/*
#cgo LDFLAGS: -lcuda
#include <cuda.h>
#include <stdlib.h>
#include <string.h>

static const char* moex_cu_error(CUresult r) {
  const char* s = 0;
  cuGetErrorString(r, &s);
  return s ? s : "unknown CUDA error";
}
*/
import "C"

import (
	"context"
	"fmt"
	"unsafe"

	"gorgonia.org/cu"
)

// launchRec is a kernel launch, or a collective (coll), recorded while
// capturing.
type launchRec struct {
	name  string
	fn    cu.Function
	grid  [3]int
	block int
	args  *args
	coll  func(ctx context.Context, stream uintptr) error
	ctx   context.Context // the collective's, at its enqueue
}

// cArgs copies a launch's arguments into C memory, each at its full size,
// and returns the C array of pointers to them and every block to free.
func cArgs(a *args) (unsafe.Pointer, []unsafe.Pointer) {
	n := len(a.slots)
	params := C.malloc(C.size_t(max(1, n) * int(unsafe.Sizeof(uintptr(0)))))
	mem := []unsafe.Pointer{params}
	ptrs := unsafe.Slice((*unsafe.Pointer)(params), max(1, n))
	for j, slot := range a.slots {
		v := C.malloc(C.size_t(a.sizes[j]))
		mem = append(mem, v)
		C.memcpy(v, slot, C.size_t(a.sizes[j]))
		ptrs[j] = v
	}
	return params, mem
}

// cFunction is the CUfunction a cu.Function holds (its only field).
func cFunction(fn cu.Function) C.CUfunction { return *(*C.CUfunction)(unsafe.Pointer(&fn)) }

// launchKernel launches fn on stream (nil: the legacy default stream) with
// every argument at its full size (a by-value struct included: gorgonia.org/cu's
// Launch copies 8 bytes per argument; the driver copies the values at the
// launch). It does not wait: the stream orders the kernels and the
// synchronous copies that read their results, so the host waits only where
// it reads (CUDA_LAUNCH_BLOCKING=1 makes every launch wait, to find the
// kernel behind an error). The context must be current.
func launchKernel(name string, fn cu.Function, grid [3]int, block int, a *args, stream C.CUstream) error {
	params, mem := cArgs(a)
	defer func() {
		for _, p := range mem {
			C.free(p)
		}
	}()
	return cuErr("cuLaunchKernel "+name, C.cuLaunchKernel(cFunction(fn), C.uint(grid[0]), C.uint(grid[1]), C.uint(grid[2]),
		C.uint(block), 1, 1, 0, stream, (*unsafe.Pointer)(params), nil))
}

func cuErr(call string, r C.CUresult) error {
	if r == C.CUDA_SUCCESS {
		return nil
	}
	return fmt.Errorf("cuda: %s: %s (CUresult %d)", call, C.GoString(C.moex_cu_error(r)), int(r))
}

// deviceGraph is an instantiated CUDA graph.
type deviceGraph struct {
	d     *Device
	graph C.CUgraph
	exec  C.CUgraphExec
}

// Capture gives record a recorder of this device: the kernels it launches
// there, and the collectives it enqueues, are recorded (not run; copies are
// refused), then captured in order on a stream of the capture's own (CUDA
// stream capture, the only way to put NCCL's work in a graph; the kernels'
// arguments are copied into the graph at their launch) and instantiated.
// Other users of the device wait for the capture (it holds the device);
// the capture mode is thread-local, so other threads' CUDA calls are not
// disturbed.
func (d *Device) Capture(record func(rec Launcher) error) (Graph, error) {
	var recs []launchRec
	if err := record(&Device{dev: d.dev, ordinal: d.ordinal, ctx: d.ctx, mod: d.mod, fns: d.fns, rec: &recs}); err != nil {
		return nil, err
	}
	done, err := d.bind()
	if err != nil {
		return nil, err
	}
	defer done()
	var s C.CUstream
	if err := cuErr("cuStreamCreate", C.cuStreamCreate(&s, C.CU_STREAM_NON_BLOCKING)); err != nil {
		return nil, err
	}
	defer C.cuStreamDestroy(s)
	if err := cuErr("cuStreamBeginCapture", C.cuStreamBeginCapture(s, C.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)); err != nil {
		return nil, err
	}
	var recErr error
	for _, r := range recs {
		if r.coll != nil {
			if err := r.coll(r.ctx, uintptr(unsafe.Pointer(s))); err != nil {
				recErr = fmt.Errorf("cuda: capturing %s: %w", r.name, err)
			}
		} else {
			recErr = launchKernel(r.name, r.fn, r.grid, r.block, r.args, s)
		}
		if recErr != nil {
			break
		}
	}
	g := &deviceGraph{d: d}
	// The capture ends even after an error: the stream is usable again.
	endErr := cuErr("cuStreamEndCapture", C.cuStreamEndCapture(s, &g.graph))
	if recErr == nil {
		recErr = endErr
	}
	if recErr != nil {
		g.free()
		return nil, recErr
	}
	if err := cuErr("cuGraphInstantiateWithFlags", C.cuGraphInstantiateWithFlags(&g.exec, g.graph, 0)); err != nil {
		g.free()
		return nil, err
	}
	return g, nil
}

// Replay launches the graph on the legacy default stream, after the work
// before it and before the copies that read its results.
func (g *deviceGraph) Replay(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	done, err := g.d.bind()
	if err != nil {
		return err
	}
	defer done()
	return cuErr("cuGraphLaunch", C.cuGraphLaunch(g.exec, nil))
}

// Close destroys the graph once its replays have finished.
func (g *deviceGraph) Close() error {
	if g.exec == nil && g.graph == nil {
		return nil
	}
	done, err := g.d.bind()
	if err != nil {
		return err
	}
	defer done()
	if err := cuErr("cuCtxSynchronize", C.cuCtxSynchronize()); err != nil {
		return err
	}
	g.free()
	return nil
}

func (g *deviceGraph) free() {
	if g.exec != nil {
		C.cuGraphExecDestroy(g.exec)
		g.exec = nil
	}
	if g.graph != nil {
		C.cuGraphDestroy(g.graph)
		g.graph = nil
	}
}
