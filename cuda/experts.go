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
	bs                buffers

	graphs  bool // replay captured graphs when the step allows
	allowed bool
	buckets map[[2]int]*bucket // (0 routed | 1 shared, rows) → captured graph
	tmp     scratchPool        // the eager path's temporaries
	// Replays and Eager count the calls each way.
	Replays, Eager int
}

// EnableGraphs makes the runner replay CUDA graphs: each call's rows padded
// to a bucket (powers of two from 16 rows), the bucket's grouped FFN
// captured on first use, replayed whenever AllowGraph said yes for the
// step; eager launches otherwise. The results are the same bits.
func (x *Experts) EnableGraphs() { x.graphs = true }

// AllowGraph is the coordinator's vote for the coming step (every rank in
// decode or idle): graphs may replay.
func (x *Experts) AllowGraph(ok bool) { x.allowed = ok }

var _ moe.GraphVoter = (*Experts)(nil)

// runBucket runs groups on the bucket of their row count for a weight
// stack, capturing it on first use.
func (x *Experts) runBucket(kind, slots, inter int, xs []float32, groups []kernels.FFNGroup, slot func(int) int,
	gate, up, down Buffer) error {
	rows := 0
	for _, g := range groups {
		rows += len(g.Rows)
	}
	if rows == 0 {
		return nil
	}
	key := [2]int{kind, bucketRows(rows)}
	b := x.buckets[key]
	if b == nil {
		var err error
		if b, err = newBucket(x.dev, key[1], slots, x.hidden, inter, gate, up, down); err != nil {
			return err
		}
		if x.buckets == nil {
			x.buckets = map[[2]int]*bucket{}
		}
		x.buckets[key] = b
	}
	return b.run(xs, groups, slot)
}

var _ moe.ExpertRunner = (*Experts)(nil)

// NewExperts uploads the experts l holds (a shard of EP, or all of them).
// Hidden and intermediate sizes must be multiples of 16.
func NewExperts(d Launcher, l *moe.Layer) (*Experts, error) {
	c := l.Config
	if c.Hidden%16 != 0 || c.Inter%16 != 0 || c.SharedInter%16 != 0 {
		return nil, fmt.Errorf("cuda: experts: hidden %d and intermediate sizes %d, %d must be multiples of 16", c.Hidden, c.Inter, c.SharedInter)
	}
	x := &Experts{dev: d, hidden: c.Hidden, inter: c.Inter, slot: map[int]int{}, bs: buffers{d: d}, tmp: scratchPool{d: d}}
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
	put := x.bs.put
	x.gate, x.up, x.down = put(upload(d, gate)), put(upload(d, up)), put(upload(d, down))
	if s, _ := l.SharedExpert(); s != nil {
		x.sharedInter = s.Gate.Rows
		x.sGate, x.sUp, x.sDown = put(upload(d, bf16Rows(s.Gate))), put(upload(d, bf16Rows(s.Up))), put(upload(d, bf16Rows(s.Down)))
	}
	if x.bs.err != nil {
		x.Close()
		return nil, x.bs.err
	}
	return x, nil
}

// Close frees the device weights.
func (x *Experts) Close() {
	for _, b := range x.buckets {
		b.close()
	}
	x.buckets = nil
	x.tmp.free()
	x.bs.free()
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
	slots := max(1, len(x.slot))
	routedSlot := func(i int) int { return x.slot[routed[i].Expert] }
	if x.graphs && x.allowed {
		x.Replays++
		if err := x.runBucket(0, slots, x.inter, xs, routed, routedSlot, x.gate, x.up, x.down); err != nil {
			return err
		}
		return x.runBucket(1, 1, x.sharedInter, xs, shared, func(int) int { return 0 }, x.sGate, x.sUp, x.sDown)
	}
	x.Eager++
	sc := x.tmp.get()
	defer x.tmp.put(sc)
	if err := runGroups(x.dev, sc, xs, H, x.inter, slots, routed, routedSlot, x.gate, x.up, x.down); err != nil {
		return err
	}
	return runGroups(x.dev, sc, xs, H, x.sharedInter, 1, shared, func(int) int { return 0 }, x.sGate, x.sUp, x.sDown)
}
