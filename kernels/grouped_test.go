package kernels_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/moex-project/moex/kernels"
)

// ffnGroups returns n experts of [inter, hidden] F32 weights (packed or
// not), one row of x each, and their outputs.
func ffnGroups(t *testing.T, n, hidden, inter int, packed bool) []kernels.FFNGroup {
	rng := rand.New(rand.NewPCG(uint64(n), 7))
	mat := func(rows, cols int) kernels.Matrix {
		v := make([]float32, rows*cols)
		for i := range v {
			v[i] = 2*rng.Float32() - 1
		}
		m, err := kernels.NewF32(rows, cols, v)
		require.NoError(t, err)
		if packed {
			m = kernels.Pack(m)
		}
		return m
	}
	groups := make([]kernels.FFNGroup, n)
	for i := range groups {
		groups[i] = kernels.FFNGroup{Gate: mat(inter, hidden), Up: mat(inter, hidden), Down: mat(hidden, inter),
			Rows: []int32{int32(i % 2)}, Out: make([]float32, hidden), Expert: i}
	}
	return groups
}

// mixedGroups returns experts in every kind of weights whose h the last
// gate/up item prepares (int8-dot UINT4 with K-quant factors and INT8,
// bf16-dot, MXFP4 with its power-of-two ranges) beside packed F32 and bf16,
// and one expert with no rows; rows[i] rows of x each.
func mixedGroups(t *testing.T, hidden, inter int, rows []int) []kernels.FFNGroup {
	rng := rand.New(rand.NewPCG(uint64(len(rows)), 9))
	vals := func(r, c int) []float32 {
		v := make([]float32, r*c)
		for i := range v {
			v[i] = (2*rng.Float32() - 1) / 8
		}
		return v
	}
	mat := func(kind int, r, c int) kernels.Matrix {
		v := vals(r, c)
		var m kernels.Matrix
		var err error
		switch kind % 6 {
		case 0:
			m, err = kernels.NewF32(r, c, v)
			m = kernels.Pack(m)
		case 1, 4:
			u := make([]uint16, len(v))
			for i, f := range v {
				u[i] = uint16(math.Float32bits(f) >> 16)
			}
			if m, err = kernels.NewHalf(kernels.BF16, r, c, u); err == nil {
				if kind%6 == 4 {
					m, err = kernels.PackBF16Dot(m)
				} else {
					m = kernels.Pack(m)
				}
			}
		case 2:
			if m, err = kernels.Quantize(kernels.UINT4, v, r, c); err == nil {
				m, err = kernels.PackInt8Dot(m)
			}
		case 3:
			if m, err = kernels.Quantize(kernels.INT8, v, r, c); err == nil {
				m, err = kernels.PackInt8Dot(m)
			}
		case 5:
			if m, err = kernels.Quantize(kernels.MXFP4, v, r, c); err == nil {
				m = kernels.Pack(m)
			}
		}
		require.NoError(t, err)
		return m
	}
	groups := make([]kernels.FFNGroup, len(rows))
	for i := range groups {
		idx := make([]int32, rows[i])
		for r := range idx {
			idx[r] = int32((r*5 + i) % 40)
		}
		groups[i] = kernels.FFNGroup{Gate: mat(i, inter, hidden), Up: mat(i, inter, hidden), Down: mat(i, hidden, inter),
			Rows: idx, Out: make([]float32, rows[i]*hidden), Expert: i}
	}
	return groups
}

// TestGroupedFFNWorkers: a group's down items wait only for its own
// gate/up items, so the order in which workers finish them varies; the
// outputs do not: the same bits on 1, 2, 3 and 8 workers, for decode-sized
// and prefill-sized groups of every kind of weights (those whose h the
// last gate/up item quantizes, rounds or ranges among them), with one
// Scratch kept across calls of different group counts.
func TestGroupedFFNWorkers(t *testing.T) {
	const hidden, inter = 128, 1088 // inter: 17 tiles, not a multiple of the decode items
	x := make([]float32, 40*hidden)
	for i := range x {
		x[i] = float32(i%17)/8 - 1
	}
	var sc kernels.Scratch
	for _, rows := range [][]int{{1, 1, 2, 1, 1, 1, 0, 3}, {30, 1, 40, 7, 0, 12}, {2, 2}} {
		groups := mixedGroups(t, hidden, inter, rows)
		var want [][]float32
		for _, w := range []int{1, 2, 3, 8} {
			require.NoError(t, kernels.GroupedFFN(context.Background(), w, x, groups, &sc))
			var got [][]float32
			for _, g := range groups {
				got = append(got, append([]float32(nil), g.Out...))
				clear(g.Out)
			}
			if want == nil {
				want = got
				continue
			}
			require.Equal(t, want, got, "rows %v, workers %d", rows, w)
		}
		// Each group as it would run alone: the same bits.
		for i := range groups {
			require.NoError(t, kernels.GroupedFFN(context.Background(), 2, x, groups[i:i+1], nil))
			require.Equal(t, want[i], append([]float32(nil), groups[i].Out...), "rows %v, group %d alone", rows, i)
		}
	}
}

// TestGroupedFFNFault: an expert whose weights fault (on a page that may
// not be read) ends the call with the fault, on any number of workers,
// while other workers' down items wait for that expert: no hang, no panic.
func TestGroupedFFNFault(t *testing.T) {
	const hidden, inter = 64, 16 // one expert's gate: 4 KiB, one page
	for _, w := range []int{1, 2, 4} {
		groups := ffnGroups(t, 6, hidden, inter, false)
		page, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		require.NoError(t, err)
		gate, err := kernels.NewF32(inter, hidden, unsafe.Slice((*float32)(unsafe.Pointer(&page[0])), inter*hidden))
		require.NoError(t, err)
		require.NoError(t, unix.Mprotect(page, unix.PROT_NONE))
		groups[4].Gate = gate
		x := make([]float32, 2*hidden)
		err = kernels.GroupedFFN(context.Background(), w, x, groups, nil)
		var f *kernels.FaultError
		require.True(t, errors.As(err, &f), "workers %d: %v", w, err)
		assert.Equal(t, uintptr(unsafe.Pointer(&page[0])), f.Addr&^4095)
		require.NoError(t, unix.Munmap(page))
	}
}

// countdown is a context that is canceled once Err has been asked n times:
// a cancellation in the middle of a call, wherever the call looks.
type countdown struct {
	context.Context
	n atomic.Int32
}

func (c *countdown) Err() error {
	if c.n.Add(-1) < 0 {
		return context.Canceled
	}
	return nil
}

// TestGroupedFFNCanceled: a context canceled before or during the call
// ends it with the context's error, down items waiting included.
func TestGroupedFFNCanceled(t *testing.T) {
	groups := ffnGroups(t, 6, 64, 128, true)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, w := range []int{1, 2} {
		require.ErrorIs(t, kernels.GroupedFFN(ctx, w, make([]float32, 2*64), groups, nil), context.Canceled)
	}
	midway := 0
	for n := range int32(40) {
		for _, w := range []int{1, 2, 3} {
			c := &countdown{Context: context.Background()}
			c.n.Store(n)
			err := kernels.GroupedFFN(c, w, make([]float32, 2*64), groups, nil)
			if err != nil { // late enough, the call has finished first
				require.ErrorIs(t, err, context.Canceled, "after %d looks, %d workers", n, w)
				if n > 0 {
					midway++
				}
			}
		}
	}
	assert.Positive(t, midway, "no call was canceled midway")
}

// TestGroupedFFNAllocs: with its Scratch kept, a decode step on the SIMD
// kernels allocates only its workers' goroutines and a few words an item,
// not its buffers or work lists (a step that allocates much makes the
// garbage collector and fresh pages part of every step). The generic
// code, the reference, allocates its rows an item.
func TestGroupedFFNAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	if kernels.Implementation() == "generic" {
		t.Skip("the generic code allocates an item's rows")
	}
	groups := ffnGroups(t, 6, 256, 512, true)
	x := make([]float32, 2*256)
	var sc kernels.Scratch
	step := func() { require.NoError(t, kernels.GroupedFFN(context.Background(), 2, x, groups, &sc)) }
	step()
	allocs := testing.AllocsPerRun(20, step)
	t.Logf("%.1f allocations a step", allocs)
	assert.LessOrEqual(t, allocs, 16.0)
}
