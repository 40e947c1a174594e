package dpattn_test

import (
	"context"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/moex-project/moex/dpattn"
	"github.com/moex-project/moex/ep"
	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// onRanks runs f on n in-process ranks at once and returns their errors.
func onRanks(t *testing.T, n int, f func(c ep.Comm) error) []error {
	t.Helper()
	errs, err := ep.RunLocal(n, f)
	require.NoError(t, err)
	return errs
}

func TestPlanSemantics(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name    string
		tokens  []int
		modes   []dpattn.Mode
		skip    bool
		idle    []bool
		offsets []int
		graphOK bool
	}{
		{"decode with an idle rank", []int{2, 0, 5}, []dpattn.Mode{dpattn.Decode, dpattn.Decode, dpattn.Decode}, false, []bool{false, true, false}, []int{0, 2, 2}, true},
		{"an idle rank votes for the graph even in extend", []int{3, 0, 1}, []dpattn.Mode{dpattn.Decode, dpattn.Extend, dpattn.Decode}, false, []bool{false, true, false}, []int{0, 3, 3}, true},
		{"one extending rank forbids the graph", []int{3, 4, 1}, []dpattn.Mode{dpattn.Decode, dpattn.Extend, dpattn.Decode}, false, []bool{false, false, false}, []int{0, 3, 7}, false},
		{"nobody has work: all skip", []int{0, 0, 0}, []dpattn.Mode{dpattn.Decode, dpattn.Extend, dpattn.Decode}, true, []bool{false, false, false}, []int{0, 0, 0}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plans := make([]*dpattn.StepPlan, 3)
			errs := onRanks(t, 3, func(c ep.Comm) error {
				p, err := dpattn.NewCoordinator(c).Plan(ctx, tt.tokens[c.Rank()], tt.modes[c.Rank()])
				plans[c.Rank()] = p
				return err
			})
			for r, p := range plans {
				require.NoError(t, errs[r])
				require.Equal(t, []int64{int64(tt.tokens[0]), int64(tt.tokens[1]), int64(tt.tokens[2])}, p.Counts)
				require.Equal(t, tt.skip, p.Skip)
				require.Equal(t, tt.idle[r], p.Idle, "rank %d idle", r)
				require.Equal(t, tt.offsets[r], p.Offset, "rank %d offset", r)
				require.Equal(t, tt.graphOK, p.GraphOK)
			}
		})
	}
}

// layerFixture writes a small DeepSeek-V2 checkpoint and returns it with
// its single-rank outputs for x.
func layerFixture(t *testing.T) (string, moetest.Spec) {
	t.Helper()
	spec := moetest.LayerFixture
	m, err := moetest.Generate(spec)
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), "ckpt")
	require.NoError(t, m.WriteTo(dir))
	return dir, spec
}

// TestIdleBatchPreventsHang: a rank without tokens that skips the MoE step
// leaves the others waiting until the deadline; with the plan's IDLE batch
// (Forward on zero tokens) the step completes.
func TestIdleBatchPreventsHang(t *testing.T) {
	dir, spec := layerFixture(t)
	H := spec.Hidden
	x := moetest.Input(5, 7, H, false)
	tokens := []int{4, 0, 3}
	off := []int{0, 4, 4}
	run := func(skipIdle bool, timeout time.Duration) ([]error, []float32) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		y := make([]float32, len(x))
		place, err := ep.Contiguous(spec.Experts, 3)
		require.NoError(t, err)
		errs := onRanks(t, 3, func(c ep.Comm) error {
			l, err := ep.Load(dir, 0, c, place)
			if err != nil {
				return err
			}
			defer l.Close()
			plan, err := dpattn.NewCoordinator(c).Plan(ctx, tokens[c.Rank()], dpattn.Decode)
			if err != nil {
				return err
			}
			if plan.Skip || (plan.Idle && skipIdle) {
				return nil
			}
			lo, hi := off[c.Rank()]*H, (off[c.Rank()]+tokens[c.Rank()])*H
			return l.Forward(ctx, x[lo:hi], y[lo:hi])
		})
		return errs, y
	}
	errs, _ := run(true, 300*time.Millisecond)
	require.ErrorContains(t, errs[0], "ranks [1] did not arrive")
	require.ErrorIs(t, errs[0], context.DeadlineExceeded)

	errs, y := run(false, 30*time.Second)
	for _, err := range errs {
		require.NoError(t, err)
	}
	single, err := moe.Load(dir, 0)
	require.NoError(t, err)
	defer single.Close()
	want := make([]float32, len(x))
	require.NoError(t, single.Forward(context.Background(), x, want))
	require.Equal(t, want, y, "all-to-all mode equals one rank bit for bit")
}

// TestGatherMode: gather mode matches one rank to 1e-6 and repeats its bits,
// for a plain layer, a block that owns its norms (gemma4) and a layer that
// routes by token id (deepseek_v4's hash layer).
func TestGatherMode(t *testing.T) {
	for _, spec := range []moetest.Spec{
		moetest.LayerFixture,
		{ModelType: "gemma4", Hidden: 32, Experts: 8, TopK: 3, Inter: 16, DenseInter: 20, DType: "BF16", Seed: 91},
		{ModelType: "deepseek_v4", Hidden: 32, Experts: 8, TopK: 3, Inter: 16, SharedExperts: 1, Scaling: 1.5, NumLayers: 2,
			HashLayers: 1, Vocab: 30, DType: "BF16", Seed: 92},
	} {
		t.Run(spec.ModelType, func(t *testing.T) {
			m, err := moetest.Generate(spec)
			require.NoError(t, err)
			dir := filepath.Join(t.TempDir(), "ckpt")
			require.NoError(t, m.WriteTo(dir))
			testGatherMode(t, dir, spec)
		})
	}
}

func testGatherMode(t *testing.T, dir string, spec moetest.Spec) {
	H := spec.Hidden
	x := moetest.Input(6, 9, H, false)
	var ids []int32
	if spec.Hash() {
		ids = moetest.Tokens(6, 9, spec.Vocab)
	}
	single, err := moe.Load(dir, spec.Layer)
	require.NoError(t, err)
	defer single.Close()
	want := make([]float32, len(x))
	require.NoError(t, single.ForwardTokens(context.Background(), x, ids, want, nil, nil))
	for _, R := range []int{1, 2, 3, 4} {
		place, err := ep.Contiguous(spec.Experts, R)
		require.NoError(t, err)
		tokens := make([]int, R)
		for i := range tokens {
			tokens[i] = (9 * (i + 1) / R) - (9 * i / R)
		}
		if R == 4 { // make one rank idle
			tokens = []int{5, 0, 3, 1}
		}
		var runs [2][]float32
		for k := range runs {
			y := make([]float32, len(x))
			errs := onRanks(t, R, func(c ep.Comm) error {
				ck, err := moe.OpenCheckpoint(dir)
				if err != nil {
					return err
				}
				defer ck.Close()
				mine := map[int]bool{}
				for _, e := range place.Local(c.Rank()) {
					mine[e] = true
				}
				shard, err := moe.LoadSubset(ck, spec.Layer, func(e int) bool { return mine[e] })
				if err != nil {
					return err
				}
				plan, err := dpattn.NewCoordinator(c).Plan(context.Background(), tokens[c.Rank()], dpattn.Decode)
				if err != nil {
					return err
				}
				lo, hi := plan.Offset*H, (plan.Offset+plan.Tokens)*H
				var tok []int32
				if ids != nil {
					tok = ids[plan.Offset : plan.Offset+plan.Tokens]
				}
				return dpattn.MoEGatherTokens(context.Background(), c, shard, plan, x[lo:hi], tok, y[lo:hi], nil)
			})
			for _, err := range errs {
				require.NoError(t, err)
			}
			runs[k] = y
		}
		require.Equal(t, runs[0], runs[1], "gather mode repeats its bits (R=%d)", R)
		var n, d float64
		for i := range want {
			e := float64(runs[0][i] - want[i])
			n += e * e
			d += float64(want[i]) * float64(want[i])
		}
		require.LessOrEqual(t, math.Sqrt(n/d), 1e-6, "R=%d", R)
	}
}

func TestPlanBadInput(t *testing.T) {
	errs := onRanks(t, 1, func(c ep.Comm) error {
		_, err := dpattn.NewCoordinator(c).Plan(context.Background(), -1, dpattn.Decode)
		return err
	})
	require.ErrorContains(t, errs[0], "plan: -1 tokens")
	errs = onRanks(t, 1, func(c ep.Comm) error {
		_, err := dpattn.NewCoordinator(c).Plan(context.Background(), 1, dpattn.Mode(9))
		return err
	})
	require.ErrorContains(t, errs[0], "unknown mode 9")
	// A plan whose total disagrees with its counts: an error, not a panic.
	l, err := moe.NewRandom(&moe.Config{ModelType: "mixtral", Hidden: 4, NumExperts: 2, TopK: 1, Inter: 4, Scoring: moe.Softmax,
		Method: moe.Greedy, NormTopK: true, RoutedScaling: 1}, kernels.F32, 1)
	require.NoError(t, err)
	errs = onRanks(t, 1, func(c ep.Comm) error {
		return dpattn.MoEGather(context.Background(), c, l, &dpattn.StepPlan{Counts: []int64{1}, Tokens: 1}, make([]float32, 4),
			make([]float32, 4), nil)
	})
	require.ErrorContains(t, errs[0], "dpattn: gather: the plan's counts [1] (total 0) for 1 ranks")
}
