//go:build cuda || cudaemu

package cuda

import (
	"sync"
	"unsafe"
)

// scratch is a set of device buffers kept from call to call, each grown to
// the largest size asked of it and never shrunk: a call's temporaries
// without an allocation (and the free's synchronisation) every time.
type scratch struct {
	d    Launcher
	bufs []Buffer
}

// at returns buffer i of the set, at least bytes long.
func (s *scratch) at(i int, bytes int64) (Buffer, error) {
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

func (s *scratch) free() {
	for _, b := range s.bufs {
		s.d.Free(b)
	}
	s.bufs = nil
}

// scratchPool hands out scratch sets, one per concurrent caller.
type scratchPool struct {
	d    Launcher
	mu   sync.Mutex
	idle []*scratch
	all  []*scratch
}

func (p *scratchPool) get() *scratch {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.idle); n > 0 {
		s := p.idle[n-1]
		p.idle = p.idle[:n-1]
		return s
	}
	s := &scratch{d: p.d}
	p.all = append(p.all, s)
	return s
}

func (p *scratchPool) put(s *scratch) {
	p.mu.Lock()
	p.idle = append(p.idle, s)
	p.mu.Unlock()
}

// free releases every set; none may be in use.
func (p *scratchPool) free() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.all {
		s.free()
	}
	p.all, p.idle = nil, nil
}

// scratchAlloc hands out a scratch set's buffers in order, keeping the
// first error, as buffers does for fresh allocations.
type scratchAlloc struct {
	sc   *scratch
	next int
	err  error
}

// alloc returns the next buffer of the set, at least bytes long.
func (s *scratchAlloc) alloc(bytes int64) Buffer {
	if s.err != nil {
		return Buffer{}
	}
	b, err := s.sc.at(s.next, bytes)
	s.next++
	s.err = err
	return b
}

// stage copies v into the next buffer of s.
func stage[T any](s *scratchAlloc, v []T) Buffer {
	var zero T
	b := s.alloc(max(1, int64(len(v))*int64(unsafe.Sizeof(zero))))
	if s.err == nil {
		s.err = copyIn(s.sc.d, b, v)
	}
	return b
}
