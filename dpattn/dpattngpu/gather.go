//go:build cuda || cudaemu

package dpattngpu

import (
	"context"
	"fmt"
	"time"

	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/dpattn"
	"github.com/moex-project/moex/ep/epgpu"
	"github.com/moex-project/moex/moe"
	"github.com/moex-project/moex/moe/moegpu"
)

// GatherMoE is gather mode's MoE stage of one rank on its device
// (dpattn.GatherRunner): the ranks' hidden states all-gathered into device
// memory, the router and this rank's contiguous shard of experts over every
// token, the partial outputs reduce-scattered back, and the shared expert
// on the rank's own rows added: no trip through the host between the
// gather and the scatter. Each step runs on the buffers of a bucket, every
// rank's rows padded with zero rows to the same power of two (the ranks'
// largest count), so the whole stage, collectives included, is captured
// once per bucket as a graph and replayed whenever the step's vote allows,
// as SGLang replays its decode graphs; an IDLE rank (no tokens) replays all
// padding. A bucket is captured on its second step the vote allows, after
// an eager one (NCCL sets up its connections on a collective's first run,
// which a capture may not do), and only kept if every rank captured it
// (epgpu.DeviceComm.Agree): a bucket that failed anywhere (a communicator that
// stages through the host, no memory) runs eagerly from then on everywhere,
// its first error in CaptureErr.
//
// Activations are rounded to bf16 on the device, so the output matches the
// CPU's MoEGather within the tensor-core tolerance; a replay gives the bits
// of the eager launches. One goroutine (the rank's) calls it.
type GatherMoE struct {
	m       *moegpu.MoE
	comm    epgpu.DeviceComm
	buckets map[int]*gatherBucket
	host    []float32 // the padded rows, staged
	cuda.GraphMode
}

var (
	_ dpattn.GatherRunner = (*GatherMoE)(nil)
	_ moe.GraphVoter      = (*GatherMoE)(nil)
	_ moe.GraphCounter    = (*GatherMoE)(nil)
)

// gatherBucket is the stage's buffers for B rows per rank: the rank's rows
// (in), the MoE pipeline's partial stage over every rank's rows, the
// scattered sum (mine) and the shared expert on the rank's own rows.
type gatherBucket struct {
	B      int // rows per rank
	in     cuda.Buffer
	routed *moegpu.Stage
	mine   cuda.Buffer
	shared *moegpu.SharedStage // nil without a shared expert
	graphSlot
	bs *cuda.Buffers
}

// graphSlot is the graph of one step shape and its history.
type graphSlot struct {
	graph   cuda.Graph
	noGraph bool // no graph for this shape from now on
	warm    bool // run eagerly once
}

func (s *graphSlot) close() {
	if s.graph != nil {
		s.graph.Close()
		s.graph = nil
	}
}

// NewGatherMoE uploads shard (the router, a contiguous range of experts as
// ep.Contiguous places them, the shared expert) to dev as bf16; comm
// carries the hidden states between the ranks' devices.
func NewGatherMoE(dev cuda.Launcher, shard *moe.Layer, comm epgpu.DeviceComm) (*GatherMoE, error) {
	m, err := moegpu.NewMoE(dev, shard)
	if err != nil {
		return nil, err
	}
	return &GatherMoE{m: m, comm: comm, buckets: map[int]*gatherBucket{}}, nil
}

// Close frees the buckets and the weights.
func (g *GatherMoE) Close() error {
	for _, b := range g.buckets {
		b.close()
		b.bs.Free()
	}
	g.buckets = nil
	g.m.Close()
	return nil
}

// bucketOf is the bucket of a step: every rank's rows padded to the ranks'
// largest count, rounded up to a power of two.
func (g *GatherMoE) bucketOf(plan *dpattn.StepPlan) (*gatherBucket, error) {
	most := int64(1)
	for _, n := range plan.Counts {
		most = max(most, n)
	}
	return g.bucket(cuda.Pow2(int(most)))
}

// output is the buffer holding a bucket's result: the scattered sum, plus
// the shared expert when the layer has one.
func (g *GatherMoE) output(b *gatherBucket) cuda.Buffer {
	if b.shared != nil {
		return b.shared.Out()
	}
	return b.mine
}

func (g *GatherMoE) bucket(B int) (*gatherBucket, error) {
	if b := g.buckets[B]; b != nil {
		return b, nil
	}
	H, d := g.m.Config().Hidden, g.m.Device()
	b := &gatherBucket{B: B, bs: cuda.NewBuffers(d)}
	fail := func(err error) (*gatherBucket, error) {
		b.bs.Free()
		return nil, fmt.Errorf("cuda: gather step of %d rows per rank: %w", B, err)
	}
	var err error
	if b.shared, err = g.m.NewSharedStage(b.bs, B); err != nil {
		return fail(err)
	}
	if b.shared != nil {
		b.in = b.shared.In() // the shared expert reads the rank's own rows
	} else {
		b.in = b.bs.Alloc(int64(B * H * 4))
	}
	if b.routed, err = g.m.NewStage(b.bs, g.comm.Size()*B, true); err != nil {
		return fail(err)
	}
	b.mine = b.bs.Alloc(int64(B * H * 4))
	if b.bs.Err() == nil {
		// Rows past a step's own stay finite: zeros until written.
		b.bs.Keep(cuda.CopyIn(d, b.in, make([]float32, B*H)))
	}
	if err := b.bs.Err(); err != nil {
		return fail(err)
	}
	g.buckets[B] = b
	return b, nil
}

// enqueue launches the stage on b's buffers on l (the device or a recorder
// of it): the all-gather, the MoE pipeline's partial stage (every token's
// sum over this rank's experts, zero for none, in ascending expert id),
// the reduce-scatter adding the ranks' sums, the shared expert.
func (g *GatherMoE) enqueue(ctx context.Context, l cuda.Launcher, b *gatherBucket) error {
	H, B := g.m.Config().Hidden, b.B
	if err := g.comm.AllGather(ctx, l, b.in, b.routed.In(), int64(B*H*4)); err != nil {
		return err
	}
	if err := b.routed.Enqueue(l); err != nil {
		return err
	}
	if err := g.comm.ReduceScatter(ctx, l, b.routed.Out(), b.mine, B*H); err != nil {
		return err
	}
	if b.shared != nil {
		return b.shared.Enqueue(l, b.mine)
	}
	return nil
}

// Forward runs the stage for this rank's rows x of plan into y. Every rank
// of the communicator calls it for the step (an IDLE rank with no rows).
// The stage's time goes to times.Experts: on the device the gather, the
// experts and the scatter are one stream of work.
func (g *GatherMoE) Forward(ctx context.Context, plan *dpattn.StepPlan, x, y []float32, times *dpattn.GatherTimes) error {
	t0 := time.Now()
	H, R, r := g.m.Config().Hidden, g.comm.Size(), g.comm.Rank()
	if len(plan.Counts) != R {
		return fmt.Errorf("cuda: gather step: the plan has %d ranks, the communicator %d", len(plan.Counts), R)
	}
	mine := int(plan.Counts[r])
	if len(x) != mine*H || len(y) != len(x) {
		return fmt.Errorf("cuda: gather step: x has %d values and y %d, the plan says %d tokens of %d", len(x), len(y), mine, H)
	}
	if err := moe.CheckFinite(x, H); err != nil {
		return err
	}
	b, err := g.bucketOf(plan)
	if err != nil {
		return err
	}
	B := b.B
	if cap(g.host) < B*H {
		g.host = make([]float32, B*H)
	}
	xp := g.host[:B*H]
	copy(xp, x)
	clear(xp[len(x):]) // padding rows are zeros, never last step's values
	if err := cuda.CopyIn(g.m.Device(), b.in, xp); err != nil {
		return err
	}
	if b.shared != nil {
		if err := b.shared.Gate(x); err != nil {
			return err
		}
	}
	d := g.m.Device()
	enqueue := func(l cuda.Launcher) error { return g.enqueue(ctx, l, b) }
	var graph cuda.Graph
	if g.Replaying() && !b.noGraph {
		if b.graph == nil && b.warm {
			// The same on every rank (the vote, the bucket's history), so
			// every rank agrees here.
			captured, cerr := g.Capture(d, fmt.Sprintf("cuda: gather step of %d rows per rank", B), enqueue)
			ok, err := g.comm.Agree(ctx, cerr == nil)
			switch {
			case err != nil || !ok:
				if captured != nil {
					captured.Close()
				}
				if err != nil {
					return err
				}
				b.noGraph = true // eagerly from now on, on every rank
			default:
				b.graph = captured
			}
		}
		graph = b.graph
	}
	if graph == nil {
		b.warm = true
	}
	if err := g.Run(ctx, d, graph, enqueue); err != nil {
		return err
	}
	if err := g.comm.Wait(ctx); err != nil {
		return err
	}
	if err := cuda.Download(g.m.Device(), g.output(b), y); err != nil {
		return err
	}
	if times != nil {
		times.Experts += time.Since(t0)
	}
	return nil
}
