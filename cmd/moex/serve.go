package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/model"
	"github.com/moex-project/moex/moe"
	"github.com/moex-project/moex/serve"
)

// cmdServe is `moex serve`: the worker, until SIGTERM or SIGINT, which
// drain it.
func cmdServe(args []string, stdout, stderr io.Writer) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return serveUntil(ctx, args, stdout, stderr)
}

// serveUntil runs the worker until ctx ends, then drains it: /health
// answers 503, requests in flight finish (up to --drain-timeout), and the
// scheduler stops.
func serveUntil(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	preset := fs.String("preset", "", "random weights of a built-in shape, byte-level text: tiny, deepseek-v2-lite")
	layers := fs.Int("layers", 0, "the preset's decoder layers (0: its own: tiny 3, deepseek-v2-lite 27)")
	dir := fs.String("model", "", "a checkpoint folder or .gguf file of a model moex runs whole; with its tokenizer (tokenizer.json, a GGUF vocabulary), text and chat requests are served (else requests give input_ids)")
	seed := fs.Uint64("seed", 1, "the preset's weights")
	host := fs.String("host", "127.0.0.1", "address to listen on")
	port := fs.Int("port", 30000, "port to listen on (0: any free one, printed)")
	blocks := fs.Int("kv-blocks", 1024, "latent-cache blocks per layer")
	blockRows := fs.Int("block-rows", 16, "tokens a cache block holds")
	kvName := fs.String("kv-dtype", "bf16", "KV cache dtype: bf16 (about 1e-3 of relative error in the logits), f16 (llama.cpp's default; values up to 65504; the CPU only) or f32 (the exact mode's)")
	numerics := fs.String("numerics", "exact", "the MoE experts' numerics: exact, int8dot (integer-code and MXFP4 experts, as llama.cpp computes them) or bf16dot (bf16 experts); --backend cpu")
	budget := fs.Int("max-step-tokens", 512, "tokens one forward pass takes at most (decode tokens, then prompt chunks)")
	dpSize := fs.Int("dp", 1, "data-parallel attention ranks in this instance, each with its own caches (--kv-blocks each) and requests")
	moeMode := fs.String("moe-mode", "alltoall", "--dp > 1: the MoE layers' experts sharded over the ranks, by alltoall (EP dispatch/combine) or gather")
	balance := fs.String("load-balance-method", serve.RoundRobin, "--dp > 1: how the controller gives requests to ranks: round_robin or shortest_queue")
	backend := fs.String("backend", "cpu", "cpu, or cuda: the attention blocks and the MoE experts on the GPU (needs a `make cuda` build; one rank)")
	interval := fs.Int("stream-interval", 1, "a stream sends a frame every this many tokens (and the last): fewer frames, less of the server's time")
	noCache := fs.Bool("disable-radix-cache", false, "compute every prompt whole: no prefix cache")
	drain := fs.Duration("drain-timeout", 30*time.Second, "on SIGTERM, how long requests in flight may take to finish")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	switch {
	case *preset != "" && *dir != "":
		return fmt.Errorf("%w: serve: give --preset or --model, not both", errUsage)
	case *preset == "" && *dir == "":
		return fmt.Errorf("%w: serve: give --preset tiny or --model DIR", errUsage)
	case *preset != "" && *preset != "tiny" && *preset != "deepseek-v2-lite":
		return fmt.Errorf("%w: serve: unknown --preset %q (have tiny, deepseek-v2-lite)", errUsage, *preset)
	case *layers < 0 || *layers > 1000 || (*layers > 0 && *preset == ""):
		return fmt.Errorf("%w: serve: --layers %d: a count in [1, 1000] for a --preset (0: the preset's own)", errUsage, *layers)
	case *blocks < 1 || *blockRows < 1 || *budget < 1:
		return fmt.Errorf("%w: serve: --kv-blocks, --block-rows and --max-step-tokens must be positive", errUsage)
	case *port < 0 || *port > 65535:
		return fmt.Errorf("%w: serve: --port %d must be in [0, 65535] (0: any free port)", errUsage, *port)
	case *dpSize < 1 || *dpSize > model.MaxDPRanks:
		return fmt.Errorf("%w: serve: --dp %d must be in [1, %d]", errUsage, *dpSize, model.MaxDPRanks)
	case *moeMode != "alltoall" && *moeMode != "gather":
		return fmt.Errorf("%w: serve: --moe-mode %q (have alltoall, gather)", errUsage, *moeMode)
	case *balance != serve.RoundRobin && *balance != serve.ShortestQueue:
		return fmt.Errorf("%w: serve: --load-balance-method %q (have %s, %s)", errUsage, *balance, serve.RoundRobin, serve.ShortestQueue)
	case *interval < 1 || *interval > 1<<20:
		return fmt.Errorf("%w: serve: --stream-interval %d must be in [1, 1048576]", errUsage, *interval)
	case *backend != "cpu" && *backend != "cuda":
		return fmt.Errorf("%w: serve: --backend %q (want cpu or cuda)", errUsage, *backend)
	case *backend == "cuda" && *dpSize > 1:
		return fmt.Errorf("%w: serve: --backend cuda runs one rank (--dp 1)", errUsage)
	case *drain <= 0:
		return fmt.Errorf("%w: serve: --drain-timeout %v must be positive", errUsage, *drain)
	}
	var m *model.Model
	kvDType, err := kvDTypeOf(*kvName)
	if err != nil {
		return fmt.Errorf("%w: serve: --kv-dtype %w", errUsage, err)
	}
	if kvDType == kernels.F16 && *backend != "cpu" {
		return fmt.Errorf("%w: serve: --kv-dtype f16 runs on the CPU: the device kernels read f32 or bf16 caches", errUsage)
	}
	numMode, err := kernels.ParseNumerics(*numerics)
	if err != nil {
		return fmt.Errorf("%w: serve: %w", errUsage, err)
	}
	if numMode != kernels.Exact && *backend != "cpu" {
		return fmt.Errorf("%w: serve: --numerics %v runs on --backend cpu", errUsage, numMode)
	}
	var tok serve.Tokenizer
	var stopIDs []int32
	name := *dir
	if *preset != "" {
		p := model.Tiny()
		if *preset == "deepseek-v2-lite" {
			p = model.DeepSeekV2Lite(27)
		}
		if *layers > 0 {
			p.Layers, p.FirstKDense = *layers, min(p.FirstKDense, *layers-1)
		}
		if m, err = model.NewRandom(p, *seed); err != nil {
			return fmt.Errorf("serve: %w (a smaller --layers may fit)", err)
		}
		tok, stopIDs, name = serve.Byte{}, []int32{serve.EOS}, p.Name
	} else {
		tok = serve.IDsOnly{}
		_, serr := os.Stat(filepath.Join(*dir, "tokenizer.json"))
		if serr == nil || strings.HasSuffix(*dir, ".gguf") {
			// The model's own text (a folder's tokenizer.json, a GGUF file's
			// vocabulary): prompts and chats as text, its end tokens.
			text, err := loadText(*dir, false)
			switch {
			case errors.Is(err, errNoVocab): // weights only: requests give input_ids
			case err != nil:
				return fmt.Errorf("serve: %w", err)
			default:
				if tok, stopIDs, err = text.serveText(); err != nil {
					return fmt.Errorf("serve: %w", err)
				}
			}
		}
		m, err = model.Load(*dir)
	}
	if err != nil {
		return err
	}
	defer m.Close()
	if numMode != kernels.Exact {
		if err := m.SetNumerics(numMode); err != nil {
			return fmt.Errorf("serve: %w", err)
		}
	}
	if *backend == "cuda" {
		closeDev, err := modelOnDevice(m)
		if err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		defer closeDev()
	}
	opts := serve.Options{Budget: *budget, NoPrefixCache: *noCache}
	kvs := make([]*model.KV, *dpSize)
	for r := range kvs {
		if kvs[r], err = m.NewKV(*blocks, *blockRows, kvDType); err != nil {
			return err
		}
	}
	var engine interface {
		serve.Engine
		Run(context.Context) error
	}
	if *dpSize == 1 {
		engine, err = serve.New(m, kvs[0], opts)
	} else {
		var dp *model.DP
		if dp, err = m.NewDP(*dpSize, *moeMode); err == nil {
			engine, err = serve.NewGroup(m, dp, kvs, opts, *balance)
		}
	}
	if err != nil {
		return err
	}
	api := serve.NewServer(engine, tok, stopIDs, serve.Info{ModelPath: name, StreamInterval: *interval,
		KVBytesPerToken: m.KVBytesPerToken(kvDType), KVDType: *kvName, ContextLength: m.Arch.ContextLength})
	ln, err := net.Listen("tcp", net.JoinHostPort(*host, fmt.Sprint(*port)))
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	schedCtx, stopSched := context.WithCancel(context.Background())
	schedDone := make(chan error, 1)
	go func() { schedDone <- engine.Run(schedCtx) }()
	srv := &http.Server{Handler: api.Handler(), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Fprintf(stdout, "moex serve: %s on http://%s (%d cache blocks of %d tokens per layer, %d tokens a step", name, ln.Addr(), *blocks, *blockRows, *budget)
	if *dpSize > 1 {
		fmt.Fprintf(stdout, "; %d DP attention ranks, each with its own blocks, MoE %s, %s", *dpSize, *moeMode, *balance)
	}
	fmt.Fprintln(stdout, ")")
	select {
	case <-ctx.Done():
	case err = <-served: // the listener failed
	case err = <-schedDone:
		err = fmt.Errorf("serve: the scheduler stopped: %w", err)
	}
	api.Drain()
	dctx, cancel := context.WithTimeout(context.Background(), *drain)
	defer cancel()
	if serr := srv.Shutdown(dctx); serr != nil && err == nil {
		err = fmt.Errorf("serve: draining: %w", serr)
	}
	stopSched()
	<-schedDone
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	fmt.Fprintln(stdout, "moex serve: stopped")
	return err
}

// modelOnDevice puts m's attention and experts on the device; the function
// returned frees them, after the model's last use.
func modelOnDevice(m *model.Model) (func(), error) {
	dev, err := openDeviceRun(false)
	if err != nil {
		return nil, err
	}
	var runners []io.Closer
	closeAll := func() {
		for _, r := range runners {
			r.Close()
		}
		dev.close()
	}
	err = m.UseDevice(attn.Backend{Core: dev.core, Proj: dev.proj}, func(l *moe.Layer) (moe.ExpertRunner, error) {
		r, err := dev.experts(0, l)
		if err == nil {
			runners = append(runners, r)
		}
		return r, err
	})
	if err != nil {
		closeAll()
		return nil, err
	}
	return closeAll, nil
}
