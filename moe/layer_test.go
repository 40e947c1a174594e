package moe_test

import (
	"context"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/moex-project/moex/format/safetensors"
	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// familySpecs covers every family, weight dtype and routing method, with
// sizes that are not powers of two.
func familySpecs() []struct {
	name string
	spec moetest.Spec
} {
	return []struct {
		name string
		spec moetest.Spec
	}{
		{"mixtral f32", moetest.Spec{ModelType: "mixtral", Hidden: 24, Experts: 8, TopK: 2, Inter: 20, NumLayers: 2, Layer: 1, DType: "F32", Seed: 1}},
		{"mixtral bf16 sharded", moetest.Spec{ModelType: "mixtral", Hidden: 33, Experts: 5, TopK: 3, Inter: 17, DType: "BF16", Shards: 3, Seed: 2}},
		{"qwen2_moe bf16 norm", moetest.Spec{ModelType: "qwen2_moe", Hidden: 40, Experts: 12, TopK: 4, Inter: 12, SharedInter: 28, NormTopK: true, DType: "BF16", Seed: 3}},
		{"qwen2_moe f32 no norm", moetest.Spec{ModelType: "qwen2_moe", Hidden: 16, Experts: 6, TopK: 2, Inter: 8, SharedInter: 24, DType: "F32", Seed: 4}},
		{"qwen2_moe f16", moetest.Spec{ModelType: "qwen2_moe", Hidden: 20, Experts: 4, TopK: 2, Inter: 12, SharedInter: 8, NormTopK: true, DType: "F16", Seed: 5}},
		{"qwen3_moe f32 norm", moetest.Spec{ModelType: "qwen3_moe", Hidden: 32, Experts: 16, TopK: 4, Inter: 10, NormTopK: true, NumLayers: 4, Layer: 3, DType: "F32", Seed: 6}},
		{"qwen3_moe bf16 no norm sparse step", moetest.Spec{ModelType: "qwen3_moe", Hidden: 28, Experts: 10, TopK: 3, Inter: 14, NumLayers: 4, Layer: 1, SparseStep: 2, DType: "BF16", Seed: 7}},
		{"deepseek_v2 greedy f32", moetest.Spec{ModelType: "deepseek_v2", Hidden: 32, Experts: 16, TopK: 6, Inter: 12, SharedExperts: 2, Method: "greedy", Scoring: "softmax", NGroup: 1, TopKGroup: 1, NumLayers: 3, Layer: 2, FirstKDense: 1, DType: "F32", Seed: 8}},
		{"deepseek_v2 group-limited bf16", moetest.Spec{ModelType: "deepseek_v2", Hidden: 48, Experts: 16, TopK: 3, Inter: 16, SharedExperts: 1, Method: "group_limited_greedy", Scoring: "softmax", NGroup: 4, TopKGroup: 2, Scaling: 16, DType: "BF16", Seed: 9}},
		{"deepseek_v2 group-limited norm scaled f32", moetest.Spec{ModelType: "deepseek_v2", Hidden: 24, Experts: 12, TopK: 4, Inter: 8, Method: "group_limited_greedy", Scoring: "softmax", NGroup: 3, TopKGroup: 2, NormTopK: true, Scaling: 2.5, DType: "F32", Seed: 10}},
		{"deepseek_v3 noaux_tc f32", moetest.Spec{ModelType: "deepseek_v3", Hidden: 36, Experts: 32, TopK: 8, Inter: 12, SharedExperts: 1, Method: "noaux_tc", Scoring: "sigmoid", NGroup: 8, TopKGroup: 4, NormTopK: true, Scaling: 2.5, DType: "F32", Seed: 11}},
		{"deepseek_v3 noaux_tc bf16 sharded", moetest.Spec{ModelType: "deepseek_v3", Hidden: 40, Experts: 16, TopK: 4, Inter: 20, SharedExperts: 2, Method: "noaux_tc", Scoring: "sigmoid", NGroup: 4, TopKGroup: 2, NormTopK: true, Scaling: 1.5, DType: "BF16", Shards: 2, Seed: 12}},
		{"deepseek_v3 no norm", moetest.Spec{ModelType: "deepseek_v3", Hidden: 16, Experts: 8, TopK: 2, Inter: 8, Method: "noaux_tc", Scoring: "sigmoid", NGroup: 2, TopKGroup: 1, Scaling: 2, DType: "F32", Seed: 13}},
		{"top-k 1", moetest.Spec{ModelType: "qwen3_moe", Hidden: 24, Experts: 6, TopK: 1, Inter: 8, NormTopK: true, DType: "BF16", Seed: 14}},
		{"top-k all experts", moetest.Spec{ModelType: "mixtral", Hidden: 16, Experts: 4, TopK: 4, Inter: 8, DType: "F32", Seed: 15}},
		{"top-k all experts deepseek_v3", moetest.Spec{ModelType: "deepseek_v3", Hidden: 16, Experts: 8, TopK: 8, Inter: 8, Method: "noaux_tc", Scoring: "sigmoid", NGroup: 4, TopKGroup: 4, NormTopK: true, Scaling: 2.5, DType: "BF16", Seed: 16}},
		{"deepseek_v3 groups of one", moetest.Spec{ModelType: "deepseek_v3", Hidden: 16, Experts: 4, TopK: 2, Inter: 8, Method: "noaux_tc", Scoring: "sigmoid", NGroup: 4, TopKGroup: 3, NormTopK: true, Scaling: 1, DType: "F32", Seed: 17}},
	}
}

// checkAgainstReference runs the layer on x and compares with the float64
// reference: identical ids, weights within 1e-6, y within 1e-5.
func checkAgainstReference(t *testing.T, l *moe.Layer, m *moetest.Model, x []float32) {
	t.Helper()
	s := m.Spec
	T := len(x) / s.Hidden
	y := make([]float32, len(x))
	ids := make([]int32, T*s.TopK)
	w := make([]float32, T*s.TopK)
	require.NoError(t, l.ForwardRouting(context.Background(), x, y, ids, w))
	ref := m.Forward(x)
	require.Equal(t, ref.IDs, ids, "expert ids")
	for i := range w {
		require.InDelta(t, ref.Weights[i], w[i], 1e-6*math.Max(1, math.Abs(ref.Weights[i])), "weight %d", i)
	}
	if T > 0 {
		e := moetest.RelErr(y, ref.Y)
		require.LessOrEqual(t, e, 1e-5, "relative error of y")
		t.Logf("%d tokens: relative error %.2e", T, e)
	}
}

func writeModel(t *testing.T, spec moetest.Spec) (*moetest.Model, string) {
	t.Helper()
	m, err := moetest.Generate(spec)
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), "ckpt")
	require.NoError(t, m.WriteTo(dir))
	return m, dir
}

func TestForwardMatchesReference(t *testing.T) {
	for _, tt := range familySpecs() {
		t.Run(tt.name, func(t *testing.T) {
			m, dir := writeModel(t, tt.spec)
			l, err := moe.Load(dir, m.Spec.Layer)
			require.NoError(t, err)
			defer l.Close()
			for _, tokens := range []int{0, 1, 7, 37} {
				checkAgainstReference(t, l, m, moetest.Input(uint64(tokens)+tt.spec.Seed*100, tokens, tt.spec.Hidden, false))
			}
		})
	}
}

func TestAllTokensPickOneExpert(t *testing.T) {
	for _, typ := range []string{"mixtral", "qwen2_moe", "deepseek_v2"} {
		t.Run(typ, func(t *testing.T) {
			spec := moetest.Spec{ModelType: typ, Hidden: 32, Experts: 8, TopK: 1, Inter: 16, SharedInter: 8, SharedExperts: 1,
				Method: "greedy", Scoring: "softmax", NGroup: 1, TopKGroup: 1, DType: "BF16", Seed: 21, HotExpert: 6}
			m, dir := writeModel(t, spec)
			l, err := moe.Load(dir, 0)
			require.NoError(t, err)
			defer l.Close()
			x := moetest.Input(5, 50, spec.Hidden, true)
			checkAgainstReference(t, l, m, x)
			ids := make([]int32, 50)
			require.NoError(t, l.ForwardRouting(context.Background(), x, make([]float32, len(x)), ids, nil))
			for _, id := range ids {
				require.EqualValues(t, 5, id)
			}
		})
	}
}

// TestBitsIndependentOfBatchAndWorkers: a token's output bits do not depend
// on the other tokens of its batch nor on the number of goroutines, for
// every kernel implementation.
func TestBitsIndependentOfBatchAndWorkers(t *testing.T) {
	for _, impl := range kernels.Implementations() {
		t.Run(impl, func(t *testing.T) {
			restore, err := kernels.Use(impl)
			require.NoError(t, err)
			defer restore()
			spec := familySpecs()[10].spec // deepseek_v3 with a shared expert
			checkBatchIndependence(t, spec, moetest.Input(99, 29, spec.Hidden, false))
			// One hot expert takes 400 tokens: its rows are split over work items.
			hot := moetest.Spec{ModelType: "qwen2_moe", Hidden: 40, Experts: 8, TopK: 2, Inter: 24, SharedInter: 16,
				NormTopK: true, DType: "BF16", Seed: 31, HotExpert: 3}
			checkBatchIndependence(t, hot, moetest.Input(98, 400, hot.Hidden, true))
		})
	}
}

func checkBatchIndependence(t *testing.T, spec moetest.Spec, x []float32) {
	t.Helper()
	_, dir := writeModel(t, spec)
	l, err := moe.Load(dir, spec.Layer)
	require.NoError(t, err)
	defer l.Close()
	H := spec.Hidden
	T := len(x) / H
	full := make([]float32, len(x))
	l.SetWorkers(1)
	require.NoError(t, l.Forward(context.Background(), x, full))
	for _, workers := range []int{2, 3, 8} {
		l.SetWorkers(workers)
		y := make([]float32, len(x))
		require.NoError(t, l.Forward(context.Background(), x, y))
		require.Equal(t, math32bits(full), math32bits(y), "workers %d", workers)
	}
	for tok := 0; tok < T; tok += 1 + T/8 {
		one := make([]float32, H)
		require.NoError(t, l.Forward(context.Background(), x[tok*H:(tok+1)*H], one))
		require.Equal(t, math32bits(full[tok*H:(tok+1)*H]), math32bits(one), "token %d alone", tok)
	}
	// A different batch around the same token.
	mixed := append(moetest.Input(7, 5, H, false), x[3*H:4*H]...)
	y := make([]float32, len(mixed))
	require.NoError(t, l.Forward(context.Background(), mixed, y))
	require.Equal(t, math32bits(full[3*H:4*H]), math32bits(y[5*H:]))
}

func math32bits(v []float32) []uint32 {
	out := make([]uint32, len(v))
	for i, f := range v {
		out[i] = math.Float32bits(f)
	}
	return out
}

func TestForwardLeavesInputAlone(t *testing.T) {
	spec := familySpecs()[2].spec
	_, dir := writeModel(t, spec)
	l, err := moe.Load(dir, 0)
	require.NoError(t, err)
	defer l.Close()
	x := moetest.Input(3, 9, spec.Hidden, false)
	orig := append([]float32(nil), x...)
	require.NoError(t, l.Forward(context.Background(), x, make([]float32, len(x))))
	require.Equal(t, orig, x)
}

func TestForwardBadInput(t *testing.T) {
	spec := familySpecs()[0].spec
	_, dir := writeModel(t, spec)
	l, err := moe.Load(dir, 1)
	require.NoError(t, err)
	defer l.Close()
	H := spec.Hidden
	ctx := context.Background()
	x := moetest.Input(1, 4, H, false)

	err = l.Forward(ctx, x[:H+1], make([]float32, H+1))
	require.ErrorContains(t, err, "not a multiple of hidden size 24")
	require.ErrorIs(t, err, moe.ErrShape)
	err = l.Forward(ctx, x, make([]float32, H))
	require.ErrorContains(t, err, "output has 24 values, want 96")
	require.ErrorIs(t, err, moe.ErrShape)
	err = l.ForwardRouting(ctx, x, make([]float32, len(x)), make([]int32, 3), nil)
	require.ErrorContains(t, err, "routing outputs")
	require.ErrorIs(t, err, moe.ErrShape)

	bad := append([]float32(nil), x...)
	bad[2*H+5] = float32(math.NaN())
	err = l.Forward(ctx, bad, make([]float32, len(x)))
	require.EqualError(t, err, "moe: input token 2 has a non-finite value NaN at column 5")
	require.ErrorIs(t, err, moe.ErrNonFinite)
	require.NotErrorIs(t, err, moe.ErrShape)
	bad[2*H+5] = 0
	bad[3*H] = float32(math.Inf(-1))
	require.EqualError(t, l.Forward(ctx, bad, make([]float32, len(x))), "moe: input token 3 has a non-finite value -Inf at column 0")

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, l.Forward(cancelled, x, make([]float32, len(x))), context.Canceled)
}

// TestForwardConcurrent: the package's concurrency guarantee — many
// goroutines calling Forward on one Layer at once, each on a batch of its
// own, get the bits of serial calls (run under -race in make test).
func TestForwardConcurrent(t *testing.T) {
	dir := filepath.Join("..", "testdata", "moe", "qwen2_moe_bf16")
	data, err := os.ReadFile(filepath.Join(dir, "layer"))
	require.NoError(t, err)
	n, err := strconv.Atoi(strings.TrimSpace(string(data)))
	require.NoError(t, err)
	l, err := moe.Load(dir, n)
	require.NoError(t, err)
	defer l.Close()
	ctx := context.Background()
	H := l.Config.Hidden
	const callers = 8
	xs, want := make([][]float32, callers), make([][]float32, callers)
	for i := range xs {
		xs[i] = moetest.Input(uint64(i+1), 1+i%5, H, false)
		want[i] = make([]float32, len(xs[i]))
		require.NoError(t, l.Forward(ctx, xs[i], want[i]))
	}
	var wg sync.WaitGroup
	got := make([][][]float32, callers)
	errs := make([]error, callers)
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 4 {
				y := make([]float32, len(xs[i]))
				if errs[i] = l.Forward(ctx, xs[i], y); errs[i] != nil {
					return
				}
				got[i] = append(got[i], y)
			}
		}()
	}
	wg.Wait()
	for i := range callers {
		require.NoError(t, errs[i])
		for _, y := range got[i] {
			require.Equal(t, want[i], y, "caller %d", i)
		}
	}
}

// TestForwardAfterClose: Close waits for nothing in flight here, a second
// Close is harmless, and a forward pass after it is ErrClosed.
func TestForwardAfterClose(t *testing.T) {
	dir := filepath.Join("..", "testdata", "moe", "deepseek_v3_f32")
	l, err := moe.Load(dir, 0)
	require.NoError(t, err)
	x := make([]float32, l.Config.Hidden)
	require.NoError(t, l.Forward(context.Background(), x, make([]float32, len(x))))
	require.NoError(t, l.Close())
	require.NoError(t, l.Close(), "a second Close does nothing")
	err = l.Forward(context.Background(), x, make([]float32, len(x)))
	require.ErrorIs(t, err, moe.ErrClosed)
	require.EqualError(t, err, "moe: forward on a closed layer")
}

// TestGroup: the pipeline's grouping of a whole layer and of a shard, and
// its bad input.
func TestGroup(t *testing.T) {
	cfg := &moe.Config{ModelType: "mixtral", Hidden: 16, NumExperts: 4, TopK: 2, Inter: 16, Scoring: moe.Softmax,
		Method: moe.Greedy, NormTopK: true, RoutedScaling: 1}
	l, err := moe.NewRandom(cfg, kernels.F32, 1)
	require.NoError(t, err)
	ids := []int32{0, 2, 1, 2, 0, 3} // 3 tokens, top-2
	w := []float32{.5, .5, .25, .75, .9, .1}
	g, err := l.Group(ids, w, 2, false, nil)
	require.NoError(t, err)
	require.Len(t, g.Groups, 4)
	require.Equal(t, []int32{0, 2}, g.Groups[0].Rows, "expert 0: tokens 0 and 2")
	require.Equal(t, []float32{.5, .9}, g.Groups[0].Scale)
	require.Equal(t, []int32{0, 1}, g.Groups[2].Rows, "expert 2: tokens 0 and 1")
	require.Equal(t, []int32{0, 3, 2, 4, 1, 5}, g.RowOf, "rows by expert, then token: e0 {p0, p4}, e1 {p2}, e2 {p1, p3}, e3 {p5}")
	require.Len(t, g.Out, 6*cfg.Hidden)

	shard := l.Subset(func(e int) bool { return e >= 2 })
	g, err = shard.Group(ids, w, 2, true, nil)
	require.NoError(t, err)
	require.Len(t, g.Groups, 2)
	require.Equal(t, []int32{-1, 0, -1, 1, -1, 2}, g.RowOf, "pairs of experts 0 and 1 are other ranks'")
	_, err = shard.Group(ids, w, 2, false, nil)
	require.EqualError(t, err, "moe: tokens routed to expert 0, which this layer did not load")

	_, err = l.Group(ids, w[:5], 2, false, nil)
	require.ErrorIs(t, err, moe.ErrShape)
	require.EqualError(t, err, "moe: grouping 6 ids and 5 weights of top-2")
	_, err = l.Group(ids, w, 4, false, nil)
	require.ErrorContains(t, err, "grouping 6 ids and 6 weights of top-4")
}

// TestRouterCopiedAtLoad: the router is a copy, so a checkpoint file
// rewritten in place under a loaded layer does not change its routing.
func TestRouterCopiedAtLoad(t *testing.T) {
	spec := moetest.Spec{ModelType: "qwen2_moe", Hidden: 32, Experts: 6, TopK: 2, Inter: 16, SharedInter: 16, DType: "BF16", Seed: 71}
	_, dir := writeModel(t, spec)
	l, err := moe.Load(dir, 0)
	require.NoError(t, err)
	defer l.Close()
	x := moetest.Input(3, 9, spec.Hidden, false)
	y0, ids0 := make([]float32, len(x)), make([]int32, 9*spec.TopK)
	require.NoError(t, l.ForwardRouting(context.Background(), x, y0, ids0, nil))

	path := filepath.Join(dir, "model.safetensors")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	h, err := safetensors.ParseHeader(data, int64(len(data)))
	require.NoError(t, err)
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	require.NoError(t, err)
	for _, name := range []string{"model.layers.0.mlp.gate.weight", "model.layers.0.mlp.shared_expert_gate.weight"} {
		ti := h.Tensors[name]
		junk := make([]byte, ti.End-ti.Begin)
		for i := range junk {
			junk[i] = byte(i*7 + 3)
		}
		_, err = f.WriteAt(junk, h.DataBase+ti.Begin)
		require.NoError(t, err)
	}
	require.NoError(t, f.Close())

	y1, ids1 := make([]float32, len(x)), make([]int32, len(ids0))
	require.NoError(t, l.ForwardRouting(context.Background(), x, y1, ids1, nil))
	require.Equal(t, ids0, ids1, "routing")
	require.Equal(t, y0, y1)
}

// TestNonFiniteWeights: a NaN in the router is refused when the layer is
// made; one in an expert is found by CheckWeights and, when a token meets
// it, reported by Forward naming the token; finite weights whose products
// overflow fp32 are reported the same way.
func TestNonFiniteWeights(t *testing.T) {
	cfg := &moe.Config{ModelType: "mixtral", Hidden: 16, NumExperts: 4, TopK: 4, Inter: 16, Scoring: moe.Softmax,
		Method: moe.Greedy, NormTopK: true, RoutedScaling: 1}
	H, I, E := cfg.Hidden, cfg.Inter, cfg.NumExperts
	rng := rand.New(rand.NewPCG(5, 6))
	mat := func(r, c int, v float32) kernels.Matrix {
		d := make([]float32, r*c)
		for i := range d {
			d[i] = v * float32(rng.Float64()-0.5)
		}
		m, err := kernels.NewF32(r, c, d)
		require.NoError(t, err)
		return m
	}
	weights := func(expert float32) moe.Weights {
		w := moe.Weights{Gate: mat(E, H, 1), Experts: make([]moe.Expert, E)}
		for e := range w.Experts {
			w.Experts[e] = moe.Expert{Gate: mat(I, H, expert), Up: mat(I, H, expert), Down: mat(H, I, expert)}
		}
		return w
	}
	ctx := context.Background()
	x := moetest.Input(9, 3, H, false)

	w := weights(1)
	g := make([]float32, E*H)
	for i := 0; i < E; i++ {
		w.Gate.RowF32(i, g[i*H:][:H])
	}
	g[2*H+5] = float32(math.NaN())
	w.Gate, _ = kernels.NewF32(E, H, g)
	_, err := moe.New(cfg, w)
	require.EqualError(t, err, "moe: router weight [2, 5] is NaN")
	require.ErrorIs(t, err, moe.ErrNonFinite)

	w = weights(1)
	d := make([]float32, H*I)
	for i := 0; i < H; i++ {
		w.Experts[1].Down.RowF32(i, d[i*I:][:I])
	}
	d[3*I+7] = float32(math.Inf(1))
	w.Experts[1].Down, _ = kernels.NewF32(H, I, d)
	l, err := moe.New(cfg, w)
	require.NoError(t, err, "expert weights are checked on request only")
	err = l.CheckWeights(ctx)
	require.EqualError(t, err, "moe: expert 1 down_proj [3, 7] is +Inf")
	require.ErrorIs(t, err, moe.ErrNonFinite)
	err = l.Forward(ctx, x, make([]float32, len(x))) // top-4 of 4: every token meets expert 1
	require.ErrorContains(t, err, "moe: output token 0 is ")
	require.ErrorContains(t, err, "the expert weights hold a non-finite value (CheckWeights finds it) or the products overflow fp32")
	require.ErrorIs(t, err, moe.ErrNonFinite)

	l, err = moe.New(cfg, weights(1e30)) // finite, but their products are not
	require.NoError(t, err)
	require.NoError(t, l.CheckWeights(ctx))
	err = l.Forward(ctx, x, make([]float32, len(x)))
	require.ErrorContains(t, err, "moe: output token 0 is ")
	require.ErrorIs(t, err, moe.ErrNonFinite)

	l, err = moe.New(cfg, weights(1))
	require.NoError(t, err)
	require.NoError(t, l.CheckWeights(ctx))
	require.NoError(t, l.Forward(ctx, x, make([]float32, len(x))))
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, l.CheckWeights(cancelled), context.Canceled)
}

// TestSizesCheckedFirst: sizes over the memory limit are refused, naming
// them, before anything is allocated.
func TestSizesCheckedFirst(t *testing.T) {
	big := &moe.Config{ModelType: "mixtral", Hidden: 1 << 20, NumExperts: 1 << 10, TopK: 2, Inter: 1 << 20, Scoring: moe.Softmax,
		Method: moe.Greedy, NormTopK: true, RoutedScaling: 1}
	_, err := moe.NewRandom(big, kernels.BF16, 1)
	require.ErrorIs(t, err, moe.ErrTooLarge)
	require.ErrorContains(t, err, "moe: random BF16 weights for 1024 experts of [1048576, 1048576] needs 6291460.0 GiB, more than the ")

	small := &moe.Config{ModelType: "mixtral", Hidden: 64, NumExperts: 8, TopK: 2, Inter: 64, Scoring: moe.Softmax,
		Method: moe.Greedy, NormTopK: true, RoutedScaling: 1}
	defer moe.SetMemoryLimit(moe.SetMemoryLimit(64 << 10))
	_, err = moe.NewRandom(small, kernels.F32, 1) // 8·3·64·64·4 bytes and the router's 2 KiB
	require.EqualError(t, err, "moe: random F32 weights for 8 experts of [64, 64] needs 386.0 KiB, more than the 64.0 KiB of the limit set: over the memory limit")
	if kernels.PacksWeights() { // New's copy of the experts, packed
		mat := func(r, c int) kernels.Matrix {
			m, err := kernels.NewF32(r, c, make([]float32, r*c))
			require.NoError(t, err)
			return m
		}
		w := moe.Weights{Gate: mat(8, 64), Experts: make([]moe.Expert, 8)}
		for e := range w.Experts {
			w.Experts[e] = moe.Expert{Gate: mat(64, 64), Up: mat(64, 64), Down: mat(64, 64)}
		}
		_, err = moe.New(small, w)
		require.EqualError(t, err, "moe: packing the experts of a mixtral layer needs 384.0 KiB, more than the 64.0 KiB of the limit set: over the memory limit")
	}
	moe.SetMemoryLimit(0)
	l, err := moe.NewRandom(small, kernels.F32, 1)
	require.NoError(t, err)
	require.NoError(t, l.Forward(context.Background(), moetest.Input(1, 2, 64, false), make([]float32, 128)))
}

// TestFileCutUnderLayer: a checkpoint file truncated while a loaded layer
// reads it. Where the kernels pack the experts the layer holds copies and
// computes what it did before; where they stay views of the mapping (the
// purego build), the forward pass and CheckWeights fail with ErrFileChanged
// naming the file, and the process does not crash.
func TestFileCutUnderLayer(t *testing.T) {
	dir := t.TempDir()
	m, err := moetest.Generate(moetest.Spec{ModelType: "qwen3_moe", Hidden: 96, Experts: 4, TopK: 2, Inter: 64, NormTopK: true,
		DType: "F32", Seed: 77})
	require.NoError(t, err)
	require.NoError(t, m.WriteTo(dir))
	l, err := moe.Load(dir, 0)
	require.NoError(t, err)
	defer l.Close()
	x := moetest.Input(3, 5, 96, false)
	want := make([]float32, len(x))
	require.NoError(t, l.Forward(context.Background(), x, want))

	path := filepath.Join(dir, "model.safetensors")
	require.NoError(t, os.Truncate(path, 0))
	got := make([]float32, len(x))
	err = l.Forward(context.Background(), x, got)
	cerr := l.CheckWeights(context.Background())
	if kernels.PacksWeights() {
		require.NoError(t, err)
		require.Equal(t, want, got)
		require.NoError(t, cerr)
		return
	}
	for _, err := range []error{err, cerr} {
		require.ErrorIs(t, err, moe.ErrFileChanged)
		require.ErrorContains(t, err, "safetensors: checkpoint file "+path+" was cut short or replaced in place while it was read: its byte ")
	}
}

// TestRouteSplitByExperts: with fewer tokens than the workers' chunks
// (decode), RouteTokens splits the router's logits by experts over the
// workers; every token's experts and weights are those of one worker and
// of Router.Route, bit for bit, with and without a router input scale
// (gemma4), at token counts on both sides of the switch.
func TestRouteSplitByExperts(t *testing.T) {
	for _, spec := range []moetest.Spec{
		{ModelType: "qwen3_moe", Hidden: 96, Experts: 72, TopK: 8, Inter: 16, DType: "BF16", Seed: 91},
		{ModelType: "gemma4", Hidden: 64, Experts: 40, TopK: 4, Inter: 8, DenseInter: 12, DType: "BF16", Seed: 92},
	} {
		t.Run(spec.ModelType, func(t *testing.T) {
			_, dir := writeModel(t, spec)
			l, err := moe.Load(dir, 0)
			require.NoError(t, err)
			defer l.Close()
			for _, T := range []int{1, 3, 16, 17, 40, 80} {
				x := moetest.Input(uint64(T), T, spec.Hidden, false)
				K := spec.TopK
				wantIDs, wantW := make([]int32, T*K), make([]float32, T*K)
				require.NoError(t, l.Router.Route(x, nil, wantIDs, wantW, 0, T))
				for _, workers := range []int{1, 2, 5} {
					l.SetWorkers(workers)
					ids, w := make([]int32, T*K), make([]float32, T*K)
					require.NoError(t, l.RouteTokens(context.Background(), x, nil, ids, w))
					require.Equal(t, wantIDs, ids, "%d tokens, %d workers", T, workers)
					require.Equal(t, wantW, w, "%d tokens, %d workers", T, workers)
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			l.SetWorkers(4)
			require.ErrorIs(t, l.RouteTokens(ctx, moetest.Input(1, 1, spec.Hidden, false), nil, make([]int32, spec.TopK), make([]float32, spec.TopK)), context.Canceled)
		})
	}
}
