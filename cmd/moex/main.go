// Command moex runs, checks and measures the MoE engine.
//
//	moex run      DP-attention decode steps of one layer over in-process (or MPI) ranks, checked against one rank
//	moex serve    a worker behind SGLang's and OpenAI's HTTP APIs (continuous batching, radix cache, DP ranks)
//	moex route    the cache-aware router in front of workers
//	moex exec     one block or a whole model on .npy inputs: exec moe | mla-decode | logits
//	moex bench    kernels and layers against a baseline of the same run: grouped-gemm | moe | mla | ep | membw | serve
//	moex sim      a model of decode deployments (TP attention, DP attention with gather or all-to-all MoE)
//	moex tokenize text ↔ token ids with the model's own tokenizer and chat template, as JSON lines
//	moex gguf     write a GGUF file of a model's shapes with random weights (gguf write), readable by llama.cpp
//	moex info     what this machine offers (CPU features, GPUs)
//
// `moex <command> -h` lists a command's flags; docs/cli.md has them all.
//
// Errors are printed on one line to stderr and exit with status 1 (2 for
// bad usage).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"

	"github.com/moex-project/moex/internal/memlimit"
)

// errUsage marks an error in the command line itself.
var errUsage = errors.New("usage")

// maxGoroutineRanks bounds in-process ranks and benchmark threads: each is
// a goroutine with buffers of its own, and beyond this many a typo (an
// extra zero or three) would run for minutes or exhaust memory.
const maxGoroutineRanks = 1024

// checkFiles refuses, before any work, output files that name the same
// file twice (by path, through a link, or as one file's two hard links), a
// directory, or a folder that does not exist: an error after the work would
// leave the outputs written so far behind, and two outputs in one file
// would leave only the last; and an output that is one of the inputs (ins:
// the flag and path of each), which writing it would destroy.
func checkFiles(cmd string, ins [][2]string, outs ...[2]string) error {
	type file struct {
		flag, path, abs string
		fi              os.FileInfo // nil: no file there yet
	}
	var inputs []file
	for _, in := range ins {
		if in[1] != "" {
			abs, _ := filepath.Abs(in[1])
			fi, _ := os.Stat(in[1])
			inputs = append(inputs, file{in[0], in[1], abs, fi})
		}
	}
	var seen []file
	for _, o := range outs {
		flagName, path := o[0], o[1]
		if path == "" {
			continue
		}
		abs, err := filepath.Abs(path)
		if err != nil {
			return fmt.Errorf("%w: %s: %s %q: %v", errUsage, cmd, flagName, path, err)
		}
		fi, err := os.Stat(path)
		if err != nil {
			fi = nil
			if target, lerr := os.Readlink(path); lerr == nil { // a link to a file not made yet
				if !filepath.IsAbs(target) {
					target = filepath.Join(filepath.Dir(abs), target)
				}
				abs = filepath.Clean(target)
			}
		} else if fi.IsDir() {
			return fmt.Errorf("%w: %s: %s %s is a directory", errUsage, cmd, flagName, path)
		}
		for _, prev := range seen {
			if prev.abs == abs || prev.fi != nil && fi != nil && os.SameFile(prev.fi, fi) {
				return fmt.Errorf("%w: %s: %s %s and %s %s are the same file", errUsage, cmd, prev.flag, prev.path, flagName, path)
			}
		}
		for _, in := range inputs {
			if in.abs == abs || in.fi != nil && fi != nil && os.SameFile(in.fi, fi) {
				return fmt.Errorf("%w: %s: %s %s is the input %s %s: writing it would destroy the input", errUsage, cmd, flagName, path, in.flag, in.path)
			}
		}
		seen = append(seen, file{flagName, path, abs, fi})
		dir := filepath.Dir(abs)
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			return fmt.Errorf("%w: %s: %s %s: the folder %s does not exist", errUsage, cmd, flagName, path, dir)
		}
	}
	return nil
}

// deadlineError names --deadline when it is what ended the job.
func deadlineError(err error, d time.Duration) error {
	if err != nil && d > 0 && errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("--deadline %v passed before the job finished: %w", d, err)
	}
	return err
}

// softMemoryLimit sets the Go collector's soft limit to three quarters of
// the machine's memory, unless GOMEMLIMIT says otherwise. A model's
// repacked weights are a large live heap, and the default pacing lets
// garbage grow to as much again before a collection: on a 24 GiB machine
// an int8-dot DeepSeek-V2-Lite (11 GiB of weights) was killed for memory
// at a 2048-token prompt, and finished with the limit.
func softMemoryLimit() {
	if _, set := os.LookupEnv("GOMEMLIMIT"); set {
		return
	}
	if m := memlimit.Machine(); m != math.MaxUint64 {
		debug.SetMemoryLimit(int64(m / 4 * 3))
	}
}

func main() {
	softMemoryLimit()
	err := run(os.Args[1:], os.Stdout, os.Stderr)
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
	case errors.Is(err, errUsage):
		fmt.Fprintln(os.Stderr, "moex:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "moex:", err)
		os.Exit(1)
	}
}

const usage = `usage: moex <command> [flags]

commands:
  run    decode steps of one layer (MLA attention + MoE) over DP-attention ranks, each with its own
         requests and latent cache, in all-to-all or gather mode, checked against one rank
         (DeepSeek-V2-Lite shapes, random weights, unless --model)
  serve  a worker behind SGLang's and OpenAI's HTTP APIs, with continuous batching, a radix prefix cache
         and DP attention ranks: serve --preset tiny|deepseek-v2-lite | --model DIR [--port 30000] [--dp N]
  route  a cache-aware router in front of workers: route --worker URL ... [--policy cache_aware] [--port 30000]
  exec   run one block on .npy inputs: exec moe --model DIR --layer N --input x.npy --out y.npy
         exec mla-decode --q q.npy --kv-cache kv.npy --block-table bt.npy --seqlens sl.npy --dv 512 --scale S --out o.npy
         exec logits --model DIR --input-ids ids.npy --out logits.npy   (a whole model's prefill)
  bench  measure kernels and layers: bench grouped-gemm | moe | mla | ep | membw; a worker or router: bench serve
  sim    a model of decode deployments (TP attention, DP attention with gather or all-to-all MoE) on
         GPU presets or this CPU: sim --preset deepseek-v3 --hardware h200 --ranks 64 [--sweep batch --plot p.svg]
  tokenize  text ↔ token ids with a model's own tokenizer, and its chat template, as JSON lines on
         stdin → stdout: tokenize --model DIR [--no-special] [--decode [--skip-special]] [--chat]
  gguf   write a GGUF file of a model's real shapes with random weights, readable by llama.cpp:
         gguf write --preset qwen3-30b-a3b|gpt-oss-20b [--layers N] [--type q4_k_m] --out F.gguf
  info   report this machine's CPU features and GPUs
`

func run(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return fmt.Errorf("%w: no command given", errUsage)
	}
	switch args[0] {
	case "run":
		return cmdRun(args[1:], stdout, stderr)
	case "exec":
		return cmdExec(args[1:], stdout, stderr)
	case "serve":
		return cmdServe(args[1:], stdout, stderr)
	case "route":
		return cmdRoute(args[1:], stdout, stderr)
	case "sim":
		return cmdSim(args[1:], stdout, stderr)
	case "info":
		return cmdInfo(args[1:], stdout, stderr)
	case "tokenize":
		return cmdTokenize(args[1:], stdout, stderr)
	case "bench":
		return cmdBench(args[1:], stdout, stderr)
	case "gguf":
		return cmdGGUF(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("%w: unknown command %q", errUsage, args[0])
}

// parseFlags parses fs, turning flag errors into usage errors and refusing
// stray arguments.
func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer) error {
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %s: %v", errUsage, fs.Name(), err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: %s: unexpected argument %q", errUsage, fs.Name(), fs.Arg(0))
	}
	return nil
}
