package decoderun_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"path/filepath"

	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/dpattn"
	"github.com/moex-project/moex/ep"
	"github.com/moex-project/moex/internal/decoderun"
	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// runFixture is a small DeepSeek MoE layer and a random attention block
// of its hidden size.
func runFixture(t *testing.T) (*moe.Layer, *attn.MLABlock) {
	t.Helper()
	dir, spec := layerFixture(t)
	layer, err := moe.Load(dir, 0)
	require.NoError(t, err)
	t.Cleanup(func() { layer.Close() })
	blk, err := attn.NewRandomMLABlock(attn.MLAConfig{Hidden: spec.Hidden, Heads: 4, KVLoraRank: 64, NopeDim: 16,
		RopeDim: 16, VDim: 16, RopeTheta: 10000, RMSNormEps: 1e-6}, kernels.BF16, 3)
	require.NoError(t, err)
	return layer, blk
}

// TestRunParity: the multi-rank decode run equals one rank, bit for bit in
// all-to-all mode and to 1e-6 in gather mode, with idle ranks on the way.
func TestRunParity(t *testing.T) {
	layer, blk := runFixture(t)
	for _, mode := range []string{"alltoall", "gather"} {
		for _, R := range []int{1, 2, 3} {
			t.Run(fmt.Sprintf("%s/ranks=%d", mode, R), func(t *testing.T) {
				rep, err := decoderun.Run(context.Background(), decoderun.Config{Ranks: R, Steps: 5, MoEMode: mode, Seed: 9,
					MoE: layer, Attn: blk, CacheDType: kernels.F32})
				require.NoError(t, err)
				require.Positive(t, rep.Tokens)
				if mode == "alltoall" {
					require.True(t, rep.ParityExact, "relative error %g", rep.ParityRelErr)
				} else {
					require.LessOrEqual(t, rep.ParityRelErr, 1e-6)
				}
				if R > 1 {
					require.Positive(t, rep.IdleSteps, "the schedule has an idle rank")
				}
			})
		}
	}
	// Tensor-parallel attention: the same outputs within 1e-5, every
	// rank's cache holding every request (R times the blocks of one).
	for _, R := range []int{2, 4} {
		dp, err := decoderun.Run(context.Background(), decoderun.Config{Ranks: R, Steps: 5, MoEMode: "gather", Seed: 9,
			MoE: layer, Attn: blk, CacheDType: kernels.F32})
		require.NoError(t, err)
		tp, err := decoderun.Run(context.Background(), decoderun.Config{Ranks: R, Steps: 5, AttnMode: "tp", MoEMode: "gather", Seed: 9,
			MoE: layer, Attn: blk, CacheDType: kernels.F32})
		require.NoError(t, err)
		require.LessOrEqual(t, tp.ParityRelErr, 1e-5, "ranks=%d", R)
		require.Equal(t, dp.Tokens, tp.Tokens)
		var dpKV int64
		for _, rt := range dp.Ranks {
			dpKV += rt.KVBytes
		}
		for _, rt := range tp.Ranks {
			require.Equal(t, dpKV, rt.KVBytes, "a TP rank caches what the DP ranks cache together")
		}
	}
	_, err := decoderun.Run(context.Background(), decoderun.Config{Ranks: 2, Steps: 1, AttnMode: "tp", MoEMode: "alltoall", MoE: layer, Attn: blk})
	require.ErrorContains(t, err, "tensor-parallel attention runs the MoE layer in gather mode")
	_, err = decoderun.Run(context.Background(), decoderun.Config{Ranks: 2, Steps: 1, AttnMode: "sp", MoEMode: "gather", MoE: layer, Attn: blk})
	require.ErrorContains(t, err, `attention mode "sp"`)
	// A steady batch: every rank decodes Batch requests at every step.
	rep, err := decoderun.Run(context.Background(), decoderun.Config{Ranks: 2, Steps: 4, Batch: 3, Context: 10, MoEMode: "alltoall",
		Seed: 9, MoE: layer, Attn: blk, CacheDType: kernels.F32})
	require.NoError(t, err)
	require.Equal(t, 2*3*4, rep.Tokens)
	require.Zero(t, rep.IdleSteps)
	require.True(t, rep.ParityExact)
	_, err = decoderun.Run(context.Background(), decoderun.Config{Ranks: 2, Steps: 1, MoEMode: "broadcast", MoE: layer, Attn: blk})
	require.ErrorContains(t, err, `MoE mode "broadcast"`)
}

// countingGather is a GatherRunner that runs MoEGather on the CPU and
// counts its calls and the votes it is given.
type countingGather struct {
	comm         ep.Comm
	shard        *moe.Layer
	calls, votes *atomic.Int32
	released     *atomic.Int32 // Close calls, or nil
	shardExperts int
}

func (g countingGather) Forward(ctx context.Context, plan *dpattn.StepPlan, x, y []float32, times *dpattn.GatherTimes) error {
	g.calls.Add(1)
	return dpattn.MoEGather(ctx, g.comm, g.shard, plan, x, y, times)
}

func (g countingGather) AllowGraph(ok bool) { g.votes.Add(1) }

func (g countingGather) Close() error {
	if g.released != nil {
		g.released.Add(1)
	}
	return nil
}

// TestRunGatherRunner: in gather mode a Config.Gather runner takes the
// MoE stage of every rank at every step that is not skipped (IDLE ranks
// included), gets every step's vote, and is released; the other mode does
// not use it.
func TestRunGatherRunner(t *testing.T) {
	layer, blk := runFixture(t)
	const R, S = 3, 5
	for _, mode := range []string{"gather", "alltoall"} {
		var calls, votes, made, released, misnumbered atomic.Int32
		rep, err := decoderun.Run(context.Background(), decoderun.Config{Ranks: R, Steps: S, MoEMode: mode, Seed: 9,
			MoE: layer, Attn: blk, CacheDType: kernels.F32,
			Gather: func(_ context.Context, rank int, shard *moe.Layer, comm ep.Comm) (decoderun.GatherRunner, error) {
				made.Add(1)
				if rank != comm.Rank() {
					misnumbered.Add(1)
				}
				return countingGather{comm: comm, shard: shard, calls: &calls, votes: &votes, released: &released}, nil
			}})
		require.NoError(t, err)
		require.Zero(t, misnumbered.Load(), "the hook's rank is its communicator's")
		if mode == "alltoall" {
			require.Zero(t, made.Load())
			continue
		}
		require.LessOrEqual(t, rep.ParityRelErr, 1e-6)
		skipped := 0
		for _, s := range rep.Steps {
			if s.Skip {
				skipped++
			}
		}
		require.Equal(t, int32(R), made.Load())
		require.Equal(t, int32(R), released.Load())
		require.Equal(t, int32(R*(S-skipped)), calls.Load())
		require.Equal(t, int32(R*S), votes.Load())
	}
	_, err := decoderun.Run(context.Background(), decoderun.Config{Ranks: 2, Steps: 1, MoEMode: "gather", MoE: layer, Attn: blk,
		CacheDType: kernels.F32,
		Gather: func(context.Context, int, *moe.Layer, ep.Comm) (decoderun.GatherRunner, error) {
			return nil, errors.New("no device here")
		}})
	require.ErrorContains(t, err, "no device here")
}

// countingLayer is a LayerRunner on the CPU (the block, the residual,
// MoEGather) that counts its calls and votes.
type countingLayer struct {
	countingGather
	block attn.Block
}

func (l countingLayer) Forward(ctx context.Context, plan *dpattn.StepPlan, cache *attn.Cache, seqs []int, x, y []float32,
	times *time.Duration) error {
	l.calls.Add(1)
	h := make([]float32, len(x))
	if err := l.block.Forward(ctx, cache, seqs, x, h); err != nil {
		return err
	}
	for i := range h {
		h[i] += x[i]
	}
	return dpattn.MoEGather(ctx, l.comm, l.shard, plan, h, y, nil)
}

// GraphReplays: a count for the report to carry.
func (l countingLayer) GraphReplays() int { return 7 }

// TestRunLayerRunner: a Config.Layer runner takes every rank's whole
// layer step in gather mode (the stages' hooks unused), gets the votes,
// and matches one rank; a nil runner leaves the stages to run apart.
func TestRunLayerRunner(t *testing.T) {
	layer, blk := runFixture(t)
	const R, S = 3, 5
	var calls, votes, gathers atomic.Int32
	rep, err := decoderun.Run(context.Background(), decoderun.Config{Ranks: R, Steps: S, MoEMode: "gather", Seed: 9,
		MoE: layer, Attn: blk, CacheDType: kernels.F32,
		Layer: func(_ context.Context, _ int, a attn.Block, shard *moe.Layer, comm ep.Comm) (decoderun.LayerRunner, error) {
			return countingLayer{countingGather{comm: comm, shard: shard, calls: &calls, votes: &votes}, a}, nil
		},
		Gather: func(context.Context, int, *moe.Layer, ep.Comm) (decoderun.GatherRunner, error) {
			gathers.Add(1)
			return nil, errors.New("unused")
		}})
	require.NoError(t, err)
	require.LessOrEqual(t, rep.ParityRelErr, 1e-6)
	skipped := 0
	for _, s := range rep.Steps {
		if s.Skip {
			skipped++
		}
	}
	require.Equal(t, int32(R*(S-skipped)), calls.Load())
	require.Equal(t, int32(R*S), votes.Load())
	require.Zero(t, gathers.Load())
	for _, r := range rep.Ranks {
		require.Zero(t, r.Attention, "the layer's time is the MoE stage's")
		require.Equal(t, 7, r.Replays, "the runner's replay count reaches the report")
	}

	var gatherCalls, gatherVotes atomic.Int32
	rep, err = decoderun.Run(context.Background(), decoderun.Config{Ranks: R, Steps: S, MoEMode: "gather", Seed: 9,
		MoE: layer, Attn: blk, CacheDType: kernels.F32,
		Layer: func(context.Context, int, attn.Block, *moe.Layer, ep.Comm) (decoderun.LayerRunner, error) {
			return nil, nil
		},
		Gather: func(_ context.Context, _ int, shard *moe.Layer, comm ep.Comm) (decoderun.GatherRunner, error) {
			return countingGather{comm: comm, shard: shard, calls: &gatherCalls, votes: &gatherVotes}, nil
		}})
	require.NoError(t, err)
	require.LessOrEqual(t, rep.ParityRelErr, 1e-6)
	require.Equal(t, int32(R*(S-skipped)), gatherCalls.Load(), "no layer runner: the gather runner runs")
}

// TestRunComm: each rank calling RunComm on its own communicator gives
// rank 0 the report of Run: the same tokens, plan and parity.
func TestRunComm(t *testing.T) {
	layer, blk := runFixture(t)
	for _, mode := range []string{"alltoall", "gather"} {
		cfg := decoderun.Config{Ranks: 3, Steps: 4, MoEMode: mode, Seed: 5, MoE: layer, Attn: blk, CacheDType: kernels.F32}
		want, err := decoderun.Run(context.Background(), cfg)
		require.NoError(t, err)
		reps := make([]*decoderun.Report, 3)
		errs, err := ep.RunLocal(3, func(c ep.Comm) error {
			var err error
			reps[c.Rank()], err = decoderun.RunComm(context.Background(), cfg, c)
			return err
		})
		require.NoError(t, err)
		for r, err := range errs {
			require.NoError(t, err, "rank %d", r)
		}
		require.Nil(t, reps[1])
		require.Nil(t, reps[2])
		got := reps[0]
		require.NotNil(t, got)
		require.Equal(t, want.Tokens, got.Tokens)
		require.Equal(t, want.Steps, got.Steps)
		require.Equal(t, want.IdleSteps, got.IdleSteps)
		require.Equal(t, want.ParityExact, got.ParityExact, mode)
		require.InDelta(t, want.ParityRelErr, got.ParityRelErr, 1e-12, mode)
		for r := range got.Ranks {
			require.Equal(t, want.Ranks[r].Tokens, got.Ranks[r].Tokens)
		}
	}
}

// TestRunComms: the plan on one group and the data on another give the
// same report as one group for both.
func TestRunComms(t *testing.T) {
	layer, blk := runFixture(t)
	cfg := decoderun.Config{Ranks: 3, Steps: 3, MoEMode: "alltoall", Seed: 6, MoE: layer, Attn: blk, CacheDType: kernels.F32}
	want, err := decoderun.Run(context.Background(), cfg)
	require.NoError(t, err)
	plans, err := ep.NewLocal(3)
	require.NoError(t, err)
	var got *decoderun.Report
	errs, err := ep.RunLocal(3, func(c ep.Comm) error {
		rep, err := decoderun.RunComms(context.Background(), cfg, c, plans[c.Rank()])
		if c.Rank() == 0 {
			got = rep
		}
		return err
	})
	require.NoError(t, err)
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.True(t, got.ParityExact)
	require.Equal(t, want.Steps, got.Steps)
	require.Equal(t, want.Tokens, got.Tokens)

	_, err = decoderun.RunComms(context.Background(), cfg, plans[0], plans[1])
	require.ErrorContains(t, err, "rank 1 of 3 in the plan group, 0 of 3 in the data group")
}

// TestRunWithCheckpointAttention: the decode run over a checkpoint's MLA
// block and MoE layer keeps its parity with one rank, bf16 and FP8 (as
// DeepSeek-V3 ships: attention and experts FP8).
func TestRunWithCheckpointAttention(t *testing.T) {
	for _, dt := range []string{"BF16", "F8_E4M3"} {
		t.Run(dt, func(t *testing.T) { runWithCheckpointAttention(t, dt) })
	}
}

func runWithCheckpointAttention(t *testing.T, dtype string) {
	dir, _ := attnCheckpoint(t, moetest.AttnSpec{Hidden: 48, Heads: 4, KVLoraRank: 32, Nope: 16, Rope: 8, VDim: 16,
		Theta: 10000, Yarn: true, DType: dtype, FP8Block: [2]int{16, 16}, Seed: 5})
	b, err := attn.LoadMLABlock(dir, 0)
	require.NoError(t, err)
	defer b.Close()
	layer, err := moe.Load(dir, 0)
	require.NoError(t, err)
	defer layer.Close()
	if dtype == "F8_E4M3" {
		require.Equal(t, kernels.F8E4M3, layer.WeightDType())
	}
	for _, mode := range []string{"alltoall", "gather"} {
		rep, err := decoderun.Run(context.Background(), decoderun.Config{Ranks: 3, Steps: 4, MoEMode: mode, Seed: 2,
			MoE: layer, Attn: b, CacheDType: kernels.BF16})
		require.NoError(t, err)
		if mode == "alltoall" {
			require.True(t, rep.ParityExact)
		} else {
			require.LessOrEqual(t, rep.ParityRelErr, 1e-6)
		}
	}
}

// layerFixture writes moetest.LayerFixture's checkpoint.
func layerFixture(t *testing.T) (string, moetest.Spec) {
	t.Helper()
	m, err := moetest.Generate(moetest.LayerFixture)
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), "ckpt")
	require.NoError(t, m.WriteTo(dir))
	return dir, moetest.LayerFixture
}

// attnCheckpoint writes a deepseek_v2 checkpoint with MoE and attention
// tensors for layer 0.
func attnCheckpoint(t *testing.T, a moetest.AttnSpec) (string, *moetest.AttnModel) {
	t.Helper()
	dir := t.TempDir()
	am, err := moetest.WriteAttnCheckpoint(dir, a)
	require.NoError(t, err)
	return dir, am
}

// TestRunHashLayer: a layer that routes by token id (deepseek_v4's hash
// layers) runs in both modes with each request's token ids, which the
// one-rank reference sees too: parity as for any layer.
func TestRunHashLayer(t *testing.T) {
	spec := moetest.Spec{ModelType: "deepseek_v4", Hidden: 32, Experts: 8, TopK: 2, Inter: 16, SharedExperts: 1, NumLayers: 3,
		Layer: 1, HashLayers: 2, Vocab: 50, DType: "BF16", Seed: 81}
	m, err := moetest.Generate(spec)
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), "ckpt")
	require.NoError(t, m.WriteTo(dir))
	layer, err := moe.Load(dir, spec.Layer)
	require.NoError(t, err)
	t.Cleanup(func() { layer.Close() })
	require.True(t, layer.TokenRouted())
	blk, err := attn.NewRandomMLABlock(attn.MLAConfig{Hidden: spec.Hidden, Heads: 4, KVLoraRank: 64, NopeDim: 16,
		RopeDim: 16, VDim: 16, RopeTheta: 10000, RMSNormEps: 1e-6}, kernels.BF16, 3)
	require.NoError(t, err)
	for _, mode := range []string{"alltoall", "gather"} {
		for _, R := range []int{1, 3} {
			t.Run(fmt.Sprintf("%s/ranks=%d", mode, R), func(t *testing.T) {
				rep, err := decoderun.Run(context.Background(), decoderun.Config{Ranks: R, Steps: 4, MoEMode: mode, Seed: 5,
					MoE: layer, Attn: blk, CacheDType: kernels.F32})
				require.NoError(t, err)
				require.Positive(t, rep.Tokens)
				if mode == "alltoall" {
					require.True(t, rep.ParityExact, "relative error %g", rep.ParityRelErr)
				} else {
					require.LessOrEqual(t, rep.ParityRelErr, 1e-6)
				}
			})
		}
	}
}
