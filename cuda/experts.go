//go:build cuda || cudaemu

package cuda

import (
	"context"
	"fmt"

	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// Experts runs a layer's grouped expert FFNs on a device (moe.ExpertRunner):
// the routed experts the layer holds and its shared expert stay there as
// bf16, stacked for the grouped GEMMs; each call moves only the rows and
// the outputs. Set it as the layer's Experts to run that layer's experts
// on the device (activations rounded to bf16 there).
type Experts struct {
	dev               Launcher
	hidden, inter     int
	slot              map[int]int // expert id → index in the stacks
	gate, up, down    Buffer
	sharedInter       int
	sGate, sUp, sDown Buffer
}

var _ moe.ExpertRunner = (*Experts)(nil)

// NewExperts uploads the experts l holds (a shard of EP, or all of them).
// Hidden and intermediate sizes must be multiples of 16.
func NewExperts(d Launcher, l *moe.Layer) (*Experts, error) {
	c := l.Config
	if c.Hidden%16 != 0 || c.Inter%16 != 0 || c.SharedInter%16 != 0 {
		return nil, fmt.Errorf("cuda: experts: hidden %d and intermediate sizes %d, %d must be multiples of 16", c.Hidden, c.Inter, c.SharedInter)
	}
	x := &Experts{dev: d, hidden: c.Hidden, inter: c.Inter, slot: map[int]int{}}
	var gate, up, down []uint16
	for e := 0; e < c.NumExperts; e++ {
		w, ok := l.Expert(e)
		if !ok {
			continue
		}
		x.slot[e] = len(x.slot)
		gate = append(gate, bf16Rows(w.Gate)...)
		up = append(up, bf16Rows(w.Up)...)
		down = append(down, bf16Rows(w.Down)...)
	}
	var err error
	put := func(b Buffer, e error) Buffer {
		if e != nil && err == nil {
			err = e
		}
		return b
	}
	x.gate, x.up, x.down = put(upload(d, gate)), put(upload(d, up)), put(upload(d, down))
	if s, _ := l.SharedExpert(); s != nil {
		x.sharedInter = s.Gate.Rows
		x.sGate, x.sUp, x.sDown = put(upload(d, bf16Rows(s.Gate))), put(upload(d, bf16Rows(s.Up))), put(upload(d, bf16Rows(s.Down)))
	}
	if err != nil {
		x.Close()
		return nil, err
	}
	return x, nil
}

// Close frees the device weights.
func (x *Experts) Close() {
	for _, b := range []Buffer{x.gate, x.up, x.down, x.sGate, x.sUp, x.sDown} {
		if b.id != 0 {
			x.dev.Free(b)
		}
	}
}

// GroupedFFN computes the groups on the device: routed experts by their
// id, the shared expert (kernels.SharedExpert) in a launch of its own.
func (x *Experts) GroupedFFN(ctx context.Context, xs []float32, groups []kernels.FFNGroup) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	H := x.hidden
	if len(xs)%H != 0 {
		return fmt.Errorf("cuda: experts: x has %d values, not a multiple of hidden size %d", len(xs), H)
	}
	var routed, shared []kernels.FFNGroup
	for i, g := range groups {
		if err := checkRows(i, g, H, len(xs)/H); err != nil {
			return err
		}
		switch _, ok := x.slot[g.Expert]; {
		case ok:
			routed = append(routed, g)
		case g.Expert == kernels.SharedExpert && x.sharedInter > 0:
			shared = append(shared, g)
		case g.Expert == kernels.SharedExpert:
			return fmt.Errorf("cuda: experts: group %d is a shared expert; the layer has none", i)
		default:
			return fmt.Errorf("cuda: experts: group %d needs expert %d, which is not on the device", i, g.Expert)
		}
	}
	if err := runGroups(x.dev, xs, H, x.inter, max(1, len(x.slot)), routed, func(i int) int { return x.slot[routed[i].Expert] },
		x.gate, x.up, x.down); err != nil {
		return err
	}
	return runGroups(x.dev, xs, H, x.sharedInter, 1, shared, func(int) int { return 0 }, x.sGate, x.sUp, x.sDown)
}
