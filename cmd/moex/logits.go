package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/moex-project/moex/internal/npy"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/model"
)

// execLogits runs a prefill of one sequence through a whole
// model (a family model.Load runs whole) and writes every position's logits.
func execLogits(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("exec logits", flag.ContinueOnError)
	dir := fs.String("model", "", "checkpoint folder or .gguf file of a model moex runs whole (folders: deepseek_v2/v3, qwen3_moe, qwen2_moe, mixtral, olmoe, gpt_oss, glm4_moe; GGUF: deepseek2, qwen3moe, qwen2moe, gpt-oss, glm4moe, olmoe, llama with experts)")
	idsPath := fs.String("input-ids", "", "int32 .npy [tokens]: one sequence's token ids, from position 0")
	out := fs.String("out", "", "output float32 .npy [tokens, vocab]: the logits of every position (the last row predicts the next token)")
	deadline := fs.Duration("deadline", 0, "give up after this long (0: no limit)")
	numerics := fs.String("numerics", "exact", "exact, int8dot or bf16dot: the mode of the matrices' products (see docs/numerics.md), as bench model and serve take it")
	kvName := fs.String("kv", "f32", "the KV cache's dtype: f32, bf16 or f16")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	for _, f := range []struct{ name, v string }{{"--model", *dir}, {"--input-ids", *idsPath}, {"--out", *out}} {
		if f.v == "" {
			return fmt.Errorf("%w: exec logits: %s is required", errUsage, f.name)
		}
	}
	kvDType, err := kvDTypeOf(*kvName)
	if err != nil {
		return fmt.Errorf("%w: exec logits: --kv %w", errUsage, err)
	}
	mode, err := kernels.ParseNumerics(*numerics)
	if err != nil {
		return fmt.Errorf("%w: exec logits: %w", errUsage, err)
	}
	if *deadline < 0 {
		return fmt.Errorf("%w: exec logits: --deadline %v must be positive (or 0: no limit)", errUsage, *deadline)
	}
	if err := checkFiles("exec logits", [][2]string{{"--input-ids", *idsPath}}, [2]string{"--out", *out}); err != nil {
		return err
	}
	ids, err := npy.ReadInt32(*idsPath)
	if err != nil {
		return err
	}
	if len(ids.Shape) != 1 || ids.Shape[0] < 1 {
		return fmt.Errorf("%s: shape %v, want [tokens] with at least one token", *idsPath, ids.Shape)
	}
	m, err := model.Load(*dir)
	if err != nil {
		return err
	}
	defer m.Close()
	if mode != kernels.Exact {
		if err := m.SetNumerics(mode); err != nil {
			return fmt.Errorf("exec logits: %w", err)
		}
	}
	const blockRows = 16
	kv, err := m.NewKV((len(ids.Data)+blockRows-1)/blockRows, blockRows, kvDType)
	if err != nil {
		return err
	}
	ctx, cancel := withDeadline(*deadline)
	defer cancel()
	logits, err := m.Forward(ctx, kv, make([]int, len(ids.Data)), ids.Data, nil)
	if err != nil {
		return deadlineError(fmt.Errorf("%s: %w", *idsPath, err), *deadline)
	}
	return npy.WriteFloat32(*out, []int{len(ids.Data), m.Vocab}, logits)
}

// kvDTypeOf is the KV cache dtype a flag names: f32, bf16 or f16 (fp16,
// llama.cpp's default: bf16's bytes, three more bits of mantissa, values
// up to 65504).
func kvDTypeOf(name string) (kernels.DType, error) {
	if d, err := dtypeOf(name); err == nil && (d == kernels.F32 || d == kernels.BF16 || d == kernels.F16) {
		return d, nil
	}
	return 0, fmt.Errorf("%q (want f32, bf16 or f16)", name)
}
