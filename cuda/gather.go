//go:build cuda || cudaemu

package cuda

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/moex-project/moex/dpattn"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
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
// (DeviceComm.Agree): a bucket that failed anywhere (a communicator that
// stages through the host, no memory) runs eagerly from then on everywhere,
// its first error in CaptureErr.
//
// Activations are rounded to bf16 on the device, so the output matches the
// CPU's MoEGather within the tensor-core tolerance; a replay gives the bits
// of the eager launches. One goroutine (the rank's) calls it.
type GatherMoE struct {
	m       *MoE
	comm    DeviceComm
	graphs  bool
	allowed bool
	buckets map[int]*gatherBucket
	host    []float32 // the padded rows, staged
	// Replays and Eager count the steps each way.
	Replays, Eager int
	// CaptureErr is the first capture that failed on this rank.
	CaptureErr error
}

var (
	_ dpattn.GatherRunner = (*GatherMoE)(nil)
	_ moe.GraphVoter      = (*GatherMoE)(nil)
)

// gatherBucket is the stage's buffers for B rows per rank.
type gatherBucket struct {
	B, T                           int // rows per rank, rows in all
	in, xf, xb, logits             Buffer
	ids, weights                   Buffer
	counts, offsets, sorted        Buffer
	blockExp, rowsOf               Buffer
	h, hb, out, partial, mine      Buffer
	inb, sw, sh, shb, so, y        Buffer
	idSorted, idExp                Buffer // the router's layout over T rows
	idSortedB, idExpB, identRows   Buffer // the shared expert's over B, and rows 0…B-1
	routerRows, sharedRows, blocks int
	graph                          Graph
	noGraph                        bool // on every rank: no graph for this bucket
	warm                           bool // run eagerly once
	bs                             buffers
}

// NewGatherMoE uploads shard (the router, a contiguous range of experts as
// ep.Contiguous places them, the shared expert) to dev as bf16; comm
// carries the hidden states between the ranks' devices.
func NewGatherMoE(dev Launcher, shard *moe.Layer, comm DeviceComm) (*GatherMoE, error) {
	m, err := NewMoE(dev, shard)
	if err != nil {
		return nil, err
	}
	return &GatherMoE{m: m, comm: comm, buckets: map[int]*gatherBucket{}}, nil
}

// GraphReplays is the number of steps replayed from a graph.
func (g *GatherMoE) GraphReplays() int { return g.Replays }

// EnableGraphs makes the stage capture each bucket on first use and replay
// it whenever AllowGraph said yes for the step.
func (g *GatherMoE) EnableGraphs() { g.graphs = true }

// AllowGraph is the coordinator's vote for the coming step (every rank in
// decode or idle).
func (g *GatherMoE) AllowGraph(ok bool) { g.allowed = ok }

// Close frees the buckets and the weights.
func (g *GatherMoE) Close() {
	for _, b := range g.buckets {
		if b.graph != nil {
			b.graph.Close()
		}
		b.bs.free()
	}
	g.buckets = nil
	g.m.Close()
}

// bucketOf is the bucket of a step: every rank's rows padded to the ranks'
// largest count, rounded up to a power of two.
func (g *GatherMoE) bucketOf(plan *dpattn.StepPlan) (*gatherBucket, error) {
	most := int64(1)
	for _, n := range plan.Counts {
		most = max(most, n)
	}
	return g.bucket(pow2(int(most)))
}

// output is the buffer holding a bucket's result: the scattered sum, plus
// the shared expert when the layer has one.
func (g *GatherMoE) output(b *gatherBucket) Buffer {
	if g.m.hasShared {
		return b.y
	}
	return b.mine
}

func (g *GatherMoE) bucket(B int) (*gatherBucket, error) {
	if b := g.buckets[B]; b != nil {
		return b, nil
	}
	c, d := g.m.cfg, g.m.dev
	H, E, K, I := c.Hidden, c.NumExperts, c.TopK, c.Inter
	T := g.comm.Size() * B
	b := &gatherBucket{B: B, T: T, bs: buffers{d: d}}
	alloc := b.bs.alloc
	lay, blocks, err := identityLayout(T)
	if err != nil {
		return nil, err
	}
	layB, blocksB, err := identityLayout(B)
	if err != nil {
		return nil, err
	}
	b.routerRows, b.sharedRows = len(lay.Pairs), len(layB.Pairs)
	n := T * K
	b.blocks = (n + g.m.local*(gemmBlock-1)) / gemmBlock // the shard's padded total never needs more
	rows := b.blocks * gemmBlock
	b.in, b.xf, b.xb = alloc(int64(B*H*4)), alloc(int64(T*H*4)), alloc(int64(T*H*2))
	b.logits = alloc(int64(b.routerRows * E * 4))
	b.ids, b.weights = alloc(int64(n*4)), alloc(int64(n*4))
	b.counts, b.offsets = alloc(int64(g.m.local*4)), alloc(int64((g.m.local+1)*4))
	b.sorted, b.blockExp, b.rowsOf = alloc(int64(rows*4)), alloc(int64(b.blocks*4)), alloc(int64(n*4))
	b.h, b.hb, b.out = alloc(int64(rows*I*4)), alloc(int64(rows*I*2)), alloc(int64(rows*H*4))
	b.partial, b.mine = alloc(int64(T*H*4)), alloc(int64(B*H*4))
	if g.m.hasShared {
		S := c.SharedInter
		b.inb = alloc(int64(B * H * 2))
		b.sh, b.shb, b.so = alloc(int64(b.sharedRows*S*4)), alloc(int64(b.sharedRows*S*2)), alloc(int64(b.sharedRows*H*4))
		b.y = alloc(int64(B * H * 4))
		if g.m.sharedGate != nil {
			b.sw = alloc(int64(B * 4))
		}
		ident := make([]int32, B)
		for i := range ident {
			ident[i] = int32(i)
		}
		b.identRows = b.bs.put(upload(d, ident))
		b.idSortedB, b.idExpB = b.bs.put(upload(d, layB.Pairs)), b.bs.put(upload(d, blocksB))
	}
	b.idSorted, b.idExp = b.bs.put(upload(d, lay.Pairs)), b.bs.put(upload(d, blocks))
	if b.bs.err == nil {
		// Rows past a step's own stay finite: zeros until written.
		b.bs.put(Buffer{}, copyIn(d, b.in, make([]float32, B*H)))
	}
	if b.bs.err != nil {
		b.bs.free()
		return nil, fmt.Errorf("cuda: gather step of %d rows per rank: %w", B, b.bs.err)
	}
	g.buckets[B] = b
	return b, nil
}

// enqueue launches the stage on b's buffers on l (the device or a recorder
// of it).
func (g *GatherMoE) enqueue(l Launcher, b *gatherBucket) error {
	m, c := g.m, g.m.cfg
	H, E, K, I, T, B := c.Hidden, c.NumExperts, c.TopK, c.Inter, b.T, b.B
	n, rows := T*K, b.blocks*gemmBlock
	steps := []func() error{
		func() error { return g.comm.AllGather(l, b.in, b.xf, int64(B*H*4)) },
		func() error { return l.F32ToBF16(b.xf, b.xb, T*H) },
		func() error {
			return l.GroupedGEMM(b.xb, m.router, b.idSorted, b.idExp, b.routerRows, 1, T, true, E, H, Buffer{}, b.logits)
		},
		func() error { return l.Gate(c.GateKernelArgs(), b.logits, m.bias, b.ids, b.weights, T) },
		func() error {
			return l.Align(b.ids, n, m.lo, m.local, gemmBlock, b.blocks, b.counts, b.offsets, b.sorted, b.blockExp, b.rowsOf)
		},
		func() error { return l.GroupedSwiGLU(b.xb, m.gate, m.up, b.sorted, b.blockExp, rows, K, n, I, H, b.h) },
		func() error { return l.F32ToBF16(b.h, b.hb, rows*I) },
		func() error {
			return l.GroupedGEMM(b.hb, m.down, b.sorted, b.blockExp, rows, K, n, false, H, I, b.weights, b.out)
		},
		// Every token's sum over this rank's experts (zero for none), in
		// ascending expert id; the scatter adds the ranks' sums.
		func() error { return l.Combine(b.out, b.rowsOf, T, K, H, Buffer{}, b.partial) },
		func() error { return g.comm.ReduceScatter(l, b.partial, b.mine, B*H) },
	}
	if m.hasShared {
		S := c.SharedInter
		steps = append(steps,
			func() error { return l.F32ToBF16(b.in, b.inb, B*H) },
			func() error {
				return l.GroupedSwiGLU(b.inb, m.sGate, m.sUp, b.idSortedB, b.idExpB, b.sharedRows, 1, B, S, H, b.sh)
			},
			func() error { return l.F32ToBF16(b.sh, b.shb, b.sharedRows*S) },
			func() error {
				return l.GroupedGEMM(b.shb, m.sDn, b.idSortedB, b.idExpB, b.sharedRows, 1, B, false, H, S, b.sw, b.so)
			},
			// y = the routed experts' sum + the shared expert, as on the CPU.
			func() error { return l.Combine(b.mine, b.identRows, B, 1, H, b.so, b.y) })
	}
	for _, f := range steps {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

// Forward runs the stage for this rank's rows x of plan into y. Every rank
// of the communicator calls it for the step (an IDLE rank with no rows).
// The stage's time goes to times.Experts: on the device the gather, the
// experts and the scatter are one stream of work.
func (g *GatherMoE) Forward(ctx context.Context, plan *dpattn.StepPlan, x, y []float32, times *dpattn.GatherTimes) error {
	t0 := time.Now()
	c := g.m.cfg
	H, R, r := c.Hidden, g.comm.Size(), g.comm.Rank()
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
	if err := copyIn(g.m.dev, b.in, xp); err != nil {
		return err
	}
	if g.m.sharedGate != nil {
		sw := make([]float32, B)
		logit := make([]float64, 1)
		for i := 0; i < mine; i++ {
			kernels.RouterLogits(logit, x[i*H:(i+1)*H], *g.m.sharedGate)
			sw[i] = float32(1 / (1 + math.Exp(-logit[0])))
		}
		if err := copyIn(g.m.dev, b.sw, sw); err != nil {
			return err
		}
	}
	if g.graphs && g.allowed && !b.noGraph && b.graph == nil && b.warm {
		// The same on every rank (the vote, the bucket's history), so
		// every rank agrees here.
		graph, cerr := g.m.dev.Capture(func(rec Launcher) error { return g.enqueue(rec, b) })
		if cerr != nil && g.CaptureErr == nil {
			g.CaptureErr = fmt.Errorf("cuda: gather step of %d rows per rank: %w", B, cerr)
		}
		ok, err := g.comm.Agree(ctx, cerr == nil)
		if err != nil || !ok {
			if graph != nil {
				graph.Close()
			}
			if err != nil {
				return err
			}
			b.noGraph = true // eagerly from now on, on every rank
		} else {
			b.graph = graph
		}
	}
	if g.graphs && g.allowed && b.graph != nil {
		g.Replays++
		err = b.graph.Replay()
	} else {
		g.Eager++
		b.warm = true
		err = g.enqueue(g.m.dev, b)
	}
	if err != nil {
		return err
	}
	if err := g.comm.Wait(ctx); err != nil {
		return err
	}
	if err := download(g.m.dev, g.output(b), y); err != nil {
		return err
	}
	if times != nil {
		times.Experts += time.Since(t0)
	}
	return nil
}
