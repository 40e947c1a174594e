package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/moex-project/moex/loadgen"
)

// benchServe is `moex bench serve`: a load generator against a worker or
// a router (SGLang's bench_serving), until done or SIGINT, which stops
// sending and reports what ended.
func benchServe(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench serve", flag.ContinueOnError)
	var urls workerList
	fs.Var(&urls, "url", "the worker or router (default http://127.0.0.1:30000); several: the requests alternate between them")
	dataset := fs.String("dataset", "generated-shared-prefix", "generated-shared-prefix or random")
	groups := fs.Int("groups", 16, "generated-shared-prefix: system prompts")
	perGroup := fs.Int("prompts-per-group", 8, "generated-shared-prefix: questions per system prompt")
	systemLen := fs.Int("system-len", 1024, "generated-shared-prefix: system prompt tokens (bytes)")
	questionLen := fs.Int("question-len", 64, "generated-shared-prefix: question tokens (bytes)")
	zipf := fs.Float64("zipf", 0, "generated-shared-prefix: draw groups from a Zipf law of this exponent (> 1; 0: every group alike)")
	numPrompts := fs.Int("num-prompts", 128, "random: prompts")
	inputLen := fs.Int("input-len", 512, "random: prompt tokens (bytes) at most")
	rangeRatio := fs.Float64("range-ratio", 1, "random: lengths drawn from [len·ratio, len]")
	outputLen := fs.Int("output-len", 32, "tokens each request generates (ignore_eos)")
	rate := fs.String("rate", "inf", "requests per second, Poisson arrivals; inf: all at once")
	concurrency := fs.Int("concurrency", 0, "requests in flight at most (0: no limit)")
	inputIDs := fs.Bool("input-ids", false, "send prompts as input_ids (their bytes), for workers that read no tokenizer")
	seed := fs.Uint64("seed", 1, "the dataset's and the arrivals' random streams")
	timeout := fs.Duration("timeout", 10*time.Minute, "one request's limit")
	format := fs.String("format", "table", "table or json")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	r := math.Inf(1)
	if *rate != "inf" {
		v, err := strconv.ParseFloat(*rate, 64)
		if err != nil || !(v > 0) || math.IsInf(v, 0) {
			return fmt.Errorf("%w: bench serve: --rate %q must be a positive number of requests per second, or inf", errUsage, *rate)
		}
		r = v
	}
	if len(urls) == 0 {
		urls = workerList{"http://127.0.0.1:30000"}
	}
	if *format != "table" && *format != "json" {
		return fmt.Errorf("%w: bench serve: --format %q (have table, json)", errUsage, *format)
	}
	if *timeout <= 0 {
		return fmt.Errorf("%w: bench serve: --timeout %v must be positive", errUsage, *timeout)
	}
	var prompts []loadgen.Prompt
	var err error
	switch *dataset {
	case "generated-shared-prefix":
		prompts, err = loadgen.SharedPrefix(*groups, *perGroup, *systemLen, *questionLen, *outputLen, *zipf, *seed)
	case "random":
		prompts, err = loadgen.Random(*numPrompts, *inputLen, *outputLen, *rangeRatio, *seed)
	default:
		return fmt.Errorf("%w: bench serve: unknown --dataset %q (have generated-shared-prefix, random)", errUsage, *dataset)
	}
	if err != nil {
		return fmt.Errorf("%w: bench serve: %v", errUsage, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rep, err := loadgen.Run(ctx, loadgen.Config{URL: urls[0], MoreURLs: urls[1:], Rate: r, Concurrency: *concurrency, InputIDs: *inputIDs,
		Seed: *seed, Timeout: *timeout, Progress: stderr}, prompts)
	if err != nil {
		return fmt.Errorf("%w: bench serve: %v", errUsage, err)
	}
	if *format == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(stdout, "bench serve: %s, %d prompts to %s, rate %s, concurrency %d\n", *dataset, len(prompts), urls.String(), *rate, *concurrency)
		rep.Write(stdout)
	}
	if rep.Completed == 0 {
		return fmt.Errorf("bench serve: no request completed (first error: %s)", rep.Errors[0])
	}
	return nil
}
