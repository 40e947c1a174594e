package decoderun

import (
	"context"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/dpattn"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
	"github.com/moex-project/moex/sim"
)

// TestCalibration: sim's cpu preset, measured by its probes on this
// machine, predicts the step time of moex run's ranks (the sum of a rank's
// stages: each rank's wall time a step) within ±25 %, for DP attention with
// the MoE in all-to-all and in gather mode and for TP attention, at three
// shapes of two ranks with long contexts. The probes run right before each
// shape's runs, and each mode's time is the median of three runs, against
// this machine's drift. It times, so it runs alone: `make test` runs it
// after the other tests with MOEX_CALIBRATE=1; without it, it skips.
//
// Stage by stage the model is not compared: two ranks on two cores
// interleave their phases (a rank's attention runs faster while the other
// waits in a collective, whose column then holds that wait), so only the
// step is a quantity both sides share. The model also leaves out per-step
// fixed costs, ~15 ms a step here at 4 requests of 512 tokens a rank,
// where it predicts ~0.6 of the step; the shapes are those where the
// latent cache and the experts dominate.
func TestCalibration(t *testing.T) {
	if os.Getenv("MOEX_CALIBRATE") == "" {
		t.Skip("times the machine: run alone, as make test does, with MOEX_CALIBRATE=1")
	}
	ctx := context.Background()
	layer, err := moe.NewRandom(moe.DeepSeekV2Lite(), kernels.BF16, 1)
	require.NoError(t, err)
	defer layer.Close()
	attn, err := dpattn.NewRandomMLABlock(dpattn.DeepSeekV2LiteAttention(), kernels.BF16, 1)
	require.NoError(t, err)
	defer attn.Close()
	const R, steps = 2, 6
	m, err := sim.ModelPreset("deepseek-v2-lite")
	require.NoError(t, err)
	m.Layers, m.DenseLayers, m.Vocab = 1, 0, 0 // moex run's one layer
	type shape struct{ batch, context int }
	type mode struct {
		attn, moe string
		layout    sim.Layout
	}
	// ratio runs one shape and mode: the model's step over the median of
	// three measured ones.
	ratio := func(hw sim.Hardware, sh shape, md mode) float64 {
		cfg := Config{Ranks: R, Steps: 1, Batch: sh.batch, Context: sh.context, AttnMode: md.attn, MoEMode: md.moe,
			Seed: 1, MoE: layer, Attn: attn, CacheDType: kernels.BF16}
		_, err := Run(ctx, cfg) // warm
		require.NoError(t, err)
		cfg.Steps = steps
		var measured []float64
		var stages [4]float64 // attention, MoE experts, collectives, plan: the last run's, for the log
		for range 3 {
			rep, err := Run(ctx, cfg)
			require.NoError(t, err)
			step := 0.0
			for _, rt := range rep.Ranks {
				step += (rt.Plan + rt.Attention + rt.Gather + rt.MoE + rt.Scatter).Seconds() / R / steps
				stages = [4]float64{rt.Attention.Seconds() / steps, rt.MoE.Seconds() / steps, (rt.Gather + rt.Scatter).Seconds() / steps, rt.Plan.Seconds() / steps}
			}
			measured = append(measured, step)
		}
		slices.Sort(measured)
		got := measured[1]
		d := sim.Deployment{Model: m, Hardware: hw, Layout: md.layout, Ranks: R, WeightDType: "bf16", KVDType: "bf16",
			DispatchDType: "bf16", EPLBImbalance: 1, DPImbalance: 1}
		res, err := d.Decode(sim.Workload{Input: sh.context, Output: 2 * steps, Batch: R * sh.batch})
		require.NoError(t, err)
		t.Logf("  %s attention, %-8s MoE: step %.1f ms measured (runs %.1f–%.1f), %.1f predicted: %.2f; last run's rank 1: attention %.1f, experts %.1f, collectives %.1f, plan %.1f ms; predicted %s",
			md.attn, md.moe, got*1e3, measured[0]*1e3, measured[2]*1e3, res.Step*1e3, res.Step/got,
			stages[0]*1e3, stages[1]*1e3, stages[2]*1e3, stages[3]*1e3, stageList(res.Stages))
		return res.Step / got
	}
	probe := func(sh shape) sim.Hardware {
		p, err := sim.ProbeCPU(ctx)
		require.NoError(t, err)
		hw := p.Hardware(R)
		t.Logf("%d requests of %d tokens a rank: %s", sh.batch, sh.context, hw.Sources[0])
		runtime.GC() // the probe's gigabyte of weights, gone before the clock runs
		return hw
	}
	for _, sh := range []shape{{8, 2048}, {16, 1024}, {2, 4096}} {
		hw := probe(sh)
		for _, md := range []mode{{"dp", "alltoall", sim.DPEP}, {"dp", "gather", sim.DPGather}, {"tp", "gather", sim.TP}} {
			r := ratio(hw, sh, md)
			if math.Abs(r-1) > 0.25 {
				// This machine drifts 15–30 % over minutes: once more, probes
				// and runs afresh, before calling it a miss.
				t.Logf("  outside ±25 %%: probing and measuring again")
				r = ratio(probe(sh), sh, md)
			}
			require.InDelta(t, 1, r, 0.25, "%s/%s at %d × %d tokens: predicted over measured step", md.attn, md.moe, sh.batch, sh.context)
		}
	}
}

func stageList(st []sim.Stage) string {
	s := ""
	for i, x := range st {
		if i > 0 {
			s += ", "
		}
		s += x.Name + " " + strconv.FormatFloat(x.Seconds*1e3, 'f', 1, 64)
	}
	return s
}
