// Command moex runs, checks and measures the MoE engine.
//
//	moex run  [flags]                 DP-attention decode steps of one layer over in-process (or MPI) ranks, checked against one rank
//	moex exec moe --model DIR --layer N --input x.npy --out y.npy [--ids-out ids.npy] [--weights-out w.npy]
//	moex exec mla-decode --q q.npy --kv-cache kv.npy --block-table bt.npy --seqlens sl.npy --dv 512 --scale S --out o.npy [--lse-out lse.npy]
//	moex bench grouped-gemm|moe|mla|ep|membw  time kernels and layers against a baseline of the same run
//	moex info                         what this machine offers (CPU features, GPUs)
//
// Errors are printed on one line to stderr and exit with status 1 (2 for
// bad usage).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

// errUsage marks an error in the command line itself.
var errUsage = errors.New("usage")

func main() {
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
  exec   run one block on .npy inputs: exec moe --model DIR --layer N --input x.npy --out y.npy
         exec mla-decode --q q.npy --kv-cache kv.npy --block-table bt.npy --seqlens sl.npy --dv 512 --scale S --out o.npy
  bench  measure kernels and layers: bench grouped-gemm | moe | mla | ep | membw
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
	case "info":
		return cmdInfo(args[1:], stdout, stderr)
	case "bench":
		return cmdBench(args[1:], stdout, stderr)
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
