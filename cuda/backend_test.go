//go:build cudaemu && !cuda

package cuda_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/dpattn"
	"github.com/moex-project/moex/ep"
	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/kernels/kerneltest"
	"github.com/moex-project/moex/moe"
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
	}
	for _, s := range specs {
		t.Run(s.ModelType, func(t *testing.T) {
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

// TestMLADecodeOnEmulation: MLA decode through the device launch code
// against dpattn.MLA.
func TestMLADecodeOnEmulation(t *testing.T) {
	in, want, wantLSE := mlaCase(t, 2, []int32{1, 16, 50}, 2, 64, 48, 16, 20, 0.2, kernels.F32)
	got, lse, err := cuda.MLADecode(cuda.NewEmu(), in)
	require.NoError(t, err)
	for i := range want {
		require.InDelta(t, want[i], got[i], 1e-5*(1+math.Abs(float64(want[i]))))
	}
	for i := range wantLSE {
		require.InDelta(t, wantLSE[i], lse[i], 1e-5*(1+math.Abs(float64(wantLSE[i]))))
	}
	_, _, err = cuda.MLADecode(cuda.NewEmu(), cuda.MLAInput{SeqLens: []int32{0}, Q: make([]float32, 4), D: 4, DV: 4, Heads: 1,
		BlockSize: 1, MaxBlocks: 1, BlockTable: []int32{0}, SplitRows: 1})
	require.ErrorContains(t, err, "sequence 0 has length 0")
}

func TestMoEBadShapes(t *testing.T) {
	cfg := &moe.Config{ModelType: "mixtral", Hidden: 24, NumExperts: 2, TopK: 1, Inter: 16, Scoring: moe.Softmax,
		Method: moe.Greedy, NormTopK: true, RoutedScaling: 1}
	l, err := moe.NewRandom(cfg, kernels.BF16, 1)
	require.NoError(t, err)
	_, err = cuda.NewMoE(cuda.NewEmu(), l)
	require.ErrorContains(t, err, "must be multiples of 16")

	cfg.Hidden = 32
	l, err = moe.NewRandom(cfg, kernels.BF16, 1)
	require.NoError(t, err)
	g, err := cuda.NewMoE(cuda.NewEmu(), l)
	require.NoError(t, err)
	defer g.Close()
	require.ErrorContains(t, g.Forward(make([]float32, 33), make([]float32, 33)), "want [tokens, 32]")
}

// TestGroupedFFNOnEmulation runs the grouped FFN conformance suite (the one
// every CPU implementation runs) on the emulated device kernels.
func TestGroupedFFNOnEmulation(t *testing.T) {
	kerneltest.TestGroupedFFN(t, func(x []float32, groups []kernels.FFNGroup) error {
		return cuda.GroupedFFN(cuda.NewEmu(), x, groups)
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
	require.EqualError(t, cuda.GroupedFFN(emu, x, []kernels.FFNGroup{bad}),
		"cuda: grouped FFN: group 0 up weights are F32; the device kernels take bf16")
	bad = g
	bad.Rows = []int32{0, 3}
	require.EqualError(t, cuda.GroupedFFN(emu, x, []kernels.FFNGroup{g, bad}), "cuda: grouped FFN: group 1 names row 3 of 3")
	bad = g
	bad.Out = make([]float32, 32)
	require.ErrorContains(t, cuda.GroupedFFN(emu, x, []kernels.FFNGroup{bad}), "group 0 output has 32 values, want 2 rows × 32")
	require.ErrorContains(t, cuda.GroupedFFN(emu, x[:40], []kernels.FFNGroup{g}), "x has 40 values, not a multiple of hidden size 32")
	bad = g
	bad.Gate, bad.Up, bad.Down = w(kernels.BF16, 16, 24), w(kernels.BF16, 16, 24), w(kernels.BF16, 24, 16)
	require.ErrorContains(t, cuda.GroupedFFN(emu, x, []kernels.FFNGroup{bad}), "must be positive multiples of 16")
}

// TestExpertsOnEmulation: a layer whose experts run on the device through
// cuda.Experts, on one rank and as two EP ranks sharing the device, against
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
	ex, err := cuda.NewExperts(dev, whole)
	require.NoError(t, err)
	defer ex.Close()
	whole.Experts = ex
	got := make([]float32, len(x))
	require.NoError(t, whole.Forward(context.Background(), x, got))
	e := moetest.RelErr(got, ref)
	t.Logf("one rank: relative error %.2e", e)
	require.LessOrEqual(t, e, 1e-2)

	// The same runner replaying captured graphs (row buckets of 16, 32):
	// the eager bits, for several batch sizes; eager again when the vote
	// says no.
	graphed := l.Subset(func(int) bool { return true })
	exG, err := cuda.NewExperts(dev, graphed)
	require.NoError(t, err)
	defer exG.Close()
	exG.EnableGraphs()
	graphed.Experts = exG
	for _, n := range []int{T, 1} {
		eager := make([]float32, n*64)
		require.NoError(t, whole.Forward(context.Background(), x[:n*64], eager))
		exG.AllowGraph(true)
		replayed := make([]float32, n*64)
		require.NoError(t, graphed.Forward(context.Background(), x[:n*64], replayed))
		require.Equal(t, eager, replayed, "%d tokens", n)
	}
	require.Equal(t, 2, exG.Replays)
	exG.AllowGraph(false)
	require.NoError(t, graphed.Forward(context.Background(), x, got))
	require.Equal(t, 1, exG.Eager)

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
		ex, err := cuda.NewExperts(dev, shard)
		if err != nil {
			return err
		}
		defer ex.Close()
		ex.EnableGraphs() // both ranks capture on the shared device at once
		ex.AllowGraph(true)
		shard.Experts = ex
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
	ex0, err := cuda.NewExperts(dev, half0)
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
			g, err := cuda.NewMoE(dev, l)
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
				require.NoError(t, g.Forward(x, want))
				got := make([]float32, len(x))
				require.NoError(t, step.Forward(x, got))
				require.Equal(t, want, got, "%d tokens in a bucket of %d", tokens, bucket)
			}
			for _, n := range []int{bucket, 5, 1} {
				check(uint64(n), n)
			}
			require.NoError(t, step.Capture())
			for _, n := range []int{bucket, 3, 1} {
				check(uint64(100+n), n) // replays, new inputs in the same buffers
			}
			require.NoError(t, step.Forward(nil, nil), "an IDLE rank replays with zero tokens")
			require.ErrorContains(t, step.Forward(make([]float32, (bucket+1)*H), make([]float32, (bucket+1)*H)), "want [t ≤ 8")
		})
	}
	l, err := moe.NewRandom(&moe.Config{ModelType: "mixtral", Hidden: 32, NumExperts: 2, TopK: 1, Inter: 16,
		Scoring: moe.Softmax, Method: moe.Greedy, NormTopK: true, RoutedScaling: 1}, kernels.BF16, 1)
	require.NoError(t, err)
	g, err := cuda.NewMoE(cuda.NewEmu(), l)
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

// TestAttentionOnEmulation: the DeepSeek attention block with its MLA core
// on the device (a synced copy of the cache) against the same block on the
// host, over prefilled sequences and several decode steps.
func TestAttentionOnEmulation(t *testing.T) {
	for _, dt := range []kernels.DType{kernels.F32, kernels.BF16} {
		t.Run(dt.String(), func(t *testing.T) {
			cfg := dpattn.AttnConfig{Hidden: 32, Heads: 2, KVLoraRank: 48, NopeDim: 16, RopeDim: 16, VDim: 16,
				RopeTheta: 10000, RMSNormEps: 1e-6}
			blk, err := dpattn.NewRandomMLABlock(cfg, kernels.BF16, 4)
			require.NoError(t, err)
			host, err := dpattn.NewLatentCache(12, 16, 64, dt)
			require.NoError(t, err)
			dev, err := dpattn.NewLatentCache(12, 16, 64, dt)
			require.NoError(t, err)
			att := cuda.NewAttention(cuda.NewEmu())
			defer att.Close()
			att.SplitRows = 16 // several splits: the merge kernel runs too
			dev.Core = att
			rng := rand.New(rand.NewPCG(7, 8))
			for s, n := range []int{5, 40, 17} {
				rows := make([]float32, n*64)
				for i := range rows {
					rows[i] = float32(rng.NormFloat64())
				}
				require.NoError(t, host.Append(s, rows))
				require.NoError(t, dev.Append(s, rows))
			}
			for step := 0; step < 3; step++ {
				seqs := []int{0, 1, 2}
				x := moetest.Input(uint64(step), len(seqs), cfg.Hidden, false)
				want, got := make([]float32, len(x)), make([]float32, len(x))
				require.NoError(t, blk.Forward(context.Background(), host, seqs, x, want))
				require.NoError(t, blk.Forward(context.Background(), dev, seqs, x, got))
				for i := range want {
					require.InDelta(t, want[i], got[i], 1e-4*(1+math.Abs(float64(want[i]))), "step %d value %d", step, i)
				}
			}
		})
	}
}

// TestAttentionGraphsOnEmulation: replayed graphs of MLA decode (queries
// and splits padded to their buckets) give the eager bits, across batches
// of different sizes and sequences that grow into a larger split bucket;
// a step the vote does not allow runs eagerly.
func TestAttentionGraphsOnEmulation(t *testing.T) {
	cfg := dpattn.AttnConfig{Hidden: 32, Heads: 2, KVLoraRank: 48, NopeDim: 16, RopeDim: 16, VDim: 16,
		RopeTheta: 10000, RMSNormEps: 1e-6}
	blk, err := dpattn.NewRandomMLABlock(cfg, kernels.BF16, 4)
	require.NoError(t, err)
	var caches [2]*dpattn.LatentCache
	var cores [2]*cuda.Attention
	for i := range caches {
		caches[i], err = dpattn.NewLatentCache(12, 16, 64, kernels.BF16)
		require.NoError(t, err)
		cores[i] = cuda.NewAttention(cuda.NewEmu())
		defer cores[i].Close()
		cores[i].SplitRows = 16
		caches[i].Core = cores[i]
	}
	cores[1].EnableGraphs()
	rng := rand.New(rand.NewPCG(9, 10))
	for s, n := range []int{5, 62, 17} {
		rows := make([]float32, n*64)
		for i := range rows {
			rows[i] = float32(rng.NormFloat64())
		}
		for _, c := range caches {
			require.NoError(t, c.Append(s, rows))
		}
	}
	steps := [][]int{{0, 1, 2}, {1}, {0, 2}, {1, 2}, {0, 1, 2}, {1}}
	for step, seqs := range steps {
		cores[1].AllowGraph(step != 2)
		x := moetest.Input(uint64(step), len(seqs), cfg.Hidden, false)
		want, got := make([]float32, len(x)), make([]float32, len(x))
		require.NoError(t, blk.Forward(context.Background(), caches[0], seqs, x, want))
		require.NoError(t, blk.Forward(context.Background(), caches[1], seqs, x, got))
		require.Equal(t, want, got, "step %d, sequences %v", step, seqs)
	}
	require.Equal(t, int64(5), cores[1].Replays.Load())
	require.Equal(t, int64(1), cores[1].Eager.Load())
	require.Equal(t, int64(0), cores[0].Replays.Load(), "graphs are off unless enabled")
}

// TestProjectionsOnEmulation: the device projector against a float64
// reference over bf16-rounded inputs (as the tensor cores see them): one
// matrix, and heads whose rows span several GEMM blocks; bad shapes are
// named.
func TestProjectionsOnEmulation(t *testing.T) {
	att := cuda.NewAttention(cuda.NewEmu())
	defer att.Close()
	p := att.Projections()
	rng := rand.New(rand.NewPCG(11, 12))
	bf := func(v float32) float64 { return float64(half.BF16ToF32(half.F32ToBF16(v))) }
	for _, c := range []struct{ heads, tokens, n, k int }{{1, 3, 40, 32}, {1, 70, 16, 48}, {3, 70, 24, 16}, {2, 1, 64, 64}} {
		ws := make([]kernels.Matrix, c.heads)
		vals := make([][][]float64, c.heads)
		for h := range ws {
			ws[h], vals[h] = kerneltest.Weights(rng, kernels.BF16, c.n, c.k)
		}
		rows := c.tokens * c.heads
		x := make([]float32, rows*c.k)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		out := make([]float32, rows*c.n)
		if c.heads == 1 {
			require.NoError(t, p.Project(context.Background(), &ws[0], x, out))
		} else {
			require.NoError(t, p.ProjectHeads(context.Background(), ws, x, out))
		}
		for r := 0; r < rows; r++ {
			for n := 0; n < c.n; n++ {
				var want, mag float64
				for k := 0; k < c.k; k++ {
					v := bf(x[r*c.k+k]) * vals[r%c.heads][n][k]
					want += v
					mag += math.Abs(v)
				}
				require.InDelta(t, want, out[r*c.n+n], 1e-5*mag+1e-6, "%+v row %d col %d", c, r, n)
			}
		}
	}
	w, _ := kerneltest.Weights(rng, kernels.BF16, 16, 20)
	require.ErrorContains(t, p.Project(context.Background(), &w, make([]float32, 20), make([]float32, 16)),
		"the device GEMM takes k a positive multiple of 16")
	w, _ = kerneltest.Weights(rng, kernels.BF16, 16, 32)
	require.ErrorContains(t, p.Project(context.Background(), &w, make([]float32, 33), make([]float32, 16)),
		"x has 33 values and out 16")
	require.ErrorContains(t, p.ProjectHeads(context.Background(), nil, nil, nil), "head projection: no heads")
	pair := []kernels.Matrix{w, w}
	require.NoError(t, p.Project(context.Background(), &pair[0], make([]float32, 32), make([]float32, 16)))
	require.ErrorContains(t, p.ProjectHeads(context.Background(), pair, make([]float32, 64), make([]float32, 32)),
		"are on the device as 1 × [16, 32], asked for as 2 × [16, 32]")
	other, _ := kerneltest.Weights(rng, kernels.BF16, 8, 32)
	require.ErrorContains(t, p.ProjectHeads(context.Background(), []kernels.Matrix{w, other}, make([]float32, 64), make([]float32, 32)),
		"head projection: head 1 is [8, 32], head 0 [16, 32]")
}

// TestMLABlockOnEmulation: the whole MLA block with its projections and its
// attention on the device, against the block on the host: within the
// bf16 tolerance of the tensor-core path.
func TestMLABlockOnEmulation(t *testing.T) {
	cfg := dpattn.AttnConfig{Hidden: 64, Heads: 2, KVLoraRank: 48, NopeDim: 16, RopeDim: 16, VDim: 32,
		RopeTheta: 10000, RMSNormEps: 1e-6}
	r := 32
	cfg.QLoraRank = &r
	blk, err := dpattn.NewRandomMLABlock(cfg, kernels.BF16, 5)
	require.NoError(t, err)
	host, err := dpattn.NewLatentCache(8, 16, 64, kernels.BF16)
	require.NoError(t, err)
	dev, err := dpattn.NewLatentCache(8, 16, 64, kernels.BF16)
	require.NoError(t, err)
	att := cuda.NewAttention(cuda.NewEmu())
	defer att.Close()
	dev.Core, dev.Proj = att, att.Projections()
	for step := 0; step < 3; step++ {
		seqs := []int{0, 1, 2}
		if step == 0 {
			seqs = []int{0, 0, 0, 1, 1, 2} // an extend: several tokens of a sequence
		}
		x := moetest.Input(uint64(step), len(seqs), cfg.Hidden, false)
		want, got := make([]float32, len(x)), make([]float32, len(x))
		require.NoError(t, blk.Forward(context.Background(), host, seqs, x, want))
		require.NoError(t, blk.Forward(context.Background(), dev, seqs, x, got))
		var diff, norm float64
		for i := range want {
			d := float64(got[i] - want[i])
			diff += d * d
			norm += float64(want[i]) * float64(want[i])
		}
		rel := math.Sqrt(diff / norm)
		t.Logf("step %d: relative error %.2e", step, rel)
		require.Less(t, rel, 1e-2, "step %d", step)
		require.Greater(t, rel, 0.0, "the device rounds to bf16: the same bits would mean it did not run")
	}
}

// noGraphs is a device whose captures fail (no memory for a graph, say),
// counting the attempts.
type noGraphs struct {
	cuda.Launcher
	tries *int
}

func (g noGraphs) Capture(func(cuda.Launcher) error) (cuda.Graph, error) {
	*g.tries++
	return nil, errors.New("no graphs here")
}

// TestAttentionGraphCaptureFails: a bucket that cannot be captured runs
// eagerly, with the eager results, and its capture is not tried again.
func TestAttentionGraphCaptureFails(t *testing.T) {
	cfg := dpattn.AttnConfig{Hidden: 32, Heads: 2, KVLoraRank: 48, NopeDim: 16, RopeDim: 16, VDim: 16,
		RopeTheta: 10000, RMSNormEps: 1e-6}
	blk, err := dpattn.NewRandomMLABlock(cfg, kernels.BF16, 4)
	require.NoError(t, err)
	var caches [2]*dpattn.LatentCache
	captures := 0
	var cores [2]*cuda.Attention
	for i, d := range []cuda.Launcher{cuda.NewEmu(), noGraphs{cuda.NewEmu(), &captures}} {
		caches[i], err = dpattn.NewLatentCache(8, 16, 64, kernels.BF16)
		require.NoError(t, err)
		cores[i] = cuda.NewAttention(d)
		defer cores[i].Close()
		caches[i].Core = cores[i]
	}
	cores[1].EnableGraphs()
	cores[1].AllowGraph(true)
	for step := 0; step < 3; step++ {
		seqs := []int{0, 1}
		x := moetest.Input(uint64(step), len(seqs), cfg.Hidden, false)
		want, got := make([]float32, len(x)), make([]float32, len(x))
		require.NoError(t, blk.Forward(context.Background(), caches[0], seqs, x, want))
		require.NoError(t, blk.Forward(context.Background(), caches[1], seqs, x, got))
		require.Equal(t, want, got, "step %d", step)
	}
	require.Equal(t, int64(0), cores[1].Replays.Load())
	require.Equal(t, int64(3), cores[1].Eager.Load())
	require.Equal(t, 1, captures, "one bucket, tried once")
}
