package hugepage

import (
	"sync"
	"unsafe"
)

// Weights are usually a few MiB a matrix (an expert's projection), too
// small to hold a whole 2 MiB-aligned page of their own: Advise on each
// matrix's buffer alone would rarely get a huge page. Bytes carves them
// from slabs of slabSize instead, each advised before it is touched, so
// that a layer's experts share huge pages. A slab is Go memory: it lives
// while any buffer carved from it does.
const (
	slabSize = 32 << 20
	// carveMax is the largest request carved from a slab; larger ones get
	// a slab of their own.
	carveMax = slabSize / 4
	// carveMin is the smallest request carved from a slab: smaller
	// buffers (scales, small test matrices) come from the plain heap.
	carveMin = 64 << 10
	lineSize = 64
)

var slab struct {
	sync.Mutex
	rest []byte // the current slab's unused tail
}

// Bytes returns n zeroed bytes, 64-byte aligned, for weights that are
// streamed: from the slabs (transparent huge pages where the kernel gives
// them) when n is at least 64 KiB, else from the heap.
func Bytes(n int) []byte {
	switch {
	case n < carveMin:
		return make([]byte, n)
	case n > carveMax:
		b := fresh(n)
		return b[:n:n]
	}
	size := (n + lineSize - 1) &^ (lineSize - 1)
	slab.Lock()
	defer slab.Unlock()
	if len(slab.rest) < size {
		// A new slab, made (and advised: a collapse can take
		// milliseconds) without holding up the other callers.
		slab.Unlock()
		f := fresh(slabSize)
		slab.Lock()
		if len(slab.rest) < size {
			slab.rest = f
		}
	}
	b := slab.rest[:n:n]
	slab.rest = slab.rest[size:]
	return b
}

// Slice is Bytes for n values of T (float32, uint16, uint8).
func Slice[T float32 | uint16 | uint8](n int) []T {
	var zero T
	b := Bytes(n * int(unsafe.Sizeof(zero)))
	if len(b) == 0 {
		return make([]T, 0)
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&b[0])), n)
}

// fresh returns n bytes aligned to a line, advised for huge pages.
func fresh(n int) []byte {
	b := make([]byte, n+lineSize)
	off := int(-uintptr(unsafe.Pointer(&b[0])) & (lineSize - 1))
	b = b[off : off+n]
	Advise(b)
	return b
}
