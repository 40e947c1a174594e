//go:build cuda || cudaemu

package cuda

import (
	"sync"
	"unsafe"
)

// Scratch is a set of device buffers kept from call to call, each grown to
// the largest size asked of it and never shrunk: a call's temporaries
// without an allocation (and the free's synchronisation) every time. One
// caller at a time uses a set.
type Scratch struct {
	d    Launcher
	bufs []Buffer
}

// NewScratch makes an empty set of d's buffers.
func NewScratch(d Launcher) *Scratch { return &Scratch{d: d} }

// At returns buffer i of the set, at least bytes long.
func (s *Scratch) At(i int, bytes int64) (Buffer, error) {
	for len(s.bufs) <= i {
		s.bufs = append(s.bufs, Buffer{})
	}
	if b := s.bufs[i]; b.id != 0 && b.Bytes >= bytes {
		return b, nil
	}
	if s.bufs[i].id != 0 {
		s.d.Free(s.bufs[i])
		s.bufs[i] = Buffer{}
	}
	size := int64(256)
	for size < bytes {
		size *= 2 // room to grow into
	}
	b, err := s.d.Alloc(size)
	if err != nil {
		return Buffer{}, err
	}
	s.bufs[i] = b
	return b, nil
}

// Free frees the set's buffers; the set may be used again.
func (s *Scratch) Free() {
	for _, b := range s.bufs {
		s.d.Free(b)
	}
	s.bufs = nil
}

// ScratchPool hands out Scratch sets, one per concurrent caller. The zero
// value is not usable: make one with NewScratchPool.
type ScratchPool struct {
	d    Launcher
	mu   sync.Mutex
	idle []*Scratch
	all  []*Scratch
}

// NewScratchPool makes a pool of d's sets.
func NewScratchPool(d Launcher) *ScratchPool { return &ScratchPool{d: d} }

// Get takes an idle set, or a new one.
func (p *ScratchPool) Get() *Scratch {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.idle); n > 0 {
		s := p.idle[n-1]
		p.idle = p.idle[:n-1]
		return s
	}
	s := &Scratch{d: p.d}
	p.all = append(p.all, s)
	return s
}

// Put gives s back.
func (p *ScratchPool) Put(s *Scratch) {
	p.mu.Lock()
	p.idle = append(p.idle, s)
	p.mu.Unlock()
}

// Free releases every set; none may be in use.
func (p *ScratchPool) Free() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.all {
		s.Free()
	}
	p.all, p.idle = nil, nil
}

// ScratchAlloc hands out a Scratch set's buffers in order, keeping the
// first error, as Buffers does for fresh allocations.
type ScratchAlloc struct {
	sc   *Scratch
	next int
	err  error
}

// NewScratchAlloc hands out sc's buffers from the first.
func NewScratchAlloc(sc *Scratch) *ScratchAlloc { return &ScratchAlloc{sc: sc} }

// Alloc returns the next buffer of the set, at least bytes long.
func (s *ScratchAlloc) Alloc(bytes int64) Buffer {
	if s.err != nil {
		return Buffer{}
	}
	b, err := s.sc.At(s.next, bytes)
	s.next++
	s.err = err
	return b
}

// Err is the first error of the allocations and copies.
func (s *ScratchAlloc) Err() error { return s.err }

// Keep records err if it is the first error.
func (s *ScratchAlloc) Keep(err error) {
	if s.err == nil {
		s.err = err
	}
}

// Device is the device of the set's buffers.
func (s *ScratchAlloc) Device() Launcher { return s.sc.d }

// An Allocator hands out device buffers and keeps the first error of its
// allocations and copies, so that a sequence of them is checked once:
// Buffers (fresh buffers, freed together) or ScratchAlloc (a Scratch set's,
// kept from call to call).
type Allocator interface {
	Alloc(bytes int64) Buffer
	Keep(err error)
	Err() error
	Device() Launcher
}

var (
	_ Allocator = (*Buffers)(nil)
	_ Allocator = (*ScratchAlloc)(nil)
)

// Stage copies v into a new buffer of a (at least one byte long).
func Stage[T any](a Allocator, v []T) Buffer {
	var zero T
	b := a.Alloc(max(1, int64(len(v))*int64(unsafe.Sizeof(zero))))
	if a.Err() == nil {
		a.Keep(CopyIn(a.Device(), b, v))
	}
	return b
}
