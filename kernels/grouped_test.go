package kernels_test

import (
	"context"
	"errors"
	"math/rand/v2"
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

// TestGroupedFFNWorkers: a group's down items wait only for its own
// gate/up items, so the order in which workers finish them varies; the
// outputs do not (the same bits on 1, 2, 3 and 8 workers, decode-sized
// and prefill-sized groups).
func TestGroupedFFNWorkers(t *testing.T) {
	for _, rows := range []int{1, 300} {
		groups := ffnGroups(t, 7, 96, 1100, true)
		x := make([]float32, 300*96)
		for i := range x {
			x[i] = float32(i%17)/8 - 1
		}
		for i := range groups {
			groups[i].Rows = groups[i].Rows[:0]
			for r := range rows {
				groups[i].Rows = append(groups[i].Rows, int32((r*7+i)%300))
			}
			groups[i].Out = make([]float32, rows*96)
		}
		var want [][]float32
		var sc kernels.Scratch
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
			require.Equal(t, want, got, "rows %d, workers %d", rows, w)
		}
	}
}

// TestGroupedFFNFault: an expert whose weights fault (unmapped under them)
// ends the call with the fault, on any number of workers, while other
// workers' down items wait for that expert: no hang, no panic.
func TestGroupedFFNFault(t *testing.T) {
	const hidden, inter = 64, 16 // one expert's gate: 4 KiB, one page
	for _, w := range []int{1, 2, 4} {
		groups := ffnGroups(t, 6, hidden, inter, false)
		page, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		require.NoError(t, err)
		gate, err := kernels.NewF32(inter, hidden, unsafe.Slice((*float32)(unsafe.Pointer(&page[0])), inter*hidden))
		require.NoError(t, err)
		require.NoError(t, unix.Munmap(page))
		groups[4].Gate = gate
		x := make([]float32, 2*hidden)
		err = kernels.GroupedFFN(context.Background(), w, x, groups, nil)
		var f *kernels.FaultError
		require.True(t, errors.As(err, &f), "workers %d: %v", w, err)
	}
}

// TestGroupedFFNCanceled: a canceled context ends the call with its error.
func TestGroupedFFNCanceled(t *testing.T) {
	groups := ffnGroups(t, 6, 64, 128, true)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, w := range []int{1, 2} {
		require.ErrorIs(t, kernels.GroupedFFN(ctx, w, make([]float32, 2*64), groups, nil), context.Canceled)
	}
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
