package decoderun

import (
	"context"
	"os"
	"runtime"
	"slices"
	"strconv"
	"testing"

	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
	"github.com/moex-project/moex/sim"
)

// BenchmarkCalibration reports how well sim's cpu preset, measured by its
// probes on this machine, predicts the step time of moex run's ranks (the
// sum of a rank's stages: each rank's wall time a step), for DP attention
// with the MoE in all-to-all and in gather mode and for TP attention, at
// three shapes of two ranks with long contexts. Each metric
// "pred/meas-<attn>-<moe>-<batch>x<context>" is the predicted step over the
// median of three measured ones; the probes run right before each shape's
// runs. It times the machine, so it is a benchmark, not a test: its ratios
// move with the machine's load. `make calibrate` runs it whole
// (MOEX_CALIBRATE=1); without that variable it runs one small shape once,
// so that the code path stays exercised by the benchmarks' one-pass run.
//
// Stage by stage the model is not compared: two ranks on two cores
// interleave their phases (a rank's attention runs faster while the other
// waits in a collective, whose column then holds that wait), so only the
// step is a quantity both sides share. The model also leaves out per-step
// fixed costs, ~15 ms a step here at 4 requests of 512 tokens a rank,
// where it predicts ~0.6 of the step; the shapes are those where the
// latent cache and the experts dominate.
func BenchmarkCalibration(b *testing.B) {
	ctx := context.Background()
	full := os.Getenv("MOEX_CALIBRATE") != ""
	layer, err := moe.NewRandom(moe.DeepSeekV2Lite(), kernels.BF16, 1)
	if err != nil {
		b.Fatal(err)
	}
	defer layer.Close()
	attn, err := attn.NewRandomMLABlock(attn.DeepSeekV2LiteAttention(), kernels.BF16, 1)
	if err != nil {
		b.Fatal(err)
	}
	defer attn.Close()
	const R = 2
	steps, runs := 6, 3
	m, err := sim.ModelPreset("deepseek-v2-lite")
	if err != nil {
		b.Fatal(err)
	}
	m.Layers, m.DenseLayers, m.Vocab = 1, 0, 0 // moex run's one layer
	type shape struct{ batch, context int }
	type mode struct {
		attn, moe string
		layout    sim.Layout
	}
	shapes := []shape{{8, 2048}, {16, 1024}, {2, 4096}}
	modes := []mode{{"dp", "alltoall", sim.DPEP}, {"dp", "gather", sim.DPGather}, {"tp", "gather", sim.TP}}
	if !full {
		shapes, modes, steps, runs = []shape{{2, 256}}, modes[:1], 1, 1
	}
	// ratio runs one shape and mode: the model's step over the median of
	// the measured ones.
	ratio := func(hw sim.Hardware, sh shape, md mode) float64 {
		cfg := Config{Ranks: R, Steps: 1, Batch: sh.batch, Context: sh.context, AttnMode: md.attn, MoEMode: md.moe,
			Seed: 1, MoE: layer, Attn: attn, CacheDType: kernels.BF16}
		if _, err := Run(ctx, cfg); err != nil { // warm
			b.Fatal(err)
		}
		cfg.Steps = steps
		var measured []float64
		var stages [4]float64 // attention, MoE experts, collectives, plan: the last run's, for the log
		for range runs {
			rep, err := Run(ctx, cfg)
			if err != nil {
				b.Fatal(err)
			}
			step := 0.0
			for _, rt := range rep.Ranks {
				step += (rt.Plan + rt.Attention + rt.Gather + rt.MoE + rt.Scatter).Seconds() / R / float64(steps)
				stages = [4]float64{rt.Attention.Seconds() / float64(steps), rt.MoE.Seconds() / float64(steps),
					(rt.Gather + rt.Scatter).Seconds() / float64(steps), rt.Plan.Seconds() / float64(steps)}
			}
			measured = append(measured, step)
		}
		slices.Sort(measured)
		got := measured[len(measured)/2]
		d := sim.Deployment{Model: m, Hardware: hw, Layout: md.layout, Ranks: R, WeightDType: "bf16", KVDType: "bf16",
			DispatchDType: "bf16", EPLBImbalance: 1, DPImbalance: 1}
		res, err := d.Decode(sim.Workload{Input: sh.context, Output: 2 * steps, Batch: R * sh.batch})
		if err != nil {
			b.Fatal(err)
		}
		b.Logf("  %s attention, %-8s MoE: step %.1f ms measured (runs %.1f–%.1f), %.1f predicted: %.2f; last run's rank 1: attention %.1f, experts %.1f, collectives %.1f, plan %.1f ms; predicted %s",
			md.attn, md.moe, got*1e3, measured[0]*1e3, measured[len(measured)-1]*1e3, res.Step*1e3, res.Step/got,
			stages[0]*1e3, stages[1]*1e3, stages[2]*1e3, stages[3]*1e3, stageList(res.Stages))
		return res.Step / got
	}
	probe := func(sh shape) sim.Hardware {
		p, err := sim.ProbeCPU(ctx)
		if err != nil {
			b.Fatal(err)
		}
		hw := p.Hardware(R)
		b.Logf("%d requests of %d tokens a rank: %s", sh.batch, sh.context, hw.Sources[0])
		runtime.GC() // the probe's gigabyte of weights, gone before the clock runs
		return hw
	}
	b.ResetTimer()
	for range b.N {
		for _, sh := range shapes {
			hw := probe(sh)
			for _, md := range modes {
				r := ratio(hw, sh, md)
				b.ReportMetric(r, "pred/meas-"+md.attn+"-"+md.moe+"-"+strconv.Itoa(sh.batch)+"x"+strconv.Itoa(sh.context))
			}
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
