package ep

import (
	"context"
	"errors"
	"fmt"
	"unsafe"
)

// Op is a reduction.
type Op uint8

// Reductions.
const (
	Sum Op = iota + 1
	Min
	Max
)

func (o Op) String() string {
	switch o {
	case Sum:
		return "sum"
	case Min:
		return "min"
	case Max:
		return "max"
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// Comm is a group of ranks that run collectives together. Every rank calls
// the same collectives in the same order. Each call takes a context: a peer
// that fails, leaves or never arrives gives the others an error by the
// deadline, never a hang; after such an error the Comm is broken and every
// later call fails. Mismatched calls (different collectives, or lengths
// that must agree and do not) are reported as errors on every rank.
//
// The buffers AllGather and AllToAllV return belong to the Comm: they stay
// valid until the rank's next call, and each starts at an 8-byte boundary.
type Comm interface {
	Rank() int
	Size() int
	// AllGather returns every rank's send, indexed by rank; sizes may differ.
	AllGather(ctx context.Context, send []byte) ([][]byte, error)
	// AllToAllV sends send[r] to rank r and returns recv[r], the bytes rank r
	// sent here.
	AllToAllV(ctx context.Context, send [][]byte) ([][]byte, error)
	// AllReduceInt64 and AllReduceFloat32 reduce v element-wise over the
	// ranks, in place; every rank must pass the same length.
	AllReduceInt64(ctx context.Context, v []int64, op Op) error
	AllReduceFloat32(ctx context.Context, v []float32, op Op) error
	// ReduceScatter sums v (the same length on every rank) over the ranks
	// and returns this rank's segment: counts[r] values for rank r, in rank
	// order; counts must agree on every rank and add up to len(v).
	ReduceScatter(ctx context.Context, v []float32, counts []int) ([]float32, error)
	Barrier(ctx context.Context) error
	// Abort breaks the group: every pending and later call on every rank
	// fails with err.
	Abort(err error)
}

// ErrAborted is wrapped by the errors of a broken group.
var ErrAborted = errors.New("ep: communicator aborted")

// Bytes views a slice of plain values as bytes, without copying.
func Bytes[T int32 | int64 | float32 | uint16 | uint8](v []T) []byte {
	if len(v) == 0 {
		return []byte{}
	}
	var zero T
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), len(v)*int(unsafe.Sizeof(zero)))
}

// FromBytes copies b into a new slice of T; len(b) must be a multiple of
// T's size.
func FromBytes[T int32 | int64 | float32 | uint16 | uint8](b []byte) ([]T, error) {
	var zero T
	size := int(unsafe.Sizeof(zero))
	if len(b)%size != 0 {
		return nil, fmt.Errorf("ep: %d bytes are not a whole number of %d-byte values", len(b), size)
	}
	out := make([]T, len(b)/size)
	copy(Bytes(out), b)
	return out, nil
}

// AllGatherInt64 gathers one int64 per rank.
func AllGatherInt64(ctx context.Context, c Comm, v int64) ([]int64, error) {
	parts, err := c.AllGather(ctx, Bytes([]int64{v}))
	if err != nil {
		return nil, err
	}
	out := make([]int64, len(parts))
	for r, p := range parts {
		vs, err := FromBytes[int64](p)
		if err != nil || len(vs) != 1 {
			return nil, fmt.Errorf("ep: rank %d sent %d bytes for one int64", r, len(p))
		}
		out[r] = vs[0]
	}
	return out, nil
}

// FromBytesView views b as float32s without copying; b must start at a
// 4-byte boundary and hold whole values.
func FromBytesView(b []byte) ([]float32, error) {
	if len(b)%4 != 0 || (len(b) > 0 && uintptr(unsafe.Pointer(&b[0]))%4 != 0) {
		return nil, fmt.Errorf("ep: %d bytes are not an aligned run of float32s", len(b))
	}
	if len(b) == 0 {
		return nil, nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4), nil
}
