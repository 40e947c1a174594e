package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/moex-project/moex/sim"
)

// cmdSim is `moex sim`: the decode model of package sim over presets or a
// config.json, as a table, JSON or a plot.
func cmdSim(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	hwName := fs.String("hardware", "h200", "hardware preset: "+strings.Join(sim.HardwarePresets(), ", "))
	hwFile := fs.String("hardware-file", "", "a JSON file of Hardware fields overriding the preset's (mem_bw, gemm_flops, intra_bw, …)")
	preset := fs.String("preset", "deepseek-v3", "model preset: "+strings.Join(sim.ModelPresets(), ", "))
	dir := fs.String("model", "", "a checkpoint folder (or config.json) instead of --preset: MLA or grouped-query attention")
	layouts := fs.String("layout", "tp,dp-gather,dp-ep", "layouts, comma-separated: tp, dp-gather (DP attention, MoE in gather mode), dp-ep (DP attention, all-to-all EP)")
	ranks := fs.Int("ranks", 8, "ranks (GPUs)")
	input := fs.Int("input", 1024, "prompt tokens of each request")
	output := fs.Int("output", 512, "tokens each request generates")
	batch := fs.Int("batch", 0, "requests decoding at once over all ranks (0: the largest that fits, at most --max-batch)")
	maxBatch := fs.Int("max-batch", 0, "cap on the requests decoding at once (0: none; SGLang's --max-running-requests)")
	wdt := fs.String("weight-dtype", "fp8", "weights: bf16 or fp8")
	kvdt := fs.String("kv-dtype", "bf16", "latent cache: bf16 or fp8")
	ddt := fs.String("dispatch-dtype", "bf16", "all-to-all dispatch activations: bf16 (moex) or fp8 (DeepEP)")
	eplb := fs.Float64("eplb-imbalance", 1, "the busiest rank's expert load over the mean (≥ 1)")
	dpImb := fs.Float64("dp-imbalance", 1, "the busiest DP-attention rank's requests over the mean (≥ 1: stragglers)")
	kvGiB := fs.Float64("kv-budget-gib", 0, "KV cache per rank, GiB (0: the memory the weights leave)")
	intraLat := fs.Float64("intra-latency-us", -1, "a collective's fixed cost within a node, µs (default: the preset's)")
	interLat := fs.Float64("inter-latency-us", -1, "a collective's fixed cost across nodes, µs (default: the preset's)")
	phase := fs.String("phase", "decode", "decode (a step of --batch requests) or prefill (--batch prompts of --input tokens at once: time to first token, prompt tokens/s)")
	oneLayer := fs.Bool("one-layer", false, "the model as moex run runs it: one MoE layer, no dense layer, embedding or lm_head")
	sweep := fs.String("sweep", "", "vary batch, ranks or context (the prompt length) over --values")
	values := fs.String("values", "", "the sweep's values, comma-separated (batch: default powers of two up to what fits)")
	format := fs.String("format", "table", "table or json")
	stages := fs.Bool("stages", false, "table: each step's stages too")
	plotPath := fs.String("plot", "", "draw tokens/s against the sweep's axis per layout to this .png, .svg or .pdf (needs --sweep)")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if *format != "table" && *format != "json" {
		return fmt.Errorf("%w: --format %q: table or json", errUsage, *format)
	}
	var hw sim.Hardware
	var err error
	if strings.EqualFold(*hwName, "cpu") {
		hw, err = sim.CalibrateCPU(*ranks)
	} else {
		hw, err = sim.GPUPreset(*hwName)
	}
	if err != nil {
		return err
	}
	if *hwFile != "" {
		if hw, err = sim.LoadHardware(*hwFile, hw); err != nil {
			return err
		}
	}
	if *intraLat >= 0 {
		hw.IntraLatency = *intraLat * 1e-6
	}
	if *interLat >= 0 {
		hw.InterLatency = *interLat * 1e-6
	}
	var m sim.Model
	if *dir != "" {
		m, err = sim.LoadModel(*dir)
	} else {
		m, err = sim.ModelPreset(*preset)
	}
	if err != nil {
		return err
	}
	if *oneLayer {
		m.Layers, m.DenseLayers, m.Vocab = 1, 0, 0
	}
	var ls []sim.Layout
	for f := range strings.SplitSeq(*layouts, ",") {
		l, err := sim.ParseLayout(strings.TrimSpace(f))
		if err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		ls = append(ls, l)
	}
	d := sim.Deployment{Model: m, Hardware: hw, Ranks: *ranks, WeightDType: *wdt, KVDType: *kvdt, DispatchDType: *ddt,
		EPLBImbalance: *eplb, DPImbalance: *dpImb, KVBudget: *kvGiB * (1 << 30), Layout: ls[0]}
	if err := d.Validate(); err != nil {
		return err
	}
	w := sim.Workload{Input: *input, Output: *output, Batch: *batch, MaxBatch: *maxBatch, Prefill: *phase == "prefill"}
	if *phase != "decode" && *phase != "prefill" {
		return fmt.Errorf("%w: --phase %q: decode or prefill", errUsage, *phase)
	}
	axis := sim.AxisBatch
	var vals []int
	switch {
	case *sweep != "":
		if axis, err = sim.ParseAxis(*sweep); err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		if *values != "" {
			if vals, err = intList(*values, "--values"); err != nil {
				return err
			}
		}
		if len(vals) == 0 {
			if axis != sim.AxisBatch {
				return fmt.Errorf("%w: --sweep %s needs --values", errUsage, axis)
			}
			vals = sim.BatchValues(d, w, ls)
			if len(vals) == 0 {
				// Not one layout fits: say why, from the first.
				_, err := d.MaxBatch(w)
				return err
			}
		}
	case *plotPath != "":
		return fmt.Errorf("%w: --plot needs --sweep", errUsage)
	default:
		vals = []int{*batch}
	}
	points, err := sim.Sweep(d, w, ls, axis, vals)
	if err != nil {
		return err
	}
	if *sweep == "" {
		for _, p := range points {
			if p.Result == nil && len(ls) == 1 {
				return fmt.Errorf("%s", p.Err)
			}
		}
	}
	if *plotPath != "" {
		title := fmt.Sprintf("%s on %d × %s, %s weights, %d in / %d out", m.Name, *ranks, hw.Name, *wdt, *input, *output)
		if axis == sim.AxisRanks {
			title = fmt.Sprintf("%s on %s, %s weights, %d in / %d out", m.Name, hw.Name, *wdt, *input, *output)
		}
		if err := sim.Plot(points, axis, title, *plotPath); err != nil {
			return err
		}
	}
	if *format == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Model    sim.Model    `json:"model"`
			Hardware sim.Hardware `json:"hardware"`
			Axis     sim.Axis     `json:"axis"`
			Points   []sim.Point  `json:"points"`
		}{m, hw, axis, points})
	}
	fmt.Fprintf(stdout, "moex sim: %s %s (%.0fB parameters, %s weights, %s latent cache) on %s, %d in / %d out tokens a request\n",
		*phase, m.Name, m.Params()/1e9, *wdt, *kvdt, hw.Name, *input, *output)
	tw := tabwriter.NewWriter(stdout, 2, 0, 2, ' ', tabwriter.AlignRight)
	stepCol, tputCol := "step ms", "tokens/s"
	if w.Prefill {
		stepCol, tputCol = "prefill ms", "prompt tokens/s"
	}
	fmt.Fprintf(tw, "layout\tranks\tbatch\trank batch\tfits\tweights GB/rank\tKV GB/rank\t%s\t%s\tidle %%\t\n", stepCol, tputCol)
	for _, p := range points {
		if p.Result == nil {
			fmt.Fprintf(tw, "%s\t%s\t\t\t\t\t\t\t\t\t  %s\n", p.Layout, label(axis, p.X, *ranks), p.Err)
			continue
		}
		r := p.Result
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%.1f\t%.1f\t%.2f\t%.0f\t%.1f\t\n", r.Layout, r.Ranks, r.Batch, r.RankBatch, r.MaxBatch,
			r.WeightBytes/1e9, r.KVBytes/1e9, r.Step*1e3, r.TokensPerSec, 100*r.IdleFraction)
		if *stages {
			for _, s := range r.Stages {
				fmt.Fprintf(tw, "\t\t\t\t\t\t%s\t%.3f\t%s\t\t\n", s.Name, s.Seconds*1e3, s.Bound)
			}
		}
	}
	tw.Flush()
	fmt.Fprintln(stdout, "figures and their sources:")
	for _, s := range hw.Sources {
		fmt.Fprintln(stdout, "  "+s)
	}
	if *plotPath != "" {
		fmt.Fprintf(stdout, "plot: %s\n", *plotPath)
	}
	return nil
}

func label(axis sim.Axis, x, ranks int) string {
	if axis == sim.AxisRanks {
		return strconv.Itoa(x)
	}
	return strconv.Itoa(ranks)
}
