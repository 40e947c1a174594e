package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/moex-project/moex/ep"
	"github.com/moex-project/moex/internal/regfile"

	"github.com/moex-project/moex/internal/npy"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

func cmdExec(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: exec needs a block: exec moe ...", errUsage)
	}
	switch args[0] {
	case "moe":
		return execMoE(args[1:], stderr)
	case "mla-decode":
		return execMLADecode(args[1:], stderr)
	case "logits":
		return execLogits(args[1:], stderr)
	}
	return fmt.Errorf("%w: exec: unknown block %q (have: moe, mla-decode, logits)", errUsage, args[0])
}

// execMoE runs one MoE block of a checkpoint on x.npy [tokens, hidden],
// on one rank or, with --ep R, over R expert-parallel ranks: in-process
// goroutines (--comm local) or MPI processes (--comm mpi, under mpirun).
// The outputs are the same bytes whatever R and the placement.
func execMoE(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("exec moe", flag.ContinueOnError)
	model := fs.String("model", "", "Hugging Face checkpoint folder (config.json + *.safetensors), or a .gguf file")
	layer := fs.Int("layer", -1, "index of the MoE layer")
	input := fs.String("input", "", "float32 .npy [tokens, hidden]; for a block that owns its norms (gemma4) the residual stream")
	tokens := fs.String("tokens", "", "optional int32 .npy [tokens]: the token ids, which a layer that routes by token id needs (deepseek_v4's hash layers)")
	out := fs.String("out", "", "output float32 .npy [tokens, hidden]")
	idsOut := fs.String("ids-out", "", "optional int32 .npy [tokens, top_k]: chosen experts, each row ascending")
	wOut := fs.String("weights-out", "", "optional float32 .npy [tokens, top_k]: routing weights in the order of the ids")
	ranks := fs.Int("ep", 1, "expert-parallel ranks; the tokens are split over them in contiguous slices")
	placement := fs.String("placement", "contiguous", "contiguous, round-robin, balanced, or a placement .json file")
	redundant := fs.Int("redundant", -1, "balanced: extra expert slots (default: one per rank)")
	commName := fs.String("comm", "local", "local (goroutines in this process) or mpi (one process per rank, under mpirun)")
	timeout := fs.Duration("timeout", 10*time.Minute, "give up on a rank that does not arrive after this long (each collective's bound)")
	deadline := fs.Duration("deadline", 0, "give up on the whole job after this long (0: no limit)")
	backend := fs.String("backend", "cpu", "cpu, or cuda (the GPU kernels, one rank; needs a `make cuda` build)")
	numerics := fs.String("numerics", "exact", "exact; int8dot: the experts' products as llama.cpp computes them (activations rounded to int8 per 32, integer dot products; GGUF Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K and MXFP4 experts); or bf16dot: bf16 experts against activations rounded to bf16, vdpbf16ps pairs (one CPU rank for both)")
	checkWeights := fs.Bool("check-weights", false, "read every expert weight once before running and fail naming the first NaN or infinity (the router's are always checked)")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	for _, f := range []struct{ name, v string }{{"--model", *model}, {"--input", *input}, {"--out", *out}} {
		if f.v == "" {
			return fmt.Errorf("%w: exec moe: %s is required", errUsage, f.name)
		}
	}
	if *layer < 0 {
		return fmt.Errorf("%w: exec moe: --layer is required (a non-negative layer index)", errUsage)
	}
	if *ranks < 1 {
		return fmt.Errorf("%w: exec moe: --ep %d must be at least 1", errUsage, *ranks)
	}
	if *ranks > maxGoroutineRanks && *commName == "local" {
		return fmt.Errorf("%w: exec moe: --ep %d in-process ranks is over the %d this command runs", errUsage, *ranks, maxGoroutineRanks)
	}
	redundantSet := false
	fs.Visit(func(f *flag.Flag) { redundantSet = redundantSet || f.Name == "redundant" })
	if redundantSet && (*redundant < 0 || *placement != "balanced") {
		return fmt.Errorf("%w: exec moe: --redundant %d: extra expert slots are for --placement balanced, and not negative", errUsage, *redundant)
	}
	if err := checkPlacementFlag(*placement, *ranks); err != nil {
		return err
	}
	if err := checkFiles("exec moe", [][2]string{{"--input", *input}, {"--tokens", *tokens}},
		[2]string{"--out", *out}, [2]string{"--ids-out", *idsOut}, [2]string{"--weights-out", *wOut}); err != nil {
		return err
	}
	if *timeout <= 0 {
		return fmt.Errorf("%w: exec moe: --timeout %v must be positive", errUsage, *timeout)
	}
	if *deadline < 0 {
		return fmt.Errorf("%w: exec moe: --deadline %v must be positive (or 0: no limit)", errUsage, *deadline)
	}
	mode, err := kernels.ParseNumerics(*numerics)
	if err != nil {
		return fmt.Errorf("%w: exec moe: %w", errUsage, err)
	}
	if mode != kernels.Exact && (*ranks != 1 || *backend != "cpu") {
		return fmt.Errorf("%w: exec moe: --numerics %v runs on one CPU rank (--ep 1 --backend cpu)", errUsage, mode)
	}
	job := &epJob{model: *model, layer: *layer, input: *input, tokens: *tokens, placement: *placement, redundant: *redundant,
		checkWeights: *checkWeights, numerics: mode}
	ctx, cancel := withDeadline(*deadline)
	defer cancel()
	var res *epResult
	switch {
	case *backend == "cuda":
		if *ranks != 1 || *commName != "local" {
			return fmt.Errorf("%w: exec moe: --backend cuda runs one rank (--ep 1 --comm local)", errUsage)
		}
		res, err = moeOnDevice(job)
	case *backend != "cpu":
		return fmt.Errorf("%w: exec moe: --backend %q (want cpu or cuda)", errUsage, *backend)
	case *commName == "local":
		if *ranks == 1 {
			res, err = job.single(ctx)
			break
		}
		results := make([]*epResult, *ranks)
		errs, cerr := ep.RunLocal(*ranks, func(c ep.Comm) error {
			var err error
			results[c.Rank()], err = job.rank(ctx, ep.WithTimeout(c, *timeout))
			return err
		})
		if cerr != nil {
			return cerr
		}
		res, err = results[0], firstError(errs)
	case *commName == "mpi":
		c, closeComm, cerr := mpiWorld()
		if cerr != nil {
			return cerr
		}
		defer closeComm()
		if c.Size() != *ranks {
			return fmt.Errorf("exec moe: --ep %d, but mpirun started %d ranks", *ranks, c.Size())
		}
		res, err = job.rank(ctx, ep.WithTimeout(c, *timeout))
		if err == nil && c.Rank() != 0 {
			return nil // rank 0 writes the outputs
		}
	default:
		return fmt.Errorf("%w: exec moe: --comm %q (want local or mpi)", errUsage, *commName)
	}
	if err != nil {
		return deadlineError(err, *deadline)
	}
	T, H, K := res.tokens, res.hidden, res.topK
	if err := npy.WriteFloat32(*out, []int{T, H}, res.y); err != nil {
		return err
	}
	if *idsOut != "" {
		if err := npy.WriteInt32(*idsOut, []int{T, K}, res.ids); err != nil {
			return err
		}
	}
	if *wOut != "" {
		if err := npy.WriteFloat32(*wOut, []int{T, K}, res.weights); err != nil {
			return err
		}
	}
	return nil
}

// withDeadline is the context of a whole job: bounded by d, or not at all
// when d is 0.
func withDeadline(d time.Duration) (context.Context, context.CancelFunc) {
	if d == 0 {
		return context.WithCancel(context.Background())
	}
	return context.WithTimeout(context.Background(), d)
}

// firstError is the error of the rank that failed first in rank order,
// preferring a rank's own error over the "aborted" errors it caused.
func firstError(errs []error) error {
	for _, err := range errs {
		if err != nil && !errors.Is(err, ep.ErrAborted) {
			return err
		}
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

type epJob struct {
	model, input, tokens, placement string
	layer, redundant                int
	checkWeights                    bool
	numerics                        kernels.Numerics
}

type epResult struct {
	tokens, hidden, topK int
	y, weights           []float32
	ids                  []int32
}

// readInput reads x.npy and checks it against the model's hidden size.
func (j *epJob) readInput(cfg *moe.Config) (npy.Float32, error) {
	x, err := npy.ReadFloat32(j.input)
	if err != nil {
		return x, err
	}
	if len(x.Shape) != 2 || x.Shape[1] != cfg.Hidden {
		return x, fmt.Errorf("%s: shape %v, want [tokens, %d]", j.input, x.Shape, cfg.Hidden)
	}
	return x, nil
}

// loadOne loads the whole layer and the input for a one-rank run, with the
// result's buffers; the caller closes the layer.
func (j *epJob) loadOne() (*moe.Layer, npy.Float32, *epResult, error) {
	l, err := moe.Load(j.model, j.layer)
	if err != nil {
		return nil, npy.Float32{}, nil, err
	}
	if err := l.SetNumerics(j.numerics); err != nil {
		l.Close()
		return nil, npy.Float32{}, nil, fmt.Errorf("%s: layer %d: %w", j.model, j.layer, err)
	}
	c := l.Config
	x, err := j.readInput(c)
	if err != nil {
		l.Close()
		return nil, x, nil, err
	}
	T := x.Shape[0]
	r := &epResult{tokens: T, hidden: c.Hidden, topK: c.TopK, y: make([]float32, T*c.Hidden),
		ids: make([]int32, T*c.TopK), weights: make([]float32, T*c.TopK)}
	return l, x, r, nil
}

func (j *epJob) single(ctx context.Context) (*epResult, error) {
	l, x, r, err := j.loadOne()
	if err != nil {
		return nil, err
	}
	defer l.Close()
	if j.checkWeights {
		if err := l.CheckWeights(ctx); err != nil {
			return nil, fmt.Errorf("%s: layer %d: %w", j.model, j.layer, err)
		}
	}
	tokens, err := j.readTokens(r.tokens)
	if err != nil {
		return nil, err
	}
	return r, l.ForwardTokens(ctx, x.Data, tokens, r.y, r.ids, r.weights)
}

// readTokens reads --tokens, one id per row of the input (nil without it).
func (j *epJob) readTokens(T int) ([]int32, error) {
	if j.tokens == "" {
		return nil, nil
	}
	tok, err := npy.ReadInt32(j.tokens)
	if err != nil {
		return nil, err
	}
	if len(tok.Shape) != 1 || tok.Shape[0] != T {
		return nil, fmt.Errorf("%s: shape %v, want [%d]: one token id per row of %s", j.tokens, tok.Shape, T, j.input)
	}
	return tok.Data, nil
}

// rank runs one rank's share and gathers the outputs on every rank.
func (j *epJob) rank(ctx context.Context, c ep.Comm) (*epResult, error) {
	res, err := j.rankWork(ctx, c)
	if err != nil {
		c.Abort(fmt.Errorf("rank %d: %w", c.Rank(), err))
	}
	return res, err
}

func (j *epJob) rankWork(ctx context.Context, c ep.Comm) (*epResult, error) {
	if strings.HasSuffix(j.model, ".gguf") && c.Size() > 1 {
		return nil, fmt.Errorf("%w: exec moe: expert parallelism over a GGUF file is not supported yet: run it on one rank", errUsage)
	}
	ck, err := moe.OpenCheckpoint(j.model)
	if err != nil {
		return nil, err
	}
	defer ck.Close()
	cfg := ck.Config
	if err := ck.Arch.MoELayer(j.layer); err != nil {
		return nil, fmt.Errorf("%s: %w", j.model, err)
	}
	x, err := j.readInput(cfg)
	if err != nil {
		return nil, err
	}
	H, K, R := cfg.Hidden, cfg.TopK, c.Size()
	T := x.Shape[0]
	off := ep.Split(T, R)
	mine := x.Data[off[c.Rank()]*H : off[c.Rank()+1]*H]
	tokens, err := j.readTokens(T)
	if err != nil {
		return nil, err
	}
	if tokens != nil {
		tokens = tokens[off[c.Rank()]:off[c.Rank()+1]]
	}
	place, err := j.makePlacement(ctx, c, ck, mine, tokens)
	if err != nil {
		return nil, err
	}
	l, err := ep.LoadFrom(ck, j.layer, c, place)
	if err != nil {
		return nil, err
	}
	if j.checkWeights {
		if err := l.CheckWeights(ctx); err != nil {
			return nil, fmt.Errorf("%s: layer %d: %w", j.model, j.layer, err)
		}
	}
	n := len(mine) / H
	y := make([]float32, n*H)
	ids := make([]int32, n*K)
	w := make([]float32, n*K)
	if err := l.ForwardTokens(ctx, mine, tokens, y, ids, w); err != nil {
		return nil, err
	}
	res := &epResult{tokens: T, hidden: H, topK: K}
	if res.y, err = gather[float32](ctx, c, y); err != nil {
		return nil, err
	}
	if res.ids, err = gather[int32](ctx, c, ids); err != nil {
		return nil, err
	}
	if res.weights, err = gather[float32](ctx, c, w); err != nil {
		return nil, err
	}
	return res, nil
}

// checkPlacementFlag checks --placement before any work: a known kind, or a
// .json file that parses.
func checkPlacementFlag(p string, ranks int) error {
	switch {
	case p == "contiguous", p == "round-robin", p == "balanced":
		return nil
	case strings.HasSuffix(p, ".json"):
		pl, err := readPlacement(p)
		if err == nil && pl.Ranks != ranks {
			err = fmt.Errorf("%w: exec moe: --placement %s places the experts over %d ranks, but --ep is %d", errUsage, p, pl.Ranks, ranks)
		}
		return err
	}
	return fmt.Errorf("%w: exec moe: --placement %q (want contiguous, round-robin, balanced or a .json file)", errUsage, p)
}

// readPlacement reads a placement .json file, naming it in its errors.
func readPlacement(path string) (*ep.Placement, error) {
	data, err := regfile.ReadFile(path, 64<<20)
	if err != nil {
		return nil, err
	}
	p, err := ep.ParsePlacement(data)
	if err != nil {
		return nil, fmt.Errorf("--placement %s: %w", path, err)
	}
	return p, nil
}

// makePlacement builds the placement the flags ask for; balanced routes
// every rank's tokens once to count the load of each expert.
func (j *epJob) makePlacement(ctx context.Context, c ep.Comm, ck *moe.Checkpoint, mine []float32, tokens []int32) (*ep.Placement, error) {
	E, R := ck.Config.NumExperts, c.Size()
	switch {
	case j.placement == "contiguous":
		return ep.Contiguous(E, R)
	case j.placement == "round-robin":
		return ep.RoundRobin(E, R)
	case strings.HasSuffix(j.placement, ".json"):
		return readPlacement(j.placement)
	case j.placement != "balanced":
		return nil, fmt.Errorf("%w: exec moe: --placement %q (want contiguous, round-robin, balanced or a .json file)", errUsage, j.placement)
	}
	router, err := moe.LoadSubset(ck, j.layer, func(int) bool { return false })
	if err != nil {
		return nil, err
	}
	n := len(mine) / ck.Config.Hidden
	ids := make([]int32, n*ck.Config.TopK)
	if err := router.RouteTokens(ctx, mine, tokens, ids, make([]float32, len(ids))); err != nil {
		return nil, err
	}
	load := make([]int64, E)
	for _, e := range ids {
		load[e]++
	}
	if err := c.AllReduceInt64(ctx, load, ep.Sum); err != nil {
		return nil, err
	}
	redundant := j.redundant
	if redundant < 0 {
		redundant = R
	}
	return ep.Balanced(load, R, redundant)
}

// gather concatenates every rank's values in rank order.
func gather[T int32 | float32](ctx context.Context, c ep.Comm, v []T) ([]T, error) {
	parts, err := c.AllGather(ctx, ep.Bytes(v))
	if err != nil {
		return nil, err
	}
	var out []T
	for _, p := range parts {
		vs, err := ep.FromBytes[T](p)
		if err != nil {
			return nil, err
		}
		out = append(out, vs...)
	}
	return out, nil
}
