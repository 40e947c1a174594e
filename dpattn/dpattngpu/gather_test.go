//go:build cudaemu && !cuda

package dpattngpu_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/dpattn"
	"github.com/moex-project/moex/dpattn/dpattngpu"
	"github.com/moex-project/moex/ep"
	"github.com/moex-project/moex/ep/epgpu"
	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/moe"
	"github.com/moex-project/moex/moe/moegpu"
)

// TestGatherMoEOnEmulation: gather mode's MoE stage on the (emulated)
// devices of three ranks, the collectives between their buffers, against
// the whole layer on the CPU over every rank's tokens; replayed graphs
// (collectives inside) give the eager bits, for several token counts, an
// IDLE rank among them; a communicator that stages through the host runs
// eagerly with the same bits, and so do all ranks when one rank's capture
// fails. (The emulation is slow: small shapes, and the graphs on one model
// only.)
func TestGatherMoEOnEmulation(t *testing.T) {
	specs := []moetest.Spec{
		{ModelType: "deepseek_v2", Hidden: 64, Experts: 8, TopK: 3, Inter: 32, SharedExperts: 1, Method: "greedy",
			Scoring: "softmax", Scaling: 1, DType: "BF16", Seed: 21},
		{ModelType: "qwen2_moe", Hidden: 32, Experts: 6, TopK: 2, Inter: 16, SharedInter: 32, NormTopK: true, DType: "BF16", Seed: 22},
	}
	// Buckets of 4, 1, 4, 1, 4 rows per rank: with graphs, each bucket runs
	// eagerly once, then is captured and replays (steps 2, 3, 4).
	steps := [][]int64{{3, 0, 2}, {1, 1, 0}, {4, 1, 3}, {1, 0, 1}, {2, 3, 0}}
	const R = 3
	for i, spec := range specs {
		t.Run(spec.ModelType, func(t *testing.T) {
			m, err := moetest.Generate(spec)
			require.NoError(t, err)
			dir := filepath.Join(t.TempDir(), "ckpt")
			require.NoError(t, m.WriteTo(dir))
			l, err := moe.Load(dir, 0)
			require.NoError(t, err)
			defer l.Close()
			H := spec.Hidden
			place, err := ep.Contiguous(spec.Experts, R)
			require.NoError(t, err)
			// Every step's tokens, rounded to bf16 as the device rounds them.
			inputs := make([][]float32, len(steps))
			for st, counts := range steps {
				total := 0
				for _, n := range counts {
					total += int(n)
				}
				inputs[st] = moetest.Input(uint64(st+1), total, H, false)
				for i, v := range inputs[st] {
					inputs[st][i] = half.BF16ToF32(half.F32ToBF16(v))
				}
			}
			dev := cuda.NewEmu()
			// run gives every step's outputs, in rank order, of R ranks
			// with comms made by mk.
			run := func(graphs bool, mk func(c ep.Comm) (cuda.Launcher, epgpu.DeviceComm)) ([][]float32, []int, []error) {
				outs := make([][][]float32, R)
				replays := make([]int, R)
				captureErrs := make([]error, R)
				errs, err := ep.RunLocal(R, func(c ep.Comm) error {
					r := c.Rank()
					mine := map[int]bool{}
					for _, e := range place.Local(r) {
						mine[e] = true
					}
					l2, dc := mk(c)
					g, err := dpattngpu.NewGatherMoE(l2, l.Subset(func(e int) bool { return mine[e] }), dc)
					if err != nil {
						return err
					}
					defer g.Close()
					if graphs {
						g.EnableGraphs()
						g.AllowGraph(true)
					}
					for st, counts := range steps {
						off := 0
						for q := 0; q < r; q++ {
							off += int(counts[q])
						}
						n := int(counts[r])
						plan := &dpattn.StepPlan{Counts: counts, Offset: off, Tokens: n, Idle: n == 0}
						y := make([]float32, n*H)
						if err := g.Forward(context.Background(), plan, inputs[st][off*H:(off+n)*H], y, nil); err != nil {
							return err
						}
						outs[r] = append(outs[r], y)
					}
					replays[r], captureErrs[r] = g.GraphReplays(), g.CaptureErr()
					return nil
				})
				require.NoError(t, err)
				for _, e := range errs {
					require.NoError(t, e)
				}
				all := make([][]float32, len(steps))
				for st := range steps {
					for r := 0; r < R; r++ {
						all[st] = append(all[st], outs[r][st]...)
					}
				}
				return all, replays, captureErrs
			}
			emu := func(c ep.Comm) (cuda.Launcher, epgpu.DeviceComm) {
				return dev, epgpu.NewEmuComm(dev, c)
			}
			eager, replays, _ := run(false, emu)
			require.Equal(t, []int{0, 0, 0}, replays)
			for st, x := range inputs {
				want := make([]float32, len(x))
				require.NoError(t, l.Forward(context.Background(), x, want))
				ref := make([]float64, len(want))
				for i, v := range want {
					ref[i] = float64(v)
				}
				e := moetest.RelErr(eager[st], ref)
				t.Logf("step %d, counts %v: relative error %.2e against the whole layer on the CPU", st, steps[st], e)
				require.LessOrEqual(t, e, 1e-2)
			}
			if i > 0 {
				return
			}
			graphed, replays, errs := run(true, emu)
			require.Equal(t, []int{3, 3, 3}, replays, "each bucket's first step runs eagerly, the later ones replay")
			require.Equal(t, []error{nil, nil, nil}, errs)
			require.Equal(t, eager, graphed, "a replay gives the eager bits")
			staged, replays, errs := run(true, func(c ep.Comm) (cuda.Launcher, epgpu.DeviceComm) {
				return dev, epgpu.NewStagedComm(dev, c)
			})
			require.Equal(t, []int{0, 0, 0}, replays, "collectives staged through the host are not captured")
			require.ErrorContains(t, errs[0], "cannot be captured in a graph")
			require.Equal(t, eager, staged)
			tries := 0
			oneFails, replays, errs := run(true, func(c ep.Comm) (cuda.Launcher, epgpu.DeviceComm) {
				if c.Rank() == 1 {
					return noGraphs{Launcher: dev, tries: &tries}, epgpu.NewEmuComm(dev, c)
				}
				return dev, epgpu.NewEmuComm(dev, c)
			})
			require.Equal(t, []int{0, 0, 0}, replays, "a capture that failed on one rank leaves every rank eager")
			require.NoError(t, errs[0])
			require.ErrorContains(t, errs[1], "no graphs here")
			require.Equal(t, 2, tries, "each bucket (4 and 1 rows) is tried once, not again after failing")
			require.Equal(t, eager, oneFails)
		})
	}

	m, err := moetest.Generate(specs[0])
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), "ckpt")
	require.NoError(t, m.WriteTo(dir))
	l, err := moe.Load(dir, 0)
	require.NoError(t, err)
	defer l.Close()
	dev := cuda.NewEmu()
	_, err = dpattngpu.NewGatherMoE(dev, l.Subset(func(e int) bool { return e == 1 || e == 3 }), nil)
	require.EqualError(t, err, "cuda: moe: the layer holds experts 1 and 3 but not those between (a device shard is contiguous)")
	shard, err := moegpu.NewMoE(dev, l.Subset(func(e int) bool { return e >= 4 }))
	require.NoError(t, err)
	defer shard.Close()
	require.EqualError(t, shard.Forward(context.Background(), make([]float32, 64), make([]float32, 64)),
		"cuda: moe: the layer holds experts 4…7 of 8: a shard runs in a partial Stage (gather mode)")
	errs, err := ep.RunLocal(2, func(c ep.Comm) error {
		g, err := dpattngpu.NewGatherMoE(dev, l.Subset(func(e int) bool { return e/4 == c.Rank() }), epgpu.NewEmuComm(dev, c))
		if err != nil {
			return err
		}
		defer g.Close()
		return g.Forward(context.Background(), &dpattn.StepPlan{Counts: []int64{1, 2, 3}}, nil, nil, nil)
	})
	require.NoError(t, err)
	require.EqualError(t, errs[0], "cuda: gather step: the plan has 3 ranks, the communicator 2")
}
