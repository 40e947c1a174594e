package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/model"
)

// modelResult is one case of bench model: pp (a prompt of Tokens from an
// empty cache) or tg (Tokens single-token steps right after it), the median
// of the rounds.
type modelResult struct {
	Case      string  `json:"case"` // pp512, tg128
	Model     string  `json:"model"`
	Dtype     string  `json:"dtype"`
	Numerics  string  `json:"numerics"`
	KV        string  `json:"kv"`
	Threads   int     `json:"threads"`
	Batch     int     `json:"batch"` // sequences decoded together
	Tokens    int     `json:"tokens"`
	Rounds    int     `json:"rounds"`
	MedianNS  int64   `json:"median_ns"`    // the prompts' time, or a step's
	TokensSec float64 `json:"tokens_per_s"` // of all the batch's sequences
	// tg of one sequence: the weight bytes a step reads, their rate, and
	// the fraction of the read-bandwidth probe measured in the same run.
	Bytes      int64   `json:"bytes,omitempty"`
	GBPS       float64 `json:"gbps,omitempty"`
	ProbeGBPS  float64 `json:"probe_gbps,omitempty"`
	BWFraction float64 `json:"bw_fraction,omitempty"`
	// The parts of a token's time, over every round: attention blocks,
	// MLPs (MoE or dense), the final norm and output projection.
	AttnNS int64 `json:"attention_ns"`
	MLPNS  int64 `json:"mlp_ns"`
	HeadNS int64 `json:"head_ns"`
}

// modelPresets are bench model's built-in shapes (random weights): a
// preset of n layers, and the model's own count.
var modelPresets = map[string]struct {
	make   func(layers int) model.Preset
	layers int
}{
	"tiny": {func(n int) model.Preset {
		p := model.Tiny()
		p.Layers, p.FirstKDense = n, min(p.FirstKDense, n-1)
		return p
	}, 3},
	"deepseek-v2-lite": {model.DeepSeekV2Lite, 27},
	"qwen3-30b-a3b":    {model.Qwen3_30B_A3B, 48},
	"gpt-oss-20b":      {model.GptOss20B, 24},
}

// benchModel times a whole model as llama-bench does: pp, the prompt
// processing rate of one prompt from an empty cache, and tg, the
// generation rate of single-token steps right after it (greedy, no stop).
// With --batch B, B sequences of their own prompts: pp their prompts in
// one forward pass, tg steps of one token each, the rates those of all
// B (llama-batched-bench's S_PP and S_TG).
func benchModel(args []string, stdout io.Writer, o *benchOpts) error {
	fs := flag.NewFlagSet("bench model", flag.ContinueOnError)
	path := fs.String("model", "", "checkpoint folder or .gguf file of a model moex runs whole")
	preset := fs.String("preset", "", "built-in shape with random weights: tiny, deepseek-v2-lite, qwen3-30b-a3b, gpt-oss-20b")
	layers := fs.Int("layers", 0, "--preset's layers (0: the model's own count); fewer cut the depth and the memory")
	dtype := fs.String("dtype", "bf16", "--preset's experts: bf16, f32, fp8, mxfp4, q4_k_m (uint4), q4_0 (int4), q8_0 (int8); attention and embeddings stay bf16")
	prompt := fs.Int("p", 512, "prompt tokens (pp); 0: none")
	gen := fs.Int("n", 128, "generated tokens (tg), single-token steps after the prompt; 0: none")
	kvName := fs.String("kv", "bf16", "KV cache dtype: bf16, f16 (llama.cpp's default) or f32")
	numerics := fs.String("numerics", "exact", "the experts' numerics mode: exact or int8dot (quantized experts)")
	threads := fs.Int("threads", runtime.GOMAXPROCS(0), "goroutines (GOMAXPROCS for the run)")
	rounds := fs.Int("rounds", 3, "rounds of pp then tg, each on a fresh cache; the median is reported")
	seed := fs.Uint64("seed", 1, "seed of random weights and tokens")
	batch := fs.Int("batch", 1, "sequences decoded together, each after a prompt of its own (tg steps of one token a sequence)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the timed rounds (pp and tg) to this file, for go tool pprof")
	finish := o.registerCommon(fs, "bench model")
	if err := parseFlags(fs, args, o.stderr); err != nil {
		return err
	}
	if err := finish(); err != nil {
		return err
	}
	switch {
	case (*path == "") == (*preset == ""):
		return fmt.Errorf("%w: bench model: give --model or --preset", errUsage)
	case *prompt < 0 || *gen < 0 || *prompt+*gen == 0:
		return fmt.Errorf("%w: bench model: -p %d and -n %d: want tokens to time", errUsage, *prompt, *gen)
	case *rounds < 1:
		return fmt.Errorf("%w: bench model: --rounds %d must be positive", errUsage, *rounds)
	case *batch < 1 || *batch > 256:
		return fmt.Errorf("%w: bench model: --batch %d: want 1 to 256 sequences", errUsage, *batch)
	case *threads < 1 || *threads > maxGoroutineRanks:
		return fmt.Errorf("%w: bench model: --threads %d", errUsage, *threads)
	}
	kvDType, err := kvDTypeOf(*kvName)
	if err != nil {
		return fmt.Errorf("%w: bench model: --kv %w", errUsage, err)
	}
	mode, err := kernels.ParseNumerics(*numerics)
	if err != nil {
		return fmt.Errorf("%w: bench model: %w", errUsage, err)
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(*threads))
	var m *model.Model
	name, dtypeName := *path, "as stored"
	if *preset != "" {
		ps, ok := modelPresets[*preset]
		if !ok {
			return fmt.Errorf("%w: bench model: unknown --preset %q (have tiny, deepseek-v2-lite, qwen3-30b-a3b, gpt-oss-20b)", errUsage, *preset)
		}
		n := *layers
		if n == 0 {
			n = ps.layers
		}
		if n < 1 || n > ps.layers {
			return fmt.Errorf("%w: bench model: --layers %d (the preset has %d)", errUsage, n, ps.layers)
		}
		p := ps.make(n)
		dt, err := dtypeOf(*dtype)
		if err != nil {
			return err
		}
		if dt.Quantized() || dt == kernels.F8E4M3 {
			p.ExpertDType = dt
		} else {
			p.WeightDType = dt
		}
		name, dtypeName = fmt.Sprintf("%s (%d layers, random weights)", *preset, n), *dtype
		fmt.Fprintf(o.stderr, "bench: making %s with %s experts\n", name, *dtype)
		if m, err = model.NewRandom(p, *seed); err != nil {
			return fmt.Errorf("bench model: %w (fewer --layers may fit)", err)
		}
	} else {
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "dtype" || f.Name == "layers" {
				err = fmt.Errorf("%w: bench model: --%s is for --preset's random weights", errUsage, f.Name)
			}
		})
		if err != nil {
			return err
		}
		if m, err = model.Load(*path); err != nil {
			return err
		}
	}
	defer m.Close()
	if mode != kernels.Exact {
		if err := m.SetNumerics(mode); err != nil {
			return fmt.Errorf("bench model: %w", err)
		}
	}
	B := *batch
	rng := rand.New(rand.NewPCG(*seed, 0xb0))
	ids := make([]int32, B**prompt) // sequence b's prompt at b·P
	for i := range ids {
		ids[i] = int32(rng.IntN(m.Vocab))
	}
	// pp: every sequence's prompt in one pass, the logits of each last
	// position; tg: one token a sequence.
	ppSeqs, ppRows, tgSeqs := make([]int, B**prompt), make([]int, B), make([]int, B)
	for b := range B {
		for i := range *prompt {
			ppSeqs[b**prompt+i] = b
		}
		ppRows[b], tgSeqs[b] = (b+1)**prompt-1, b
	}
	blockRows := 16
	blocks := B * ((*prompt+*gen+blockRows-1)/blockRows + 1)
	ctx := context.Background()
	var pp, tg []time.Duration
	probes := []float64{memoryBandwidth()}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return fmt.Errorf("bench model: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("bench model: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	var ppTimes, tgTimes model.StepTimes
	for r := range *rounds {
		kv, err := m.NewKV(blocks, blockRows, kvDType)
		if err != nil {
			return fmt.Errorf("bench model: %w", err)
		}
		next := make([]int32, B)
		for b := range next {
			next[b] = int32(rng.IntN(m.Vocab))
		}
		pick := func(logits []float32) {
			for b := range next {
				next[b] = argmax(logits[b*m.Vocab : (b+1)*m.Vocab])
			}
		}
		if *prompt > 0 {
			m.TimeSteps(&ppTimes)
			start := time.Now()
			logits, err := m.Forward(ctx, kv, ppSeqs, ids, ppRows)
			if err != nil {
				return fmt.Errorf("bench model: prompt: %w", err)
			}
			pp = append(pp, time.Since(start))
			pick(logits)
		}
		if *gen > 0 {
			m.TimeSteps(&tgTimes)
			start := time.Now()
			for range *gen {
				logits, err := m.Forward(ctx, kv, tgSeqs, next, nil) // every token's logits: sequence b's at row b
				if err != nil {
					return fmt.Errorf("bench model: step: %w", err)
				}
				pick(logits)
			}
			tg = append(tg, time.Since(start)/time.Duration(*gen))
		}
		m.TimeSteps(nil)
		fmt.Fprintf(o.stderr, "bench: round %d of %d (%v elapsed)\n", r+1, *rounds, time.Since(o.start).Round(time.Second))
	}
	probes = append(probes, memoryBandwidth())
	parts := func(r *modelResult, t *model.StepTimes, tokens int) {
		n := int64(max(tokens**rounds, 1))
		r.AttnNS, r.MLPNS, r.HeadNS = t.Attention.Load()/n, t.MLP.Load()/n, t.Head.Load()/n
	}
	probe := slices.Max(probes)
	base := modelResult{Model: name, Dtype: dtypeName, Numerics: mode.String(), KV: *kvName, Threads: *threads, Batch: B, Rounds: *rounds, ProbeGBPS: probe}
	var rs []modelResult
	if len(pp) > 0 {
		r := base
		med := median(pp)
		r.Case, r.Tokens, r.MedianNS, r.TokensSec = fmt.Sprintf("pp%d", *prompt), *prompt, med.Nanoseconds(), float64(B**prompt)/med.Seconds()
		r.ProbeGBPS = 0
		parts(&r, &ppTimes, B**prompt)
		rs = append(rs, r)
	}
	if len(tg) > 0 {
		r := base
		med := median(tg)
		r.Case, r.Tokens, r.MedianNS, r.TokensSec = fmt.Sprintf("tg%d", *gen), *gen, med.Nanoseconds(), float64(B)/med.Seconds()
		if B == 1 { // the bytes of one token's step (a batch's depend on its routing)
			r.Bytes = m.DecodeBytes()
			r.GBPS = float64(r.Bytes) / med.Seconds() / 1e9
			r.BWFraction = r.GBPS / probe
		}
		parts(&r, &tgTimes, B**gen)
		rs = append(rs, r)
	}
	if o.format == "json" {
		enc := json.NewEncoder(stdout)
		for _, r := range rs {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "case\tbatch\ttokens/s\tms/token\tGB/s\tof membw\tdtype\tnumerics\tkv\tthreads\t")
	for _, r := range rs {
		gb, frac := "", ""
		if r.GBPS > 0 {
			gb, frac = fmt.Sprintf("%.1f", r.GBPS), fmt.Sprintf("%.0f%%", 100*r.BWFraction)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.2f\t%s\t%s\t%s\t%s\t%s\t%d\t\n", r.Case, r.Batch, r.TokensSec, 1e3/r.TokensSec, gb, frac, r.Dtype, r.Numerics, r.KV, r.Threads)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if _, err = fmt.Fprintf(stdout, "%s; median of %d rounds; memory read-bandwidth probe %.1f GB/s\n", name, *rounds, probe); err != nil {
		return err
	}
	for _, r := range rs {
		ms := func(ns int64) float64 { return float64(ns) / 1e6 }
		if _, err = fmt.Fprintf(stdout, "%s, a token on average: attention %.2f ms, MLP %.2f ms, output %.2f ms\n", r.Case, ms(r.AttnNS), ms(r.MLPNS), ms(r.HeadNS)); err != nil {
			return err
		}
	}
	return nil
}

func median(ts []time.Duration) time.Duration {
	s := slices.Clone(ts)
	slices.Sort(s)
	return s[len(s)/2]
}

func argmax(v []float32) int32 {
	if len(v) == 0 {
		return 0
	}
	// The largest by SIMD, then its first place: a scalar pass with a NaN
	// check was ~0.1 ms of a decode step over a 151,936-token vocabulary.
	if hi, _, finite := kernels.MaxMin(v); finite {
		return int32(slices.Index(v, hi))
	}
	best := 0
	for i, x := range v {
		if x > v[best] || math.IsNaN(float64(v[best])) {
			best = i
		}
	}
	return int32(best)
}
