//go:build cudaemu && !cuda

package moegpu_test

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/ep"
	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/kernels/kerneltest"
	"github.com/moex-project/moex/moe"
	"github.com/moex-project/moex/moe/moegpu"
)

// TestMoEOnEmulation: the launch code of the GPU MoE layer, run on the CPU
// emulation of the kernels, against the CPU layer (same bf16-rounded input;
// the device also rounds the intermediate activations to bf16).
func TestMoEOnEmulation(t *testing.T) {
	specs := []moetest.Spec{
		{ModelType: "deepseek_v2", Hidden: 64, Experts: 8, TopK: 3, Inter: 32, SharedExperts: 1, Method: "group_limited_greedy",
			Scoring: "softmax", NGroup: 4, TopKGroup: 2, Scaling: 16, DType: "BF16", Seed: 1},
		{ModelType: "deepseek_v3", Hidden: 48, Experts: 16, TopK: 4, Inter: 16, SharedExperts: 2, Method: "noaux_tc",
			Scoring: "sigmoid", NGroup: 4, TopKGroup: 2, NormTopK: true, Scaling: 2.5, DType: "BF16", Seed: 2},
		{ModelType: "qwen2_moe", Hidden: 32, Experts: 6, TopK: 2, Inter: 16, SharedInter: 32, NormTopK: true, DType: "F32", Seed: 3},
		{ModelType: "mixtral", Hidden: 32, Experts: 4, TopK: 2, Inter: 48, DType: "F32", Seed: 4},
		// FP8 experts stay FP8 on the device, dequantized tile by tile.
		{ModelType: "deepseek_v3", Hidden: 64, Experts: 8, TopK: 2, Inter: 32, SharedExperts: 1, Method: "noaux_tc",
			Scoring: "sigmoid", NGroup: 2, TopKGroup: 1, NormTopK: true, Scaling: 2.5, DType: "F8_E4M3", FP8Block: [2]int{16, 16}, Seed: 5},
		{ModelType: "qwen3_moe", Hidden: 48, Experts: 6, TopK: 2, Inter: 32, NormTopK: true, DType: "F8_E4M3", FP8Block: [2]int{8, 24}, Seed: 6},
		// And INT4 (compressed-tensors) experts stay 4-bit.
		{ModelType: "deepseek_v3", Hidden: 64, Experts: 8, TopK: 2, Inter: 32, SharedExperts: 1, Method: "noaux_tc",
			Scoring: "sigmoid", NGroup: 2, TopKGroup: 1, NormTopK: true, Scaling: 2.5, DType: "INT4", Seed: 7},
	}
	for _, s := range specs {
		t.Run(s.ModelType+" "+s.DType, func(t *testing.T) {
			m, err := moetest.Generate(s)
			require.NoError(t, err)
			dir := filepath.Join(t.TempDir(), "ckpt")
			require.NoError(t, m.WriteTo(dir))
			l, err := moe.Load(dir, s.Layer)
			require.NoError(t, err)
			defer l.Close()
			checkMoE(t, cuda.NewEmu(), l, 1, 37)
		})
	}
}

// TestMXFP4MoEOnEmulation: layers of random MXFP4, UINT4 (with offsets)
// and INT8 experts (their codes resident on the device) against the CPU
// layer.
func TestMXFP4MoEOnEmulation(t *testing.T) {
	cfg := &moe.Config{ModelType: "mixtral", Hidden: 64, NumExperts: 4, TopK: 2, Inter: 96, Scoring: moe.Softmax,
		Method: moe.Greedy, NormTopK: true, RoutedScaling: 1}
	for _, dt := range []kernels.DType{kernels.MXFP4, kernels.UINT4, kernels.INT8} {
		t.Run(dt.String(), func(t *testing.T) {
			l, err := moe.NewRandom(cfg, dt, 8)
			require.NoError(t, err)
			checkMoE(t, cuda.NewEmu(), l, 1, 37)
		})
	}
}

func TestMoEBadShapes(t *testing.T) {
	cfg := &moe.Config{ModelType: "mixtral", Hidden: 24, NumExperts: 2, TopK: 1, Inter: 16, Scoring: moe.Softmax,
		Method: moe.Greedy, NormTopK: true, RoutedScaling: 1}
	l, err := moe.NewRandom(cfg, kernels.BF16, 1)
	require.NoError(t, err)
	_, err = moegpu.NewMoE(cuda.NewEmu(), l)
	require.ErrorContains(t, err, "must be multiples of 16")

	cfg.Hidden = 32
	l, err = moe.NewRandom(cfg, kernels.BF16, 1)
	require.NoError(t, err)
	g, err := moegpu.NewMoE(cuda.NewEmu(), l)
	require.NoError(t, err)
	require.ErrorContains(t, g.Forward(context.Background(), make([]float32, 33), make([]float32, 33)), "want [tokens, 32]")
	x := make([]float32, 32)
	require.NoError(t, g.Forward(context.Background(), x, make([]float32, 32)))
	_, err = g.NewStage(cuda.NewBuffers(cuda.NewEmu()), 0, false)
	require.EqualError(t, err, "cuda: moe: a stage of 0 tokens")
	require.NoError(t, g.Close())
	require.NoError(t, g.Close(), "a second Close does nothing")
	require.ErrorIs(t, g.Forward(context.Background(), x, make([]float32, 32)), moe.ErrClosed)
}

// TestGroupedFFNOnEmulation runs the grouped FFN conformance suite (the one
// every CPU implementation runs) on the emulated device kernels.
func TestGroupedFFNOnEmulation(t *testing.T) {
	kerneltest.TestGroupedFFN(t, func(x []float32, groups []kernels.FFNGroup) error {
		return moegpu.GroupedFFN(context.Background(), cuda.NewEmu(), x, groups)
	}, kerneltest.GroupedOptions{DTypes: []kernels.DType{kernels.BF16}, BF16Activations: true})
}

func TestGroupedFFNBadInput(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	w := func(dt kernels.DType, r, c int) kernels.Matrix { m, _ := kerneltest.Weights(rng, dt, r, c); return m }
	x := make([]float32, 3*32)
	g := kernels.FFNGroup{Gate: w(kernels.BF16, 16, 32), Up: w(kernels.BF16, 16, 32), Down: w(kernels.BF16, 32, 16),
		Rows: []int32{0, 2}, Out: make([]float32, 2*32)}
	emu := cuda.NewEmu()
	bad := g
	bad.Up = w(kernels.F32, 16, 32)
	require.EqualError(t, moegpu.GroupedFFN(context.Background(), emu, x, []kernels.FFNGroup{bad}),
		"cuda: grouped FFN: group 0 up weights are F32; the device kernels take bf16")
	bad = g
	bad.Rows = []int32{0, 3}
	require.EqualError(t, moegpu.GroupedFFN(context.Background(), emu, x, []kernels.FFNGroup{g, bad}), "cuda: grouped FFN: group 1 names row 3 of 3")
	bad = g
	bad.Out = make([]float32, 32)
	require.ErrorContains(t, moegpu.GroupedFFN(context.Background(), emu, x, []kernels.FFNGroup{bad}), "group 0 output has 32 values, want 2 rows × 32")
	require.ErrorContains(t, moegpu.GroupedFFN(context.Background(), emu, x[:40], []kernels.FFNGroup{g}), "x has 40 values, not a multiple of hidden size 32")
	bad = g
	bad.Gate, bad.Up, bad.Down = w(kernels.BF16, 16, 24), w(kernels.BF16, 16, 24), w(kernels.BF16, 24, 16)
	require.ErrorContains(t, moegpu.GroupedFFN(context.Background(), emu, x, []kernels.FFNGroup{bad}), "must be positive multiples of 16")
}

// TestExpertsOnEmulation: a layer whose experts run on the device through
// moegpu.Experts, on one rank and as two EP ranks sharing the device, against
// the same layer on the CPU.
func TestExpertsOnEmulation(t *testing.T) {
	m, err := moetest.Generate(moetest.Spec{ModelType: "deepseek_v2", Hidden: 64, Experts: 8, TopK: 3, Inter: 32,
		SharedExperts: 1, Method: "greedy", Scoring: "softmax", Scaling: 1, DType: "BF16", Seed: 9})
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), "ckpt")
	require.NoError(t, m.WriteTo(dir))
	l, err := moe.Load(dir, 0)
	require.NoError(t, err)
	defer l.Close()
	const T = 21
	x := moetest.Input(5, T, 64, false)
	for i, v := range x {
		x[i] = half.BF16ToF32(half.F32ToBF16(v))
	}
	want := make([]float32, len(x))
	require.NoError(t, l.Forward(context.Background(), x, want))
	ref := make([]float64, len(want))
	for i, v := range want {
		ref[i] = float64(v)
	}

	dev := cuda.NewEmu()
	whole := l.Subset(func(int) bool { return true })
	ex, err := moegpu.NewExperts(dev, whole)
	require.NoError(t, err)
	defer ex.Close()
	whole.SetExpertRunner(ex)
	got := make([]float32, len(x))
	require.NoError(t, whole.Forward(context.Background(), x, got))
	e := moetest.RelErr(got, ref)
	t.Logf("one rank: relative error %.2e", e)
	require.LessOrEqual(t, e, 1e-2)

	// The same runner replaying captured graphs (row buckets of 16, 32):
	// the eager bits, for several batch sizes; eager again when the vote
	// says no.
	graphed := l.Subset(func(int) bool { return true })
	exG, err := moegpu.NewExperts(dev, graphed)
	require.NoError(t, err)
	defer exG.Close()
	exG.EnableGraphs()
	graphed.SetExpertRunner(exG)
	for _, n := range []int{T, 1} {
		eager := make([]float32, n*64)
		require.NoError(t, whole.Forward(context.Background(), x[:n*64], eager))
		exG.AllowGraph(true)
		replayed := make([]float32, n*64)
		require.NoError(t, graphed.Forward(context.Background(), x[:n*64], replayed))
		require.Equal(t, eager, replayed, "%d tokens", n)
	}
	require.Equal(t, 2, exG.GraphReplays())
	exG.AllowGraph(false)
	require.NoError(t, graphed.Forward(context.Background(), x, got))
	require.Equal(t, 1, exG.EagerRuns())

	// Two EP ranks, each with its shard's experts on the (shared) device,
	// replaying graphs.
	place, err := ep.Contiguous(8, 2)
	require.NoError(t, err)
	outs := make([][]float32, 2)
	errs, err := ep.RunLocal(2, func(c ep.Comm) error {
		r := c.Rank()
		mine := map[int]bool{}
		for _, e := range place.Local(r) {
			mine[e] = true
		}
		shard := l.Subset(func(e int) bool { return mine[e] })
		ex, err := moegpu.NewExperts(dev, shard)
		if err != nil {
			return err
		}
		defer ex.Close()
		ex.EnableGraphs() // both ranks capture on the shared device at once
		ex.AllowGraph(true)
		shard.SetExpertRunner(ex)
		el, err := ep.FromLayer(shard, c, place)
		if err != nil {
			return err
		}
		lo, hi := r*T/2, (r+1)*T/2
		outs[r] = make([]float32, (hi-lo)*64)
		return el.Forward(context.Background(), x[lo*64:hi*64], outs[r])
	})
	require.NoError(t, err)
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	e = moetest.RelErr(append(outs[0], outs[1]...), ref)
	t.Logf("two EP ranks: relative error %.2e", e)
	require.LessOrEqual(t, e, 1e-2)

	// A group for an expert the device does not hold.
	half0 := l.Subset(func(e int) bool { return e < 4 })
	ex0, err := moegpu.NewExperts(dev, half0)
	require.NoError(t, err)
	defer ex0.Close()
	w, _ := l.Expert(6)
	err = ex0.GroupedFFN(context.Background(), x, []kernels.FFNGroup{{Gate: w.Gate, Up: w.Up, Down: w.Down,
		Rows: []int32{0}, Out: make([]float32, 64), Expert: 6}})
	require.EqualError(t, err, "cuda: experts: group 0 needs expert 6, which is not on the device")
}

// TestMoEStepGraphOnEmulation: the fixed-buffer decode step gives the
// bits of MoE.Forward for every batch size up to its bucket (padding rows
// change nothing), eagerly and replayed from its captured graph with new
// inputs; an IDLE replay (zero tokens) runs; copies cannot be captured.
func TestMoEStepGraphOnEmulation(t *testing.T) {
	specs := []moetest.Spec{
		{ModelType: "deepseek_v2", Hidden: 64, Experts: 8, TopK: 3, Inter: 32, SharedExperts: 1, Method: "greedy",
			Scoring: "softmax", Scaling: 1, DType: "BF16", Seed: 11},
		{ModelType: "qwen2_moe", Hidden: 32, Experts: 6, TopK: 2, Inter: 16, SharedInter: 32, NormTopK: true, DType: "BF16", Seed: 12},
	}
	for _, spec := range specs {
		t.Run(spec.ModelType, func(t *testing.T) {
			m, err := moetest.Generate(spec)
			require.NoError(t, err)
			dir := filepath.Join(t.TempDir(), "ckpt")
			require.NoError(t, m.WriteTo(dir))
			l, err := moe.Load(dir, spec.Layer)
			require.NoError(t, err)
			defer l.Close()
			dev := cuda.NewEmu()
			g, err := moegpu.NewMoE(dev, l)
			require.NoError(t, err)
			defer g.Close()
			const bucket = 8
			step, err := g.NewStep(bucket)
			require.NoError(t, err)
			defer step.Close()
			H := spec.Hidden
			check := func(seed uint64, tokens int) {
				x := moetest.Input(seed, tokens, H, false)
				want := make([]float32, len(x))
				require.NoError(t, g.Forward(context.Background(), x, want))
				got := make([]float32, len(x))
				require.NoError(t, step.Forward(context.Background(), x, got))
				require.Equal(t, want, got, "%d tokens in a bucket of %d", tokens, bucket)
			}
			for _, n := range []int{bucket, 5, 1} {
				check(uint64(n), n)
			}
			require.NoError(t, step.Capture())
			for _, n := range []int{bucket, 3, 1} {
				check(uint64(100+n), n) // replays, new inputs in the same buffers
			}
			require.NoError(t, step.Forward(context.Background(), nil, nil), "an IDLE rank replays with zero tokens")
			require.ErrorContains(t, step.Forward(context.Background(), make([]float32, (bucket+1)*H), make([]float32, (bucket+1)*H)), "want [t ≤ 8")
		})
	}
	l, err := moe.NewRandom(&moe.Config{ModelType: "mixtral", Hidden: 32, NumExperts: 2, TopK: 1, Inter: 16,
		Scoring: moe.Softmax, Method: moe.Greedy, NormTopK: true, RoutedScaling: 1}, kernels.BF16, 1)
	require.NoError(t, err)
	g, err := moegpu.NewMoE(cuda.NewEmu(), l)
	require.NoError(t, err)
	defer g.Close()
	_, err = g.NewStep(0)
	require.EqualError(t, err, "cuda: moe step: bucket of 0 tokens")

	dev := cuda.NewEmu()
	b, err := dev.Alloc(8)
	require.NoError(t, err)
	_, err = dev.Capture(func(rec cuda.Launcher) error { return rec.ToDevice(b, unsafe.Pointer(&[2]float32{}), 8) })
	require.ErrorContains(t, err, "a copy while capturing a graph")
}
