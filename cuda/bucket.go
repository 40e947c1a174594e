//go:build cuda || cudaemu

package cuda

import (
	"github.com/moex-project/moex/kernels"
)

// bucket is the grouped FFN of one weight stack for a fixed row count, on
// fixed buffers, captured as a Graph: rows past a call's own are zero rows
// routed to slot 0 with a zero routing weight, and their outputs dropped.
// Each row's result does not depend on where the layout puts it, so a
// replay gives the bits of the eager path.
type bucket struct {
	d                                                    Launcher
	rows, slots, hidden, inter, blocks                   int
	xf, xb, ids, scale, counts, offsets, sorted, blockEx Buffer
	rowOf, h, hb, out                                    Buffer
	graph                                                Graph
	bs                                                   buffers
}

// bucketRows is the bucket of n rows: powers of two from 16.
func bucketRows(n int) int {
	b := 16
	for b < n {
		b *= 2
	}
	return b
}

func newBucket(d Launcher, rows, slots, H, I int, gate, up, down Buffer) (*bucket, error) {
	b := &bucket{d: d, rows: rows, slots: slots, hidden: H, inter: I, bs: buffers{d: d}}
	b.blocks = (rows + slots*(gemmBlock-1)) / gemmBlock
	padded := b.blocks * gemmBlock
	a := b.bs.alloc
	b.xf, b.xb = a(int64(rows*H*4)), a(int64(rows*H*2))
	b.ids, b.scale = a(int64(rows*4)), a(int64(rows*4))
	b.counts, b.offsets = a(int64(slots*4)), a(int64((slots+1)*4))
	b.sorted, b.blockEx, b.rowOf = a(int64(padded*4)), a(int64(b.blocks*4)), a(int64(rows*4))
	b.h, b.hb, b.out = a(int64(padded*I*4)), a(int64(padded*I*2)), a(int64(padded*H*4))
	if b.bs.err != nil {
		b.close()
		return nil, b.bs.err
	}
	g, err := d.Capture(func(d Launcher) error {
		for _, f := range []func() error{
			func() error { return d.F32ToBF16(b.xf, b.xb, rows*H) },
			func() error {
				return d.Align(b.ids, rows, 0, slots, gemmBlock, b.blocks, b.counts, b.offsets, b.sorted, b.blockEx, b.rowOf)
			},
			func() error { return d.GroupedSwiGLU(b.xb, gate, up, b.sorted, b.blockEx, padded, 1, rows, I, H, b.h) },
			func() error { return d.F32ToBF16(b.h, b.hb, padded*I) },
			func() error {
				return d.GroupedGEMM(b.hb, down, b.sorted, b.blockEx, padded, 1, rows, false, H, I, b.scale, b.out)
			},
		} {
			if err := f(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.close()
		return nil, err
	}
	b.graph = g
	return b, nil
}

func (b *bucket) close() {
	if b.graph != nil {
		b.graph.Close()
	}
	b.bs.free()
}

// run computes the groups (at most b.rows rows in all; group i on slot(i))
// by replaying the graph.
func (b *bucket) run(x []float32, groups []kernels.FFNGroup, slot func(i int) int) error {
	H := b.hidden
	xs := make([]float32, b.rows*H)
	ids := make([]int32, b.rows)
	scale := make([]float32, b.rows)
	p := 0
	for i, g := range groups {
		for j, r := range g.Rows {
			copy(xs[p*H:(p+1)*H], x[int(r)*H:int(r+1)*H])
			ids[p] = int32(slot(i))
			scale[p] = 1
			if g.Scale != nil {
				scale[p] = g.Scale[j]
			}
			p++
		}
	}
	for _, err := range []error{copyIn(b.d, b.xf, xs), copyIn(b.d, b.ids, ids), copyIn(b.d, b.scale, scale)} {
		if err != nil {
			return err
		}
	}
	if err := b.graph.Replay(); err != nil {
		return err
	}
	inv := make([]int32, b.rows)
	if err := download(b.d, b.rowOf, inv); err != nil {
		return err
	}
	all := make([]float32, b.blocks*gemmBlock*H)
	if err := download(b.d, b.out, all); err != nil {
		return err
	}
	p = 0
	for _, g := range groups {
		for i := range g.Rows {
			copy(g.Out[i*H:(i+1)*H], all[int(inv[p])*H:][:H])
			p++
		}
	}
	return nil
}
