//go:build cuda

package dpattngpu_test

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/bindings/nccl"
	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/cuda/cudatest"
	"github.com/moex-project/moex/dpattn"
	"github.com/moex-project/moex/dpattn/dpattngpu"
	"github.com/moex-project/moex/ep"
	"github.com/moex-project/moex/ep/epgpu"
	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

func TestMLADecodeKernel(t *testing.T) {
	d := cudatest.Open(t)
	in, want, _ := mlaCase(t, 3, []int32{1, 64, 65, 3000}, 16, 576, 512, 64, 512, 0.07, kernels.BF16)
	got, _, err := dpattngpu.MLADecode(d, in)
	require.NoError(t, err)
	for i := range want {
		require.InDelta(t, want[i], got[i], 1e-4*(1+math.Abs(float64(want[i]))))
	}
}

// TestGQABlockOnGPU: a gpt-oss-shaped grouped-query block (64 heads over
// 8 of width 64, biases, sinks, a window of 128) with its attention on the
// GPU against the host block: a 300-token prefill, then decode steps.
func TestGQABlockOnGPU(t *testing.T) {
	d := cudatest.Open(t)
	r, _, err := kernels.NewRoPE(64, 150000, kernels.RoPEScaling{}, kernels.RoPEHalves)
	require.NoError(t, err)
	cfg := attn.GQAConfig{Hidden: 2880, Heads: 64, KVHeads: 8, HeadDim: 64, Bias: true, OutBias: true, Sinks: true, Window: 128,
		NormEps: 1e-5, RoPE: r, Scale: 0.125}
	blk, err := attn.NewRandomGQABlock(cfg, kernels.BF16, 7)
	require.NoError(t, err)
	host, err := attn.NewCache(16, 64, blk.RowDim(), kernels.BF16)
	require.NoError(t, err)
	dev, err := attn.NewCache(16, 64, blk.RowDim(), kernels.BF16)
	require.NoError(t, err)
	att := dpattngpu.NewAttention(d)
	defer att.Close()
	be := attn.Backend{Core: att}
	for step, n := range []int{300, 1, 1, 1} {
		seqs := make([]int, n)
		x := moetest.Input(uint64(step), n, cfg.Hidden, false)
		want, got := make([]float32, len(x)), make([]float32, len(x))
		require.NoError(t, blk.Forward(context.Background(), host, seqs, x, want))
		require.NoError(t, blk.ForwardWith(context.Background(), be, dev, seqs, x, got))
		require.Less(t, moetest.RelErr(got, widen64(want)), 1e-3, "step %d", step)
	}
}

// widen64 is v in float64.
func widen64(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// TestMLABlockOnGPU: a DeepSeek-V2-Lite-shaped MLA block with its
// projections and attention on the GPU against the host block (within the
// bf16 tolerance), and the attention's graph replays against eager
// launches (the same bits).
func TestMLABlockOnGPU(t *testing.T) {
	d := cudatest.Open(t)
	cfg := attn.DeepSeekV2LiteAttention()
	blk, err := attn.NewRandomMLABlock(cfg, kernels.BF16, 6)
	require.NoError(t, err)
	latent := blk.RowDim()
	var caches [3]*attn.Cache // host, device eager, device graphs
	for i := range caches {
		caches[i], err = attn.NewCache(64, 64, latent, kernels.BF16)
		require.NoError(t, err)
	}
	var graphCore *dpattngpu.Attention
	var backends [3]attn.Backend // the host, then the device without and with graphs
	for i, graphs := range []bool{false, true} {
		att := dpattngpu.NewAttention(d)
		defer att.Close()
		if graphs {
			att.EnableGraphs()
			att.AllowGraph(true)
			graphCore = att
		}
		backends[i+1] = attn.Backend{Core: att, Proj: att.Projections()}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for s, n := range []int{100, 700, 33, 1} {
		rows := make([]float32, n*latent)
		for i := range rows {
			rows[i] = float32(rng.NormFloat64())
		}
		for _, c := range caches {
			require.NoError(t, c.Append(s, rows))
		}
	}
	for step := 0; step < 4; step++ {
		seqs := []int{0, 1, 2, 3}[:1+step%4]
		x := moetest.Input(uint64(step), len(seqs), cfg.Hidden, false)
		var outs [3][]float32
		for i, c := range caches {
			outs[i] = make([]float32, len(x))
			start := time.Now()
			require.NoError(t, blk.ForwardWith(context.Background(), backends[i], c, seqs, x, outs[i]))
			t.Logf("step %d, %d sequences, path %d: %v", step, len(seqs), i, time.Since(start))
		}
		ref := make([]float64, len(x))
		for i, v := range outs[0] {
			ref[i] = float64(v)
		}
		e := moetest.RelErr(outs[1], ref)
		t.Logf("step %d: relative error %.2e", step, e)
		require.LessOrEqual(t, e, 1e-2)
		require.Equal(t, outs[1], outs[2], "step %d: replays give the eager bits", step)
	}
	require.Equal(t, 4, graphCore.GraphReplays(), "every step replayed")
}

// TestGatherMoEOnGPU: gather mode's MoE stage of a DeepSeek-V2-Lite-shaped
// layer on the GPU. Two in-process ranks sharing it stage their
// collectives through the host (eagerly); one NCCL rank (world size 1)
// runs NCCL on the device buffers inside the captured graph. Both against
// the CPU layer within the bf16 tolerance, replays against eager launches
// bit for bit; eager and replay times logged.
func TestGatherMoEOnGPU(t *testing.T) {
	d := cudatest.Open(t)
	l, err := moe.NewRandom(moe.DeepSeekV2Lite(), kernels.BF16, 10)
	require.NoError(t, err)
	H := l.Config.Hidden
	const T = 24
	x := moetest.Input(10, T, H, false)
	for i, v := range x {
		x[i] = half.BF16ToF32(half.F32ToBF16(v))
	}
	want := make([]float32, len(x))
	require.NoError(t, l.Forward(context.Background(), x, want))
	ref := make([]float64, len(want))
	for i, v := range want {
		ref[i] = float64(v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	place, err := ep.Contiguous(l.Config.NumExperts, 2)
	require.NoError(t, err)
	counts := []int64{T - 9, 9}
	outs := make([][]float32, 2)
	errs, err := ep.RunLocal(2, func(c ep.Comm) error {
		r := c.Rank()
		mine := map[int]bool{}
		for _, e := range place.Local(r) {
			mine[e] = true
		}
		g, err := dpattngpu.NewGatherMoE(d, l.Subset(func(e int) bool { return mine[e] }), epgpu.NewStagedComm(d, c))
		if err != nil {
			return err
		}
		defer g.Close()
		off := int(counts[0]) * r
		n := int(counts[r])
		outs[r] = make([]float32, n*H)
		return g.Forward(ctx, &dpattn.StepPlan{Counts: counts, Offset: off, Tokens: n}, x[off*H:(off+n)*H], outs[r], nil)
	})
	require.NoError(t, err)
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	e := moetest.RelErr(append(outs[0], outs[1]...), ref)
	t.Logf("two ranks staged through the host: relative error %.2e", e)
	require.LessOrEqual(t, e, 1e-2)

	g, err := dpattngpu.NewGatherMoE(d, l, ncclRank(t, ctx, d))
	require.NoError(t, err)
	defer g.Close()
	plan := &dpattn.StepPlan{Counts: []int64{T}, Tokens: T}
	run := func(label string) []float32 {
		y := make([]float32, len(x))
		start := time.Now()
		const reps = 20
		for i := 0; i < reps; i++ {
			require.NoError(t, g.Forward(ctx, plan, x, y, nil))
		}
		t.Logf("NCCL, %s: %v per step (copies included)", label, time.Since(start)/reps)
		return y
	}
	eager := run("eager")
	e = moetest.RelErr(eager, ref)
	t.Logf("one NCCL rank: relative error %.2e", e)
	require.LessOrEqual(t, e, 1e-2)
	g.EnableGraphs()
	g.AllowGraph(true)
	require.Equal(t, eager, run("graph (NCCL captured in it)"))
	require.NoError(t, g.CaptureErr())
	require.Equal(t, 20, g.GraphReplays(), "the bucket ran eagerly before: captured on the first allowed step")
}

// TestDecodeLayerOnGPU: the whole layer's decode step of DeepSeek-V2-Lite
// shapes (MLA block, residual, gather mode's MoE stage) on one NCCL rank
// (world size 1) against the host block and the CPU MoE layer, within the
// bf16 tolerance; the graph's replays (NCCL inside) against eager launches
// bit for bit; per-step times logged for both.
func TestDecodeLayerOnGPU(t *testing.T) {
	d := cudatest.Open(t)
	blk, err := attn.NewRandomMLABlock(attn.DeepSeekV2LiteAttention(), kernels.BF16, 11)
	require.NoError(t, err)
	l, err := moe.NewRandom(moe.DeepSeekV2Lite(), kernels.BF16, 11)
	require.NoError(t, err)
	H, D := l.Config.Hidden, blk.RowDim()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	comm := ncclRank(t, ctx, d)
	const B = 16
	newCache := func() *attn.Cache {
		c, err := attn.NewCache(B*20, 64, D, kernels.BF16)
		require.NoError(t, err)
		rng := rand.New(rand.NewPCG(5, 5))
		for s := 0; s < B; s++ {
			rows := make([]float32, (200+57*s)*D)
			for i := range rows {
				rows[i] = float32(rng.NormFloat64())
			}
			require.NoError(t, c.Append(s, rows))
		}
		return c
	}
	seqs := make([]int, B)
	for i := range seqs {
		seqs[i] = i
	}
	plan := &dpattn.StepPlan{Counts: []int64{B}, Total: B, Tokens: B}
	const steps = 12
	run := func(graphs bool) ([][]float32, *dpattngpu.DecodeLayer) {
		att := dpattngpu.NewAttention(d)
		t.Cleanup(func() { att.Close() })
		layer, err := dpattngpu.NewDecodeLayer(att, blk, l, comm)
		require.NoError(t, err)
		t.Cleanup(func() { layer.Close() })
		if graphs {
			layer.EnableGraphs()
			layer.AllowGraph(true)
		}
		c := newCache()
		var outs [][]float32
		start := time.Now()
		for st := 0; st < steps; st++ {
			x := moetest.Input(uint64(st), B, H, false)
			y := make([]float32, len(x))
			require.NoError(t, layer.Forward(ctx, plan, c, seqs, x, y, nil))
			outs = append(outs, y)
		}
		t.Logf("graphs %v: %v per step of %d tokens (copies included; %d replays, %d eager)", graphs,
			time.Since(start)/steps, B, layer.GraphReplays(), layer.EagerRuns())
		return outs, layer
	}
	eager, _ := run(false)
	replayed, layer := run(true)
	require.NoError(t, layer.CaptureErr())
	require.Equal(t, eager, replayed, "a replay gives the eager bits")
	require.Positive(t, layer.GraphReplays())

	// The host: the block (CPU projections), the residual, the whole MoE
	// layer (one rank: gather mode's stage is the layer).
	c := newCache()
	for st := 0; st < 3; st++ {
		x := moetest.Input(uint64(st), B, H, false)
		h := make([]float32, len(x))
		require.NoError(t, blk.Forward(ctx, c, seqs, x, h))
		for i := range h {
			h[i] += x[i]
		}
		want := make([]float32, len(x))
		require.NoError(t, l.Forward(ctx, h, want))
		ref := make([]float64, len(want))
		for i, v := range want {
			ref[i] = float64(v)
		}
		e := moetest.RelErr(eager[st], ref)
		t.Logf("step %d: relative error %.2e against the host", st, e)
		require.LessOrEqual(t, e, 1e-2)
	}
}

// ncclRank is a one-rank NCCL communicator on d as a DeviceComm (the test
// is skipped without libnccl), destroyed when the test ends.
func ncclRank(t *testing.T, ctx context.Context, d *cuda.Device) epgpu.DeviceComm {
	t.Helper()
	if err := nccl.Load(""); err != nil {
		t.Skipf("no NCCL for the device collectives: %v", err)
	}
	id, err := nccl.GetUniqueID()
	require.NoError(t, err)
	comm, err := nccl.InitRankContext(ctx, id, 1, 0, d.Bind)
	require.NoError(t, err)
	t.Cleanup(func() { comm.Close() })
	host, err := ep.NewLocal(1)
	require.NoError(t, err)
	return epgpu.NewNCCLComm(d, comm, host[0])
}
