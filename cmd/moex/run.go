package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"time"

	"github.com/moex-project/moex/dpattn"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// cmdRun builds a MoE layer (DeepSeek-V2-Lite shapes with random weights, or
// a checkpoint's layer), runs forward passes over a random batch and
// reports routing, timing and a checksum of the output.
func cmdRun(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	model := fs.String("model", "", "checkpoint folder; default: DeepSeek-V2-Lite shapes with random weights")
	layerIdx := fs.Int("layer", 1, "MoE layer of --model")
	tokens := fs.Int("tokens", 64, "tokens in the batch")
	iters := fs.Int("iters", 3, "timed forward passes (the median is reported)")
	seed := fs.Uint64("seed", 1, "seed of the random weights and inputs")
	dtype := fs.String("dtype", "bf16", "dtype of random weights: f32, bf16 or f16")
	workers := fs.Int("workers", 0, "goroutines per forward pass (0: GOMAXPROCS)")
	ranks := fs.Int("ranks", 4, "ranks for the KV-cache accounting (TP vs DP attention)")
	kvGiB := fs.Float64("kv-budget-gib", 16, "KV-cache memory per rank for the accounting, GiB")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if *tokens < 0 || *iters < 1 {
		return fmt.Errorf("%w: run: --tokens must be ≥ 0 and --iters ≥ 1", errUsage)
	}
	var l *moe.Layer
	var err error
	start := time.Now()
	source := ""
	if *model != "" {
		if l, err = moe.Load(*model, *layerIdx); err != nil {
			return err
		}
		defer l.Close()
		source = fmt.Sprintf("%s layer %d", *model, *layerIdx)
	} else {
		dt, ok := map[string]kernels.DType{"f32": kernels.F32, "bf16": kernels.BF16, "f16": kernels.F16}[*dtype]
		if !ok {
			return fmt.Errorf("%w: run: --dtype %q (want f32, bf16 or f16)", errUsage, *dtype)
		}
		if l, err = moe.NewRandom(moe.DeepSeekV2Lite(), dt, *seed); err != nil {
			return err
		}
		source = fmt.Sprintf("DeepSeek-V2-Lite-shaped MoE layer, random %s weights (seed %d)", *dtype, *seed)
	}
	setup := time.Since(start)
	l.Workers = *workers
	c := l.Config
	rng := rand.New(rand.NewPCG(*seed, 1))
	x := make([]float32, *tokens*c.Hidden)
	for i := range x {
		x[i] = float32(2*rng.Float64() - 1)
	}
	y := make([]float32, len(x))
	ids := make([]int32, *tokens*c.TopK)
	w := make([]float32, *tokens*c.TopK)

	ctx := context.Background()
	var times []time.Duration
	for range *iters {
		t0 := time.Now()
		if err := l.ForwardRouting(ctx, x, y, ids, w); err != nil {
			return err
		}
		times = append(times, time.Since(t0))
	}
	slices.Sort(times)
	med := times[len(times)/2]

	load := make([]int, c.NumExperts)
	for _, id := range ids {
		load[id]++
	}
	touched, maxLoad := 0, 0
	for _, n := range load {
		if n > 0 {
			touched++
		}
		maxLoad = max(maxLoad, n)
	}
	var sum, sq float64
	for _, v := range y {
		sum += float64(v)
		sq += float64(v) * float64(v)
	}
	flops := c.FLOPs(*tokens)

	fmt.Fprintf(stdout, "moex run: %s\n", source)
	fmt.Fprintf(stdout, "  model      %s: hidden %d, %d experts × inter %d, top-%d, %s/%s, shared width %d\n",
		c.ModelType, c.Hidden, c.NumExperts, c.Inter, c.TopK, c.Scoring, c.Method, c.SharedInter)
	fmt.Fprintf(stdout, "  setup      %v\n", setup.Round(time.Millisecond))
	fmt.Fprintf(stdout, "  batch      %d tokens, %d goroutines (GOMAXPROCS %d)\n", *tokens, workersUsed(*workers), runtime.GOMAXPROCS(0))
	if *tokens > 0 {
		fmt.Fprintf(stdout, "  routing    %d of %d experts used; tokens per used expert: mean %.1f, max %d\n",
			touched, c.NumExperts, float64(len(ids))/float64(touched), maxLoad)
	}
	fmt.Fprintf(stdout, "  forward    median %v over %d passes (min %v), %.2f GFLOP/s (%.2f GFLOP per pass)\n",
		med.Round(time.Microsecond), *iters, times[0].Round(time.Microsecond), flops/med.Seconds()/1e9, flops/1e9)
	fmt.Fprintf(stdout, "  output     sum %.6g, rms %.6g\n", sum, math.Sqrt(sq/math.Max(1, float64(len(y)))))
	if c.KVLoraRank > 0 && c.NumLayers > 0 {
		acct, err := dpattn.Account(*ranks, c.NumLayers, c.KVLoraRank+c.RopeDim, 2, int64(*kvGiB*(1<<30)))
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "  kv cache   %v\n", acct)
	}
	return nil
}

func workersUsed(n int) int {
	if n > 0 {
		return n
	}
	return runtime.GOMAXPROCS(0)
}
