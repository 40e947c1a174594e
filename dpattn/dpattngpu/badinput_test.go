//go:build cudaemu && !cuda

package dpattngpu_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/dpattn"
	"github.com/moex-project/moex/dpattn/dpattngpu"
	"github.com/moex-project/moex/ep"
	"github.com/moex-project/moex/ep/epgpu"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// TestDeviceStepBadInput: the device steps and collectives name what is
// wrong with their input, before any kernel runs.
func TestDeviceStepBadInput(t *testing.T) {
	ctx := context.Background()
	dev := cuda.NewEmu()
	comms, err := ep.NewLocal(1)
	require.NoError(t, err)
	comm := epgpu.NewEmuComm(dev, comms[0])
	small, err := dev.Alloc(8)
	require.NoError(t, err)
	big, err := dev.Alloc(64)
	require.NoError(t, err)
	require.EqualError(t, comm.AllGather(ctx, dev, small, big, 16),
		"cuda: all-gather of 16 bytes from each of 1 ranks: send holds 8 bytes, recv 64")
	require.EqualError(t, comm.ReduceScatter(ctx, dev, big, small, 4),
		"cuda: reduce-scatter of 4 float32 to each of 1 ranks: send holds 64 bytes, recv 8")
	staged := epgpu.NewStagedComm(dev, comms[0])
	require.ErrorContains(t, staged.AllGather(ctx, dev, small, big, -1), "all-gather of -1 bytes")

	cfg := attn.MLAConfig{Hidden: 32, Heads: 2, KVLoraRank: 32, NopeDim: 16, RopeDim: 16, VDim: 16, RopeTheta: 10000,
		RMSNormEps: 1e-6}
	blk, err := attn.NewRandomMLABlock(cfg, kernels.BF16, 1)
	require.NoError(t, err)
	cache, err := attn.NewCache(2, 16, 48, kernels.BF16)
	require.NoError(t, err)
	att := dpattngpu.NewAttention(dev)
	defer att.Close()
	require.EqualError(t, att.Step(ctx, blk, cache, []int{0}, make([]float32, 31), make([]float32, 31)),
		"cuda: mla step: x has 31 values, want 1 tokens × 32")
	require.EqualError(t, att.Step(ctx, blk, cache, []int{0}, make([]float32, 32), make([]float32, 16)),
		"cuda: mla step: out has 16 values, x 32")
	wrong, err := attn.NewCache(2, 16, 40, kernels.BF16)
	require.NoError(t, err)
	require.EqualError(t, att.Step(ctx, blk, wrong, []int{0}, make([]float32, 32), make([]float32, 32)),
		"cuda: mla step: cache rows have 40 values, want kv_lora_rank + rope = 48")
	f16, err := attn.NewCache(2, 16, 48, kernels.F16) // the CPU's alone
	require.NoError(t, err)
	require.EqualError(t, att.Step(ctx, blk, f16, []int{0}, make([]float32, 32), make([]float32, 32)),
		"cuda: attention: the cache is F16: the device kernels read F32 or BF16 caches")
	odd := cfg
	odd.NopeDim = 8
	oddBlk, err := attn.NewRandomMLABlock(odd, kernels.BF16, 1)
	require.NoError(t, err)
	oddCache, err := attn.NewCache(2, 16, 48, kernels.BF16)
	require.NoError(t, err)
	require.EqualError(t, att.Step(ctx, oddBlk, oddCache, []int{0}, make([]float32, 32), make([]float32, 32)),
		"cuda: mla step: qk_nope_head_dim 8 is not a multiple of 16 (the device GEMM's k)")
	require.Zero(t, oddCache.Len(0), "nothing reserved")
	_, err = cache.Reserve(0, -1)
	require.EqualError(t, err, "attn: reserving -1 rows")

	l, err := moe.NewRandom(&moe.Config{ModelType: "mixtral", Hidden: 64, NumExperts: 2, TopK: 1, Inter: 16,
		Scoring: moe.Softmax, Method: moe.Greedy, NormTopK: true, RoutedScaling: 1}, kernels.BF16, 1)
	require.NoError(t, err)
	_, err = dpattngpu.NewDecodeLayer(att, blk, l, comm)
	require.EqualError(t, err, "cuda: decode layer: attention hidden 32, MoE hidden 64")
	l32, err := moe.NewRandom(&moe.Config{ModelType: "mixtral", Hidden: 32, NumExperts: 2, TopK: 1, Inter: 16,
		Scoring: moe.Softmax, Method: moe.Greedy, NormTopK: true, RoutedScaling: 1}, kernels.BF16, 1)
	require.NoError(t, err)
	layer, err := dpattngpu.NewDecodeLayer(att, blk, l32, comm)
	require.NoError(t, err)
	defer layer.Close()
	plan := &dpattn.StepPlan{Counts: []int64{2}, Total: 2, Tokens: 2}
	require.EqualError(t, layer.Forward(ctx, plan, cache, []int{0}, make([]float32, 32), make([]float32, 32), nil),
		"cuda: decode layer: 1 sequences, x has 32 values and y 32; the plan says 2 tokens of 32")
	require.EqualError(t, layer.Forward(ctx, &dpattn.StepPlan{Counts: []int64{1, 1}}, cache, []int{0}, make([]float32, 32),
		make([]float32, 32), nil), "cuda: decode layer: the plan has 2 ranks, the communicator 1")
}
