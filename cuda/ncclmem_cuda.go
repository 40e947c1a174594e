//go:build cuda

package cuda

/*
#include <cuda.h>
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"
)

// NCCLMemory is the device side of ncclcomm.HostComm on this GPU: staging
// buffers in its memory, NCCL's work on the legacy default stream.
type NCCLMemory struct {
	d    *Device
	mu   sync.Mutex
	bufs map[uintptr]Buffer
}

// NCCLMemory returns the GPU as ncclcomm.HostComm's memory.
func (d *Device) NCCLMemory() *NCCLMemory { return &NCCLMemory{d: d, bufs: map[uintptr]Buffer{}} }

func (m *NCCLMemory) Alloc(bytes int) (uintptr, error) {
	b, err := m.d.Alloc(int64(bytes))
	if err != nil {
		return 0, err
	}
	m.mu.Lock()
	m.bufs[uintptr(b.id)] = b
	m.mu.Unlock()
	return uintptr(b.id), nil
}

func (m *NCCLMemory) Free(addr uintptr) {
	m.mu.Lock()
	b, ok := m.bufs[addr]
	delete(m.bufs, addr)
	m.mu.Unlock()
	if ok {
		m.d.Free(b)
	}
}

func (m *NCCLMemory) buffer(addr uintptr) (Buffer, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.bufs[addr]
	if !ok {
		return Buffer{}, fmt.Errorf("cuda: %#x is not a staging buffer", addr)
	}
	return b, nil
}

func (m *NCCLMemory) ToDevice(dst uintptr, src []byte) error {
	b, err := m.buffer(dst)
	if err != nil || len(src) == 0 {
		return err
	}
	return m.d.ToDevice(b, unsafe.Pointer(&src[0]), int64(len(src)))
}

func (m *NCCLMemory) ToHost(dst []byte, src uintptr) error {
	b, err := m.buffer(src)
	if err != nil || len(dst) == 0 {
		return err
	}
	return m.d.ToHost(unsafe.Pointer(&dst[0]), b, int64(len(dst)))
}

// Stream is the legacy default stream.
func (m *NCCLMemory) Stream() uintptr { return 0 }

// Enqueue runs f with the device's context current.
func (m *NCCLMemory) Enqueue(f func() error) error {
	done, err := m.d.bind()
	if err != nil {
		return err
	}
	defer done()
	return f()
}

// Done reports whether the default stream's work has finished.
func (m *NCCLMemory) Done() (bool, error) {
	done, err := m.d.bind()
	if err != nil {
		return false, err
	}
	defer done()
	switch r := C.cuStreamQuery(nil); r {
	case C.CUDA_SUCCESS:
		return true, nil
	case C.CUDA_ERROR_NOT_READY:
		return false, nil
	default:
		return false, cuErr("cuStreamQuery", r)
	}
}
