package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/moex-project/moex/model"
)

// cmdGGUF runs `moex gguf write`: a GGUF file of a preset's shapes with
// random weights, for benchmarks and comparisons that need no download.
func cmdGGUF(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "write" {
		return fmt.Errorf("%w: gguf: want `gguf write --preset P --type T --out F.gguf`", errUsage)
	}
	fs := flag.NewFlagSet("gguf write", flag.ContinueOnError)
	preset := fs.String("preset", "", "the shapes: qwen3-30b-a3b, gpt-oss-20b or deepseek-v2-lite (llama.cpp reads it at its 27 layers only)")
	layers := fs.Int("layers", 0, "layers (0: the model's own count); fewer cut the depth and the file")
	typ := fs.String("type", "q4_k_m", "the tensors' types: "+strings.Join(model.GGUFMixes, ", "))
	out := fs.String("out", "", "the file to write")
	seed := fs.Uint64("seed", 1, "seed of the random weights")
	if err := parseFlags(fs, args[1:], stderr); err != nil {
		return err
	}
	ps, ok := modelPresets[*preset]
	switch {
	case *out == "":
		return fmt.Errorf("%w: gguf write: give --out", errUsage)
	case !ok || (*preset != "qwen3-30b-a3b" && *preset != "gpt-oss-20b" && *preset != "deepseek-v2-lite"):
		return fmt.Errorf("%w: gguf write: --preset %q (want qwen3-30b-a3b, gpt-oss-20b or deepseek-v2-lite)", errUsage, *preset)
	case !slices.Contains(model.GGUFMixes, *typ):
		return fmt.Errorf("%w: gguf write: --type %q (want %s)", errUsage, *typ, strings.Join(model.GGUFMixes, ", "))
	}
	n := *layers
	if n == 0 {
		n = ps.layers
	}
	if n < 1 || n > ps.layers {
		return fmt.Errorf("%w: gguf write: --layers %d (the preset has %d)", errUsage, n, ps.layers)
	}
	if err := checkFiles("gguf write", nil, [2]string{"--out", *out}); err != nil {
		return err
	}
	start := time.Now()
	// Written beside the destination and renamed into place, so that a
	// failure leaves no partial file under the name.
	f, err := os.CreateTemp(filepath.Dir(*out), ".moex-gguf-*")
	if err != nil {
		return fmt.Errorf("gguf write: %w", err)
	}
	defer os.Remove(f.Name())
	p := ps.make(n)
	if *preset == "deepseek-v2-lite" {
		p.Vocab = 102400 // its own vocabulary, as a downloaded file's embedding and output (bench model's preset keeps the bytes')
	}
	if err := model.WriteGGUF(f, p, *typ, *seed); err != nil {
		f.Close()
		return fmt.Errorf("gguf write: %w", err)
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return fmt.Errorf("gguf write: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("gguf write: %w", err)
	}
	if err := os.Rename(f.Name(), *out); err != nil {
		return fmt.Errorf("gguf write: %w", err)
	}
	fi, err := os.Stat(*out)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "wrote %s: %s, %d layers, %s, %.2f GB in %v\n", *out, *preset, n, *typ, float64(fi.Size())/1e9,
		time.Since(start).Round(time.Second))
	return err
}
