//go:build cuda || cudaemu

package dpattngpu

import (
	"context"
	"fmt"
	"time"

	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/dpattn"
	"github.com/moex-project/moex/ep/epgpu"
	"github.com/moex-project/moex/moe"
)

// DecodeLayer is a whole decoder layer's decode step of one rank on its
// device, as SGLang's DP attention runs it: the MLA block over the rank's
// cache (Attention.Step's kernels), the residual, and gather mode's MoE
// stage (GatherMoE's: all-gather, router, the rank's experts, reduce-scatter,
// shared expert), with no host copy from the hidden states' upload to the
// output's download. With graphs it is captured as ONE graph per (query
// bucket, split bucket, gather bucket), collectives inside, and replayed
// whenever the coordinator's vote allows; an IDLE rank's graph holds the
// MoE stage alone. Every rank must make the same choice between graph and
// eager launches for a step (NCCL's rule for captured collectives), so with
// graphs on, the ranks agree on it each step (epgpu.DeviceComm.Agree: a host
// all-reduce of one integer): a step replays only where every rank holds
// its shape's graph.
//
// The MoE layer's qwen2_moe shared-expert gate runs on the host and is not
// supported here (DeepSeek's layers have none). One goroutine (the rank's)
// calls it.
type DecodeLayer struct {
	att   *Attention
	moe   *GatherMoE
	blk   *attn.MLABlock
	steps map[layerKey]*graphSlot
	// With graphs enabled, each step shape is captured after one eager run
	// of it and replayed when the vote allows.
	cuda.GraphMode
}

var (
	_ dpattn.LayerRunner = (*DecodeLayer)(nil)
	_ moe.GraphVoter     = (*DecodeLayer)(nil)
	_ moe.GraphCounter   = (*DecodeLayer)(nil)
)

// layerKey names a layer step's graph: the cache's device copy and its
// attention bucket (zero for an IDLE rank), and the gather bucket.
type layerKey struct {
	m      *mirror
	attn   stepKey
	gather int
}

// NewDecodeLayer makes the layer step of block blk (its attention on att,
// whose device it shares) and of shard (gather mode's MoE stage over comm).
func NewDecodeLayer(att *Attention, blk *attn.MLABlock, shard *moe.Layer, comm epgpu.DeviceComm) (*DecodeLayer, error) {
	if blk.Cfg.Hidden != shard.Config.Hidden {
		return nil, fmt.Errorf("cuda: decode layer: attention hidden %d, MoE hidden %d", blk.Cfg.Hidden, shard.Config.Hidden)
	}
	if _, err := att.blockOf(blk); err != nil { // every rank checks the block, IDLE or not
		return nil, err
	}
	g, err := NewGatherMoE(att.d, shard, comm)
	if err != nil {
		return nil, err
	}
	if g.m.HostSharedGate() {
		g.Close()
		return nil, fmt.Errorf("cuda: decode layer: %s's shared-expert gate runs on the host; run the stages apart", shard.Config.ModelType)
	}
	return &DecodeLayer{att: att, moe: g, blk: blk, steps: map[layerKey]*graphSlot{}}, nil
}

// Close frees the MoE stage's buffers and weights and the layer's graphs
// (the attention's buffers are the Attention's).
func (l *DecodeLayer) Close() error {
	for _, g := range l.steps {
		g.close()
	}
	l.steps = nil
	l.moe.Close()
	return nil
}

// Forward runs the layer's decode step for this rank's tokens of plan: x
// [tokens, hidden] the hidden states of one new token of each of seqs
// (none when IDLE), y the layer's output (attention, residual, MoE) for
// them. The whole step's time goes to times (dpattn's MoE column).
func (l *DecodeLayer) Forward(ctx context.Context, plan *dpattn.StepPlan, c *attn.Cache, seqs []int, x, y []float32,
	times *time.Duration) error {
	t0 := time.Now()
	H, R, rank := l.blk.Cfg.Hidden, l.moe.comm.Size(), l.moe.comm.Rank()
	if len(plan.Counts) != R {
		return fmt.Errorf("cuda: decode layer: the plan has %d ranks, the communicator %d", len(plan.Counts), R)
	}
	T := int(plan.Counts[rank])
	if len(seqs) != T || len(x) != T*H || len(y) != len(x) {
		return fmt.Errorf("cuda: decode layer: %d sequences, x has %d values and y %d; the plan says %d tokens of %d",
			len(seqs), len(x), len(y), T, H)
	}
	if err := moe.CheckFinite(x, H); err != nil {
		return err
	}
	b, err := l.moe.bucketOf(plan)
	if err != nil {
		return err
	}
	key := layerKey{gather: b.B}
	var run *stepRun
	if T > 0 {
		if run, err = l.att.prepareStep(ctx, l.blk, c, seqs, x); err != nil {
			return err
		}
		defer run.release()
		key.m, key.attn = run.m, stepKey{blk: l.blk, queries: run.s.Q, splits: run.s.S, splitRows: run.s.splitRows}
	}
	enqueue := func(d cuda.Launcher) error {
		if run != nil {
			if err := l.att.enqueueStep(d, run.b, run.s, run.m.buf, c); err != nil {
				return err
			}
			if err := d.CopyRows(cuda.CopyRowsArgs{Src: run.s.hidden, SrcStride: H, SrcCol: 0, SrcMap: cuda.Buffer{}, Dst: b.in, DstBF16: false, DstStride: H, DstCol: 0, DstMap: cuda.Buffer{}, Rows: run.s.Q, Width: H}); err != nil {
				return err
			}
		}
		return l.moe.enqueue(ctx, d, b)
	}
	for k, old := range l.steps { // graphs over a forgotten cache copy
		if k.m != nil && k.m.dead.Load() {
			old.close()
			delete(l.steps, k)
		}
	}
	g := l.steps[key]
	if g == nil {
		g = &graphSlot{}
		l.steps[key] = g
	}
	var graph cuda.Graph
	if l.Replaying() {
		// Captured here, host-side only, once the shape has run eagerly;
		// then every rank replays, or none does (a rank whose step shape is
		// new, or failed to capture, holds the others to eager launches).
		if g.graph == nil && g.warm && !g.noGraph {
			var cerr error
			g.graph, cerr = l.Capture(l.att.d, fmt.Sprintf("cuda: decode layer step %+v", key), enqueue)
			g.noGraph = cerr != nil
		}
		replay, err := l.moe.comm.Agree(ctx, g.graph != nil)
		if err != nil {
			return err
		}
		if replay {
			graph = g.graph
		}
	}
	if graph == nil {
		g.warm = true
	}
	if err := l.Run(ctx, l.att.d, graph, enqueue); err != nil {
		return err
	}
	if err := l.moe.comm.Wait(ctx); err != nil {
		return err
	}
	if err := cuda.Download(l.att.d, l.moe.output(b), y); err != nil {
		return err
	}
	if run != nil {
		if err := run.finish(l.att.d); err != nil {
			return err
		}
	}
	if times != nil {
		*times += time.Since(t0)
	}
	return nil
}
