//go:build cudaemu && !cuda

package dpattngpu_test

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/dpattn"
	"github.com/moex-project/moex/dpattn/dpattngpu"
	"github.com/moex-project/moex/ep"
	"github.com/moex-project/moex/ep/epgpu"
	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// TestDecodeLayerOnEmulation: the whole layer's decode step (MLA block,
// residual, gather mode's MoE stage) on the devices of two ranks against
// the same steps on the CPU (the host block, then MoEGather), with an IDLE
// rank on the way; with graphs, each step shape runs eagerly once, then the
// steps where every rank holds its shape's graph replay it, with the eager
// bits.
func TestDecodeLayerOnEmulation(t *testing.T) {
	spec := moetest.Spec{ModelType: "deepseek_v2", Hidden: 64, Experts: 4, TopK: 2, Inter: 32, SharedExperts: 1, Method: "greedy",
		Scoring: "softmax", Scaling: 1, DType: "BF16", Seed: 31}
	m, err := moetest.Generate(spec)
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), "ckpt")
	require.NoError(t, m.WriteTo(dir))
	l, err := moe.Load(dir, 0)
	require.NoError(t, err)
	defer l.Close()
	r := 32
	acfg := attn.MLAConfig{Hidden: 64, Heads: 2, KVLoraRank: 48, NopeDim: 16, RopeDim: 16, VDim: 32, RopeTheta: 10000,
		RMSNormEps: 1e-6, QLoraRank: &r}
	blk, err := attn.NewRandomMLABlock(acfg, kernels.BF16, 7)
	require.NoError(t, err)
	const R, H = 2, 64
	D := acfg.KVLoraRank + acfg.RopeDim
	place, err := ep.Contiguous(spec.Experts, R)
	require.NoError(t, err)
	// Steps 1, 3 and 4 repeat an earlier step's shapes on every rank.
	steps := [][]int64{{2, 1}, {2, 1}, {0, 2}, {0, 2}, {2, 1}}
	newCache := func(rank int) *attn.Cache {
		c, err := attn.NewCache(16, 16, D, kernels.BF16)
		require.NoError(t, err)
		rng := rand.New(rand.NewPCG(uint64(rank), 9))
		for seq, n := range []int{5 + rank, 20} {
			rows := make([]float32, n*D)
			for i := range rows {
				rows[i] = float32(rng.NormFloat64())
			}
			require.NoError(t, c.Append(seq, rows))
		}
		return c
	}
	input := func(rank, st int) ([]int, []float32) {
		n := int(steps[st][rank])
		seqs := make([]int, n)
		for i := range seqs {
			seqs[i] = i
		}
		return seqs, moetest.Input(uint64(100*st+rank), n, H, false)
	}
	plan := func(rank, st int) *dpattn.StepPlan {
		p := &dpattn.StepPlan{Counts: steps[st], Tokens: int(steps[st][rank])}
		for q, n := range steps[st] {
			p.Total += int(n)
			if q < rank {
				p.Offset += int(n)
			}
		}
		return p
	}
	shardOf := func(rank int) *moe.Layer {
		mine := map[int]bool{}
		for _, e := range place.Local(rank) {
			mine[e] = true
		}
		return l.Subset(func(e int) bool { return mine[e] })
	}
	// each runs f on every rank and gives every step's outputs in rank order.
	each := func(f func(c ep.Comm, outs *[][]float32) error) [][]float32 {
		outs := make([][][]float32, R)
		errs, err := ep.RunLocal(R, func(c ep.Comm) error { return f(c, &outs[c.Rank()]) })
		require.NoError(t, err)
		for _, e := range errs {
			require.NoError(t, e)
		}
		all := make([][]float32, len(steps))
		for st := range steps {
			for rank := 0; rank < R; rank++ {
				all[st] = append(all[st], outs[rank][st]...)
			}
		}
		return all
	}
	want := each(func(c ep.Comm, outs *[][]float32) error {
		cache, shard := newCache(c.Rank()), shardOf(c.Rank())
		for st := range steps {
			seqs, x := input(c.Rank(), st)
			h := make([]float32, len(x))
			if err := blk.Forward(context.Background(), cache, seqs, x, h); err != nil {
				return err
			}
			for i := range h {
				h[i] += x[i]
			}
			y := make([]float32, len(x))
			if err := dpattn.MoEGather(context.Background(), c, shard, plan(c.Rank(), st), h, y, nil); err != nil {
				return err
			}
			*outs = append(*outs, y)
		}
		return nil
	})
	dev := cuda.NewEmu()
	run := func(graphs bool) ([][]float32, [R]int) {
		att := dpattngpu.NewAttention(dev)
		defer att.Close()
		att.SplitRows = 16 // the 20-row sequences take two splits
		var replays [R]int
		got := each(func(c ep.Comm, outs *[][]float32) error {
			cache := newCache(c.Rank())
			layer, err := dpattngpu.NewDecodeLayer(att, blk, shardOf(c.Rank()), epgpu.NewEmuComm(dev, c))
			if err != nil {
				return err
			}
			defer layer.Close()
			if graphs {
				layer.EnableGraphs()
				layer.AllowGraph(true)
			}
			for st := range steps {
				seqs, x := input(c.Rank(), st)
				y := make([]float32, len(x))
				if err := layer.Forward(context.Background(), plan(c.Rank(), st), cache, seqs, x, y, nil); err != nil {
					return err
				}
				*outs = append(*outs, y)
			}
			replays[c.Rank()] = layer.GraphReplays()
			return layer.CaptureErr()
		})
		return got, replays
	}
	eager, replays := run(false)
	require.Equal(t, [R]int{}, replays)
	for st := range steps {
		ref := make([]float64, len(want[st]))
		for i, v := range want[st] {
			ref[i] = float64(v)
		}
		e := moetest.RelErr(eager[st], ref)
		t.Logf("step %d, counts %v: relative error %.2e against the CPU", st, steps[st], e)
		require.LessOrEqual(t, e, 1e-2)
	}
	graphed, replays := run(true)
	require.Equal(t, [R]int{3, 3}, replays, "steps 1, 3 and 4 replay on every rank")
	require.Equal(t, eager, graphed, "a replay gives the eager bits")
}
