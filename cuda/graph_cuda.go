//go:build cuda

package cuda

/*
#cgo LDFLAGS: -lcuda
#include <cuda.h>
#include <stdlib.h>
#include <string.h>

static CUresult moex_graph_add_kernel(CUgraph g, CUgraphNode* node, CUgraphNode* dep, CUfunction f, unsigned gx,
                                      unsigned gy, unsigned gz, unsigned bx, void** params) {
  CUDA_KERNEL_NODE_PARAMS p;
  memset(&p, 0, sizeof p);
  p.func = f;
  p.gridDimX = gx;
  p.gridDimY = gy;
  p.gridDimZ = gz;
  p.blockDimX = bx;
  p.blockDimY = 1;
  p.blockDimZ = 1;
  p.kernelParams = params;
  return cuGraphAddKernelNode(node, g, dep, dep ? 1 : 0, &p);
}

static const char* moex_cu_error(CUresult r) {
  const char* s = 0;
  cuGetErrorString(r, &s);
  return s ? s : "unknown CUDA error";
}
*/
import "C"

import (
	"fmt"
	"unsafe"

	"gorgonia.org/cu"
)

// launchRec is a kernel launch recorded while capturing.
type launchRec struct {
	name  string
	fn    cu.Function
	grid  [3]int
	block int
	args  *args
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

// launchKernel launches fn on the legacy default stream with every
// argument at its full size (a by-value struct included: gorgonia.org/cu's
// Launch copies 8 bytes per argument; the driver copies the values at the
// launch). It does not wait: the stream orders the kernels and the
// synchronous copies that read their results, so the host waits only where
// it reads (CUDA_LAUNCH_BLOCKING=1 makes every launch wait, to find the
// kernel behind an error). The context must be current.
func launchKernel(name string, fn cu.Function, grid [3]int, block int, a *args) error {
	params, mem := cArgs(a)
	defer func() {
		for _, p := range mem {
			C.free(p)
		}
	}()
	return cuErr("cuLaunchKernel "+name, C.cuLaunchKernel(cFunction(fn), C.uint(grid[0]), C.uint(grid[1]), C.uint(grid[2]),
		C.uint(block), 1, 1, 0, nil, (*unsafe.Pointer)(params), nil))
}

func cuErr(call string, r C.CUresult) error {
	if r == C.CUDA_SUCCESS {
		return nil
	}
	return fmt.Errorf("cuda: %s: %s (CUresult %d)", call, C.GoString(C.moex_cu_error(r)), int(r))
}

// deviceGraph is an instantiated CUDA graph: the recorded launches as a
// chain of kernel nodes, their arguments copied into C memory it owns.
type deviceGraph struct {
	d     *Device
	graph C.CUgraph
	exec  C.CUgraphExec
	mem   []unsafe.Pointer
}

// Capture gives record a recorder of this device: the kernels it launches
// there are recorded (not run; copies are refused), then built into a CUDA
// graph, one node after the other. Other users of the device are not
// affected.
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
	g := &deviceGraph{d: d}
	if err := cuErr("cuGraphCreate", C.cuGraphCreate(&g.graph, 0)); err != nil {
		return nil, err
	}
	var prev C.CUgraphNode
	for i, r := range recs {
		params, mem := cArgs(r.args)
		g.mem = append(g.mem, mem...)
		fn := cFunction(r.fn)
		var node C.CUgraphNode
		var dep *C.CUgraphNode
		if i > 0 {
			dep = &prev
		}
		if err := cuErr("cuGraphAddKernelNode "+r.name, C.moex_graph_add_kernel(g.graph, &node, dep, fn,
			C.uint(r.grid[0]), C.uint(r.grid[1]), C.uint(r.grid[2]), C.uint(r.block), (*unsafe.Pointer)(params))); err != nil {
			g.free()
			return nil, err
		}
		prev = node
	}
	if err := cuErr("cuGraphInstantiateWithFlags", C.cuGraphInstantiateWithFlags(&g.exec, g.graph, 0)); err != nil {
		g.free()
		return nil, err
	}
	return g, nil
}

// Replay launches the graph on the legacy default stream, after the work
// before it and before the copies that read its results.
func (g *deviceGraph) Replay() error {
	done, err := g.d.bind()
	if err != nil {
		return err
	}
	defer done()
	return cuErr("cuGraphLaunch", C.cuGraphLaunch(g.exec, nil))
}

// Close destroys the graph once its replays have finished.
func (g *deviceGraph) Close() {
	if done, err := g.d.bind(); err == nil {
		C.cuCtxSynchronize()
		g.free()
		done()
	}
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
	for _, p := range g.mem {
		C.free(p)
	}
	g.mem = nil
}
