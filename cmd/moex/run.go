package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/moex-project/moex/arch"
	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/dpattn"
	"github.com/moex-project/moex/ep"
	"github.com/moex-project/moex/internal/decoderun"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// maxRunSteps bounds moex run's decode loop.
const maxRunSteps = 1_000_000

// cmdRun is the main job: R in-process ranks run decode steps of one
// DeepSeek-V2-Lite-shaped layer (MLA attention over each rank's own paged
// latent cache, then the MoE layer shared over the ranks in all-to-all or
// gather mode), then the same tokens on one rank for a parity check. It
// fails when parity fails.
func cmdRun(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	ranks := fs.Int("ranks", 4, "in-process ranks")
	steps := fs.Int("steps", 8, "decode steps")
	batch := fs.Int("batch", 0, "every rank decodes this many requests at every step (0: an uneven schedule with IDLE batches)")
	ctxLen := fs.Int("context", 256, "--batch: each request's prompt tokens in the cache")
	mode := fs.String("moe-mode", "alltoall", "alltoall (EP dispatch/combine) or gather (all-gather, expert shards, reduce-scatter)")
	attnMode := fs.String("attn", "dp", "dp (each rank its own requests and cache) or tp (the heads split over the ranks, every rank caching every request; MoE in gather mode)")
	seed := fs.Uint64("seed", 1, "seed of the random weights, requests and inputs")
	model := fs.String("model", "", "checkpoint folder for the MoE layer; default: DeepSeek-V2-Lite shapes with random bf16 weights")
	checkWeights := fs.Bool("check-weights", false, "--model: read every expert weight once before running and fail naming the first NaN or infinity")
	layerIdx := fs.Int("layer", 1, "MoE layer of --model")
	kvGiB := fs.Float64("kv-budget-gib", 16, "KV-cache memory per rank for the accounting, GiB")
	backend := fs.String("backend", "cpu", "cpu, or cuda: every rank's attention (projections and MLA over a device copy of its cache) and MoE experts on the GPU (needs a `make cuda` build)")
	commName := fs.String("comm", "local", "local (ranks as goroutines), mpi (one process per rank under mpirun), or nccl "+
		"(one process per GPU, torchrun's MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE; implies --backend cuda)")
	timeout := fs.Duration("timeout", 10*time.Minute, "give up on a rank that does not arrive after this long (each collective's bound)")
	deadline := fs.Duration("deadline", 0, "give up on the whole run after this long (0: no limit)")
	graphs := fs.Bool("cuda-graph", true, "--backend cuda: replay captured CUDA graphs of the experts and of attention when the coordinator's vote allows")
	fused := fs.Bool("fused-layer", true, "--backend cuda --moe-mode gather: the layer's whole decode step (attention, residual, "+
		"all-gather, MoE, reduce-scatter) on the device with no host copy between, one CUDA graph per step shape; false: the stages apart")
	numerics := fs.String("numerics", "exact", "the MoE experts' numerics: exact, int8dot (GGUF integer-code and MXFP4 experts) or bf16dot (bf16 experts, vdpbf16ps pairs); --backend cpu")
	whole := fs.Bool("whole", false, "run --model's whole model (a folder or .gguf of a family moex runs whole): every rank's requests prefilled, then "+
		"decoded greedily over DP-attention ranks sharing the MoE layers, checked against one rank")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	numMode, err := kernels.ParseNumerics(*numerics)
	if err != nil {
		return fmt.Errorf("%w: run: %w", errUsage, err)
	}
	if *ranks < 1 || *steps < 1 {
		return fmt.Errorf("%w: run: --ranks and --steps must be positive", errUsage)
	}
	if numMode != kernels.Exact && (*backend != "cpu" || *commName == "nccl") {
		return fmt.Errorf("%w: run: --numerics %v runs on --backend cpu", errUsage, numMode)
	}
	explicit := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	switch {
	case *attnMode != "dp" && *attnMode != "tp":
		return fmt.Errorf("%w: run: --attn %q (want dp or tp)", errUsage, *attnMode)
	case *attnMode == "tp" && explicit["moe-mode"] && *mode != "gather":
		return fmt.Errorf("%w: run: --attn tp runs the MoE layer as expert shards over every token (gather mode), not --moe-mode %s", errUsage, *mode)
	case *attnMode == "tp" && (*backend != "cpu" || *commName != "local"):
		return fmt.Errorf("%w: run: --attn tp runs on the CPU with in-process ranks", errUsage)
	case *attnMode == "tp":
		*mode = "gather"
	}
	if *batch < 0 || *batch > 4096 || *ctxLen < 1 || *ctxLen > 1<<20 {
		return fmt.Errorf("%w: run: --batch %d must be in [0, 4096] and --context %d in [1, 1048576]", errUsage, *batch, *ctxLen)
	}
	if *steps > maxRunSteps {
		return fmt.Errorf("%w: run: --steps %d is over the %d decode steps a run takes (its schedule and per-step report are kept in memory)", errUsage, *steps, maxRunSteps)
	}
	if !(*kvGiB > 0) || math.IsInf(*kvGiB, 0) {
		return fmt.Errorf("%w: run: --kv-budget-gib %v must be a positive finite number of GiB", errUsage, *kvGiB)
	}
	if *kvGiB > 1<<20 {
		return fmt.Errorf("%w: run: --kv-budget-gib %v is over 1048576 GiB (1 PiB) per rank", errUsage, *kvGiB)
	}
	if *ranks > maxGoroutineRanks && *commName == "local" {
		return fmt.Errorf("%w: run: --ranks %d in-process ranks is over the %d this command runs", errUsage, *ranks, maxGoroutineRanks)
	}
	if *timeout <= 0 {
		return fmt.Errorf("%w: run: --timeout %v must be positive", errUsage, *timeout)
	}
	if *deadline < 0 {
		return fmt.Errorf("%w: run: --deadline %v must be positive (or 0: no limit)", errUsage, *deadline)
	}
	if *whole {
		switch {
		case *model == "":
			return fmt.Errorf("%w: run: --whole needs --model", errUsage)
		case *attnMode != "dp" || *commName != "local" || *backend != "cpu" || explicit["layer"]:
			return fmt.Errorf("%w: run: --whole runs DP attention over in-process ranks on the CPU (no --attn tp, --comm, --backend or --layer)", errUsage)
		}
		ctx, cancel := withDeadline(*deadline)
		defer cancel()
		return runWhole(ctx, wholeRun{path: *model, ranks: *ranks, steps: *steps, batch: max(*batch, 1), context: *ctxLen,
			mode: *mode, seed: *seed, numerics: numMode}, stdout)
	}
	ranksSet := false
	fs.Visit(func(f *flag.Flag) { ranksSet = ranksSet || f.Name == "ranks" })
	ctx, cancel := withDeadline(*deadline)
	defer cancel()
	var comm, plan ep.Comm
	switch *commName {
	case "local":
	case "mpi", "nccl":
		var closeComm func()
		var err error
		if *commName == "mpi" {
			comm, closeComm, err = mpiWorld()
			plan = comm
		} else {
			*backend = "cuda"
			comm, plan, closeComm, err = ncclWorld(ctx)
		}
		if err != nil {
			return err
		}
		defer closeComm()
		if ranksSet && *ranks != comm.Size() {
			return fmt.Errorf("run: --ranks %d, but %d ranks were started", *ranks, comm.Size())
		}
		*ranks = comm.Size()
	default:
		return fmt.Errorf("%w: run: --comm %q (want local, mpi or nccl)", errUsage, *commName)
	}
	var dev *deviceRun
	var attnProj attn.Projector
	switch *backend {
	case "cpu":
		dev = &deviceRun{close: func() {}}
	case "cuda":
		var err error
		if dev, err = openDeviceRun(*graphs); err != nil {
			return err
		}
		attnProj = dev.proj // the attention block's projections there too
	default:
		return fmt.Errorf("%w: run: --backend %q (want cpu or cuda)", errUsage, *backend)
	}
	defer dev.close()
	t0 := time.Now()
	var layer *moe.Layer
	source := fmt.Sprintf("DeepSeek-V2-Lite-shaped layer, random bf16 weights (seed %d)", *seed)
	if *model != "" {
		if layer, err = moe.Load(*model, *layerIdx); err != nil {
			return err
		}
		defer layer.Close()
		if *checkWeights {
			if err := layer.CheckWeights(context.Background()); err != nil {
				return fmt.Errorf("%s: layer %d: %w", *model, *layerIdx, err)
			}
		}
		source = fmt.Sprintf("layer %d of %s", *layerIdx, *model)
	} else if layer, err = moe.NewRandom(moe.DeepSeekV2Lite(), kernels.BF16, *seed); err != nil {
		return err
	}
	if err := layer.SetNumerics(numMode); err != nil {
		return fmt.Errorf("run: %s: %w", source, err)
	}
	if numMode != kernels.Exact {
		source += fmt.Sprintf(", experts in %v numerics", numMode)
	}
	c := layer.Config
	// The model's layers, for the KV accounting: the file's, or
	// DeepSeek-V2-Lite's 27 for the random layer.
	numLayers := 27
	if layer.Arch != nil {
		numLayers = layer.Arch.Layers
	}
	var block *attn.MLABlock
	var attnDesc string
	if layer.Arch != nil && layer.Arch.Attention.Kind == arch.MLA && !strings.HasSuffix(*model, ".gguf") {
		if block, err = attn.LoadMLABlock(*model, *layerIdx); err != nil {
			return err
		}
		defer block.Close()
		attnDesc = fmt.Sprintf("MLA of %s layer %d", *model, *layerIdx)
	} else {
		acfg := attn.DeepSeekV2LiteAttention()
		acfg.Hidden = c.Hidden
		if block, err = attn.NewRandomMLABlock(acfg, kernels.BF16, *seed); err != nil {
			return err
		}
		attnDesc = "MLA with DeepSeek-V2-Lite's shapes, random bf16 weights"
		if strings.HasSuffix(*model, ".gguf") {
			attnDesc += " (of a GGUF file moex reads the MoE block only)"
		}
	}
	ac := block.Cfg
	attnDesc += fmt.Sprintf(": %d heads, latent %d+%d, absorbed form, yarn RoPE %v", ac.Heads, ac.KVLoraRank, ac.RopeDim, ac.Scaling != nil)
	latent := block.RowDim()
	var acct dpattn.KVAccounting
	if numLayers > 0 { // the accounting's flags checked before the run
		if acct, err = dpattn.Account(*ranks, numLayers, latent, 2, int64(*kvGiB*(1<<30))); err != nil {
			return fmt.Errorf("%w: run: --kv-budget-gib %v: %w", errUsage, *kvGiB, err)
		}
	}
	setup := time.Since(t0)
	cfg := decoderun.Config{Ranks: *ranks, Steps: *steps, Batch: *batch, Context: *ctxLen, AttnMode: *attnMode, MoEMode: *mode, Seed: *seed, RankTimeout: *timeout,
		MoE: layer, Attn: block, CacheDType: kernels.BF16, Experts: dev.experts, Gather: dev.gather, AttnCore: dev.core, AttnProj: attnProj}
	if *fused {
		cfg.Layer = dev.layer
	}
	var rep *decoderun.Report
	if comm == nil {
		rep, err = decoderun.Run(ctx, cfg)
	} else if rep, err = decoderun.RunComms(ctx, cfg, comm, plan); err == nil && rep == nil {
		return nil // rank 0 reports
	}
	if err != nil {
		return deadlineError(err, *deadline)
	}

	fmt.Fprintf(stdout, "moex run: %d ranks × %d decode steps, %s attention, MoE mode %s, kernels %s, transport %s\n", *ranks, *steps,
		strings.ToUpper(*attnMode), *mode, kernels.Implementation(), *commName)
	fmt.Fprintf(stdout, "  model: %s (setup %v)\n", source, setup.Round(time.Millisecond))
	fmt.Fprintf(stdout, "  layer: %s; MoE %s %d experts top-%d, inter %d, shared %d\n",
		attnDesc, c.ModelType, c.NumExperts, c.TopK, c.Inter, c.SharedInter)
	if dev.core != nil {
		launches := "eager launches"
		if *graphs {
			launches = "CUDA graphs per bucket, replayed when the vote allows"
		}
		_, sharedGate := layer.SharedExpert()
		switch {
		case *mode == "gather" && (!*fused || sharedGate != nil): // qwen2_moe's shared gate runs on the host
			fmt.Fprintf(stdout, "  backend: on %s, bf16 activations, %s: the attention projections and MLA decode over a synced "+
				"copy of each rank's cache (RMSNorm, RoPE and the cache append on the CPU), then the whole MoE stage (the hidden "+
				"states all-gathered and reduce-scattered in device memory; router, the rank's experts and the shared expert "+
				"there; its time in the MoE column)\n", deviceName, launches)
		case *mode == "gather":
			fmt.Fprintf(stdout, "  backend: on %s, bf16 activations, %s: each rank's whole layer step (MLA block with RMSNorm, "+
				"RoPE and the cache append, residual, all-gather, router and the rank's experts, reduce-scatter, shared expert) "+
				"with no host copy between its upload and download; its time in the MoE column\n", deviceName, launches)
		default:
			fmt.Fprintf(stdout, "  backend: on %s, bf16 activations, %s: the attention projections and MLA decode over a synced "+
				"copy of each rank's cache (RMSNorm, RoPE and the cache append on the CPU), and the experts of each rank's shard "+
				"(resident; routing, dispatch and combine on the CPU)\n", deviceName, launches)
		}
	}
	fmt.Fprintln(stdout)

	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "step\ttokens per rank\tplan\t")
	for st, s := range rep.Steps {
		what := "decode"
		switch {
		case s.Skip:
			what = "skipped (no work anywhere)"
		case s.GraphOK:
			what = "decode, graph replay allowed"
		}
		fmt.Fprintf(tw, "%d\t%v\t%s\t\n", st, s.Counts, what)
	}
	tw.Flush()
	fmt.Fprintln(stdout)
	gatherName, scatterName := "dispatch", "combine"
	switch {
	case *attnMode == "tp":
		gatherName, scatterName = "attn all-reduce", "MoE all-reduce"
	case *mode == "gather":
		gatherName, scatterName = "gather", "scatter"
	}
	tw = tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "rank\ttokens\tcollectives (plan)\tattention\t%s\tMoE experts\t%s\tKV cache\t\n", gatherName, scatterName)
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
	for r, t := range rep.Ranks {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\t%s\t%.1f MiB\t\n", r, t.Tokens, ms(t.Plan), ms(t.Attention), ms(t.Gather), ms(t.MoE), ms(t.Scatter),
			float64(t.KVBytes)/(1<<20))
	}
	tw.Flush()
	fmt.Fprintf(stdout, "\n  %d tokens in %v of decode steps: %.1f tokens/s (the run %v, the caches' prefill included); %d idle (rank, step) batches\n",
		rep.Tokens, rep.DecodeWall.Round(time.Millisecond), float64(rep.Tokens)/rep.DecodeWall.Seconds(), rep.Wall.Round(time.Millisecond), rep.IdleSteps)
	if dev.core != nil && *mode == "gather" && *graphs {
		replays, ran := make([]int, len(rep.Ranks)), 0
		for r, t := range rep.Ranks {
			replays[r] = t.Replays
		}
		for _, st := range rep.Steps {
			if !st.Skip {
				ran++
			}
		}
		fmt.Fprintf(stdout, "  CUDA graph replays per rank: %v of %d steps (a step shape runs eagerly first; a step replays where "+
			"every rank holds its shape's graph and the vote allows)\n", replays, ran)
	}
	if numLayers > 0 {
		fmt.Fprintf(stdout, "  %v\n", acct)
		if *batch > 0 {
			// A request's tokens at the run's end; the batches every rank's
			// budget holds: TP caches all of them on each rank, DP a rank's own.
			per := int64(*ctxLen + *steps)
			tpBatch, dpBatch := acct.MaxTokensTP/per, acct.MaxTokensDP/per
			fmt.Fprintf(stdout, "  largest batch of %d-token requests within %.1f GiB per rank: %s attention %d (the one in use), %s %d\n",
				per, *kvGiB, strings.ToUpper(*attnMode), map[string]int64{"tp": tpBatch, "dp": dpBatch}[*attnMode],
				map[string]string{"tp": "DP", "dp": "TP"}[*attnMode], map[string]int64{"tp": dpBatch, "dp": tpBatch}[*attnMode])
		}
	}
	limit, want := 0.0, "bit-identical"
	switch {
	case dev.core != nil:
		limit, want = 1e-2, "within 1e-2 of the CPU path"
	case *attnMode == "tp":
		limit, want = 1e-5, "within 1e-5"
	case *mode == "gather":
		limit, want = 1e-6, "within 1e-6"
	}
	ok := rep.ParityExact || (limit > 0 && rep.ParityRelErr <= limit)
	verdict := "ok"
	if !ok {
		verdict = "FAILED"
	}
	fmt.Fprintf(stdout, "  parity against one rank (%s expected): bit-identical %v, relative error %.2e: %s\n", want, rep.ParityExact, rep.ParityRelErr, verdict)
	if !ok {
		return fmt.Errorf("run: parity with one rank failed (relative error %.2e)", rep.ParityRelErr)
	}
	return nil
}

// deviceRun is what --backend cuda gives moex run (see openDeviceRun); the
// CPU backend leaves everything but close nil.
type deviceRun struct {
	experts func(int, *moe.Layer) (decoderun.ExpertRunner, error)
	gather  func(context.Context, int, *moe.Layer, ep.Comm) (decoderun.GatherRunner, error)
	layer   func(context.Context, int, attn.Block, *moe.Layer, ep.Comm) (decoderun.LayerRunner, error)
	core    attn.Core
	proj    attn.Projector
	close   func()
}
