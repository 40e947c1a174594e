//go:build cuda || cudaemu

package moegpu

import (
	"context"
	"fmt"

	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// Experts runs a layer's grouped expert FFNs on a device (moe.ExpertRunner):
// the routed experts the layer holds and its shared expert stay there as
// bf16, stacked for the grouped GEMMs; each call moves only the rows and
// the outputs. Set it as the layer's Experts to run that layer's experts
// on the device (activations rounded to bf16 there). One goroutine at a
// time calls it.
type Experts struct {
	dev    cuda.Launcher
	hidden int
	slot   map[int]int // expert id → index in the routed stack
	routed stack
	shared *stack
	bs     *cuda.Buffers

	buckets map[[2]int]*bucket // (0 routed | 1 shared, rows) → captured graph
	tmp     *cuda.ScratchPool  // the eager path's temporaries

	// With graphs enabled, each call's rows are padded to a bucket (powers
	// of two from 16 rows), the bucket's grouped FFN captured on first use
	// and replayed whenever the step's vote allows.
	cuda.GraphMode
}

var (
	_ moe.ExpertRunner = (*Experts)(nil)
	_ moe.GraphVoter   = (*Experts)(nil)
	_ moe.GraphCounter = (*Experts)(nil)
)

// NewExperts uploads the experts l holds (a shard of EP, or all of them).
// Hidden and intermediate sizes must be multiples of 16. On error nothing
// stays on the device.
func NewExperts(d cuda.Launcher, l *moe.Layer) (*Experts, error) {
	c := l.Config
	if c.Hidden%16 != 0 || c.Inter%16 != 0 || c.SharedInter%16 != 0 {
		return nil, fmt.Errorf("cuda: experts: hidden %d and intermediate sizes %d, %d must be multiples of 16", c.Hidden, c.Inter, c.SharedInter)
	}
	x := &Experts{dev: d, hidden: c.Hidden, slot: map[int]int{}, bs: cuda.NewBuffers(d), tmp: cuda.NewScratchPool(d)}
	var held []moe.Expert
	for e := 0; e < c.NumExperts; e++ {
		if w, ok := l.Expert(e); ok {
			x.slot[e] = len(held)
			held = append(held, w)
		}
	}
	x.routed = uploadStack(x.bs, held, 0, c.Hidden, c.Inter, c.Act, c.WeightOnInput)
	if s, _ := l.SharedExpert(); s != nil {
		st := uploadStack(x.bs, []moe.Expert{*s}, 0, c.Hidden, s.Gate.Rows, c.SharedAct, false)
		x.shared = &st
	}
	if err := x.bs.Err(); err != nil {
		x.bs.Free()
		return nil, err
	}
	return x, nil
}

// Close frees the device weights and graphs.
func (x *Experts) Close() error {
	for _, b := range x.buckets {
		b.close()
	}
	x.buckets = nil
	x.tmp.Free()
	x.bs.Free()
	return nil
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
		case g.Expert == kernels.SharedExpert && x.shared != nil:
			shared = append(shared, g)
		case g.Expert == kernels.SharedExpert:
			return fmt.Errorf("cuda: experts: group %d is a shared expert; the layer has none", i)
		default:
			return fmt.Errorf("cuda: experts: group %d needs expert %d, which is not on the device", i, g.Expert)
		}
	}
	routedSlot := func(i int) int { return x.slot[routed[i].Expert] }
	sharedSlot := func(int) int { return 0 }
	if x.Replaying() {
		x.CountReplay()
		if err := x.runBucket(ctx, 0, &x.routed, xs, routed, routedSlot); err != nil {
			return err
		}
		return x.runBucket(ctx, 1, x.shared, xs, shared, sharedSlot)
	}
	x.CountEager()
	sc := x.tmp.Get()
	defer x.tmp.Put(sc)
	if err := runGroups(x.dev, sc, &x.routed, xs, routed, routedSlot); err != nil {
		return err
	}
	return runGroups(x.dev, sc, x.shared, xs, shared, sharedSlot)
}

// runBucket runs groups on the bucket of their row count for a weight
// stack, capturing it on first use.
func (x *Experts) runBucket(ctx context.Context, kind int, st *stack, xs []float32, groups []kernels.FFNGroup, slot func(int) int) error {
	rows := groupRows(groups)
	if rows == 0 {
		return nil
	}
	key := [2]int{kind, bucketRows(rows)}
	b := x.buckets[key]
	if b == nil {
		var err error
		if b, err = newBucket(x.dev, st, key[1]); err != nil {
			return err
		}
		if x.buckets == nil {
			x.buckets = map[[2]int]*bucket{}
		}
		x.buckets[key] = b
	}
	if err := b.run.stageIn(x.dev, xs, groups, slot); err != nil {
		return err
	}
	if err := b.graph.Replay(ctx); err != nil {
		return err
	}
	return b.run.collect(x.dev, groups)
}

// GroupedFFN is kernels.GroupedFFN on a device: every group's SwiGLU FFN
// over the rows of x [tokens, hidden] it names, scaled by its routing
// weights, into its Out. Weights must be bf16 and every group's shapes the
// same, hidden and intermediate sizes multiples of 16. Activations are
// rounded to bf16 on the device (tensor-core numerics).
//
// The rows are gathered into one batch on the host, the dispatch layout is
// built by the align kernel (one expert per group), and the two grouped
// GEMMs run over it. Weights are uploaded on every call: this is the
// contract's device form, for conformance tests and one-off use; MoE and
// Experts keep their weights resident.
func GroupedFFN(ctx context.Context, d cuda.Launcher, x []float32, groups []kernels.FFNGroup) error {
	if err := ctx.Err(); err != nil {
		return err
	}
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
	experts := make([]moe.Expert, len(groups))
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
		if g.Act != g0.Act || g.ScaleInput != g0.ScaleInput || (g.GateBias == nil) != (g0.GateBias == nil) {
			return fmt.Errorf("cuda: grouped FFN: group %d's activation %v, input scaling %v or biases differ from group 0's (%v, %v): one launch runs one epilogue",
				e, g.Act.Kind, g.ScaleInput, g0.Act.Kind, g0.ScaleInput)
		}
		if (g.GateBias != nil) && (len(g.GateBias) != I || len(g.UpBias) != I || len(g.DownBias) != H) {
			return fmt.Errorf("cuda: grouped FFN: group %d has biases of %d, %d and %d values, want %d, %d and %d", e, len(g.GateBias), len(g.UpBias), len(g.DownBias), I, I, H)
		}
		experts[e] = moe.Expert{Gate: g.Gate, Up: g.Up, Down: g.Down, GateBias: g.GateBias, UpBias: g.UpBias, DownBias: g.DownBias}
	}
	if groupRows(groups) == 0 {
		return nil
	}
	bs := cuda.NewBuffers(d)
	defer bs.Free()
	st := uploadStack(bs, experts, 0, H, I, g0.Act, g0.ScaleInput)
	if err := bs.Err(); err != nil {
		return err
	}
	sc := cuda.NewScratch(d)
	defer sc.Free()
	return runGroups(d, sc, &st, x, groups, func(i int) int { return i })
}

// groupRun is a grouped FFN of host-made groups on a stack: the groups'
// rows batched into in (fp32 [rows, hidden]), each row's slot in ids and
// its routing weight in scale (rows past the groups' are zero rows of slot
// 0 and weight 0), the pipeline's grouped FFN over them, and each pair's
// output row read back into its group's Out.
type groupRun struct {
	rows               int
	in, xb, ids, scale cuda.Buffer
	ffn                *ffnRun
	hidden             int
}

func newGroupRun(a cuda.Allocator, st *stack, rows int) (*groupRun, error) {
	H := st.hidden
	r := &groupRun{rows: rows, hidden: H}
	r.in, r.xb = a.Alloc(int64(rows*H*4)), a.Alloc(int64(rows*H*2))
	r.ids, r.scale = a.Alloc(int64(rows*4)), a.Alloc(int64(rows*4))
	r.ffn = newFFNRun(a, st, rows, 1)
	return r, a.Err()
}

func (r *groupRun) enqueue(l cuda.Launcher) error {
	if err := l.F32ToBF16(r.in, r.xb, r.rows*r.hidden); err != nil {
		return err
	}
	return r.ffn.enqueue(l, r.xb, r.ids, r.scale)
}

// stageIn copies the groups' rows of x (at most r.rows; group i on
// slot(i)) into the run's buffers.
func (r *groupRun) stageIn(d cuda.Launcher, x []float32, groups []kernels.FFNGroup, slot func(i int) int) error {
	H := r.hidden
	xs := make([]float32, r.rows*H)
	ids := make([]int32, r.rows)
	scale := make([]float32, r.rows)
	p := 0
	for i, g := range groups {
		for j, row := range g.Rows {
			copy(xs[p*H:(p+1)*H], x[int(row)*H:int(row+1)*H])
			ids[p] = int32(slot(i))
			scale[p] = 1
			if g.Scale != nil {
				scale[p] = g.Scale[j]
			}
			p++
		}
	}
	for _, err := range []error{cuda.CopyIn(d, r.in, xs), cuda.CopyIn(d, r.ids, ids), cuda.CopyIn(d, r.scale, scale)} {
		if err != nil {
			return err
		}
	}
	return nil
}

// collect copies each pair's output row into its group's Out.
func (r *groupRun) collect(d cuda.Launcher, groups []kernels.FFNGroup) error {
	H := r.hidden
	inv := make([]int32, r.rows)
	if err := cuda.Download(d, r.ffn.rowsOf, inv); err != nil {
		return err
	}
	all := make([]float32, r.ffn.blocks*cuda.GEMMBlock*H)
	if err := cuda.Download(d, r.ffn.out, all); err != nil {
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

// runGroups runs the groups' FFNs eagerly on st, group i on slot(i), their
// temporaries in sc. Shapes are the caller's to check.
func runGroups(d cuda.Launcher, sc *cuda.Scratch, st *stack, x []float32, groups []kernels.FFNGroup, slot func(i int) int) error {
	P := groupRows(groups)
	if P == 0 {
		return nil
	}
	r, err := newGroupRun(cuda.NewScratchAlloc(sc), st, P)
	if err != nil {
		return err
	}
	if err := r.stageIn(d, x, groups, slot); err != nil {
		return err
	}
	if err := r.enqueue(d); err != nil {
		return err
	}
	return r.collect(d, groups)
}

// bucket is a groupRun of a fixed row count on buffers of its own,
// captured as a Graph: rows past a call's own are zero rows, their outputs
// dropped. Each row's result does not depend on where the layout puts it,
// so a replay gives the bits of the eager path.
type bucket struct {
	run   *groupRun
	graph cuda.Graph
	bs    *cuda.Buffers
}

// bucketRows is the bucket of n rows: powers of two from 16.
func bucketRows(n int) int { return max(16, cuda.Pow2(n)) }

func newBucket(d cuda.Launcher, st *stack, rows int) (*bucket, error) {
	b := &bucket{bs: cuda.NewBuffers(d)}
	var err error
	if b.run, err = newGroupRun(b.bs, st, rows); err != nil {
		b.close()
		return nil, err
	}
	if b.graph, err = d.Capture(b.run.enqueue); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

func (b *bucket) close() {
	if b.graph != nil {
		b.graph.Close()
	}
	b.bs.Free()
}

func groupRows(groups []kernels.FFNGroup) int {
	n := 0
	for _, g := range groups {
		n += len(g.Rows)
	}
	return n
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
