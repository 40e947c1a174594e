//go:build cuda || cudaemu

package cuda

import (
	"fmt"

	"github.com/moex-project/moex/kernels"
)

// GroupedFFN is kernels.GroupedFFN on a device: every group's SwiGLU FFN
// over the rows of x [tokens, hidden] it names, scaled by its routing
// weights, into its Out. Weights must be bf16 and every group's shapes the
// same, hidden and intermediate sizes multiples of 16. Activations are
// rounded to bf16 on the device (tensor-core numerics).
//
// The rows are gathered into one batch on the host, the dispatch layout is
// built by the align kernel (one expert per group), and the two grouped
// GEMMs run over it. Weights are uploaded on every call: this is the
// contract's device form, for conformance tests and one-off use; MoE keeps
// its weights resident.
func GroupedFFN(d Launcher, x []float32, groups []kernels.FFNGroup) error {
	if len(groups) == 0 {
		return nil
	}
	g0 := groups[0]
	H, I := g0.Gate.Cols, g0.Gate.Rows
	if H%16 != 0 || I%16 != 0 || H == 0 || I == 0 {
		return fmt.Errorf("cuda: grouped FFN: hidden %d and intermediate %d must be positive multiples of 16", H, I)
	}
	if len(x)%H != 0 {
		return fmt.Errorf("cuda: grouped FFN: x has %d values, not a multiple of hidden size %d", len(x), H)
	}
	T := len(x) / H
	P := 0
	for e, g := range groups {
		for i, m := range []kernels.Matrix{g.Gate, g.Up, g.Down} {
			if m.DType != kernels.BF16 {
				return fmt.Errorf("cuda: grouped FFN: group %d %s weights are %v; the device kernels take bf16",
					e, [...]string{"gate", "up", "down"}[i], m.DType)
			}
		}
		if g.Gate.Rows != I || g.Gate.Cols != H || g.Up.Rows != I || g.Up.Cols != H || g.Down.Rows != H || g.Down.Cols != I {
			return fmt.Errorf("cuda: grouped FFN: group %d has gate %dx%d, up %dx%d, down %dx%d; group 0 sets [%d, %d] and [%d, %d]",
				e, g.Gate.Rows, g.Gate.Cols, g.Up.Rows, g.Up.Cols, g.Down.Rows, g.Down.Cols, I, H, H, I)
		}
		if err := checkRows(e, g, H, T); err != nil {
			return err
		}
		P += len(g.Rows)
	}
	if P == 0 {
		return nil
	}

	var gate, up, down []uint16
	for _, g := range groups {
		gate = append(gate, bf16Rows(g.Gate)...)
		up = append(up, bf16Rows(g.Up)...)
		down = append(down, bf16Rows(g.Down)...)
	}
	bs := &buffers{d: d}
	defer bs.free()
	wg, wu, wd := bs.put(upload(d, gate)), bs.put(upload(d, up)), bs.put(upload(d, down))
	if bs.err != nil {
		return bs.err
	}
	sc := &scratch{d: d}
	defer sc.free()
	return runGroups(d, sc, x, H, I, len(groups), groups, func(i int) int { return i }, wg, wu, wd)
}

// runGroups runs the groups' FFNs on weights stacked in device buffers
// (gate and up [slots, inter, hidden], down [slots, hidden, inter]; group
// i uses slot(i)): the named rows batched, the layout built by the align
// kernel, the fused SwiGLU GEMM, the weighted down GEMM, and the rows back
// into each group's Out, its temporaries in sc. Shapes are the caller's to
// check.
func runGroups(d Launcher, sc *scratch, x []float32, H, I, slots int, groups []kernels.FFNGroup, slot func(i int) int, gate, up, down Buffer) error {
	P := 0
	for _, g := range groups {
		P += len(g.Rows)
	}
	if P == 0 {
		return nil
	}
	// One batch of the named rows; pair p belongs to its group's slot.
	xs := make([]float32, 0, P*H)
	ids := make([]int32, 0, P)
	scale := make([]float32, 0, P)
	for i, g := range groups {
		for j, r := range g.Rows {
			xs = append(xs, x[int(r)*H:int(r+1)*H]...)
			ids = append(ids, int32(slot(i)))
			s := float32(1)
			if g.Scale != nil {
				s = g.Scale[j]
			}
			scale = append(scale, s)
		}
	}
	var err error
	alloc := func(i int, bytes int64) Buffer {
		b, e := sc.at(i, bytes)
		if e != nil && err == nil {
			err = e
		}
		return b
	}
	maxRows := P + slots*(gemmBlock-1)
	xf, idb, sb, xb := alloc(0, int64(len(xs)*4)), alloc(1, int64(P*4)), alloc(2, int64(P*4)), alloc(3, int64(P*H*2))
	counts, offsets := alloc(4, int64(slots*4)), alloc(5, int64((slots+1)*4))
	sorted, blockExpert, rows := alloc(6, int64(maxRows*4)), alloc(7, int64((maxRows/gemmBlock+1)*4)), alloc(8, int64(P*4))
	if err != nil {
		return err
	}
	for _, f := range []func() error{
		func() error { return copyIn(d, xf, xs) },
		func() error { return copyIn(d, idb, ids) },
		func() error { return copyIn(d, sb, scale) },
	} {
		if err := f(); err != nil {
			return err
		}
	}
	if err := d.F32ToBF16(xf, xb, P*H); err != nil {
		return err
	}
	if err := d.Align(idb, P, 0, slots, gemmBlock, maxRows/gemmBlock+1, counts, offsets, sorted, blockExpert, rows); err != nil {
		return err
	}
	off := make([]int32, slots+1)
	if err := download(d, offsets, off); err != nil {
		return err
	}
	padded := int(off[slots])
	h, hb, out := alloc(9, int64(padded*I*4)), alloc(10, int64(padded*I*2)), alloc(11, int64(padded*H*4))
	if err != nil {
		return err
	}
	if err := d.GroupedSwiGLU(xb, gate, up, sorted, blockExpert, padded, 1, P, I, H, h); err != nil {
		return err
	}
	if err := d.F32ToBF16(h, hb, padded*I); err != nil {
		return err
	}
	if err := d.GroupedGEMM(hb, down, sorted, blockExpert, padded, 1, P, false, H, I, sb, out); err != nil {
		return err
	}

	// Back to the groups: pair p's output is row rows[p] of the layout.
	inv := make([]int32, P)
	if err := download(d, rows, inv); err != nil {
		return err
	}
	all := make([]float32, padded*H)
	if err := download(d, out, all); err != nil {
		return err
	}
	p := 0
	for _, g := range groups {
		for i := range g.Rows {
			copy(g.Out[i*H:(i+1)*H], all[int(inv[p])*H:][:H])
			p++
		}
	}
	return nil
}

// checkRows checks group e's rows, scales and output against x's T rows.
func checkRows(e int, g kernels.FFNGroup, H, T int) error {
	if g.Scale != nil && len(g.Scale) != len(g.Rows) {
		return fmt.Errorf("cuda: grouped FFN: group %d has %d rows and %d scales", e, len(g.Rows), len(g.Scale))
	}
	if len(g.Out) != len(g.Rows)*H {
		return fmt.Errorf("cuda: grouped FFN: group %d output has %d values, want %d rows × %d", e, len(g.Out), len(g.Rows), H)
	}
	for _, r := range g.Rows {
		if r < 0 || int(r) >= T {
			return fmt.Errorf("cuda: grouped FFN: group %d names row %d of %d", e, r, T)
		}
	}
	return nil
}
