package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/moex-project/moex/internal/npy"
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
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	for _, f := range []struct{ name, v string }{{"--model", *dir}, {"--input-ids", *idsPath}, {"--out", *out}} {
		if f.v == "" {
			return fmt.Errorf("%w: exec logits: %s is required", errUsage, f.name)
		}
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
	ctx, cancel := withDeadline(*deadline)
	defer cancel()
	logits, err := m.Prefill(ctx, ids.Data)
	if err != nil {
		return deadlineError(fmt.Errorf("%s: %w", *idsPath, err), *deadline)
	}
	return npy.WriteFloat32(*out, []int{len(ids.Data), m.Vocab}, logits)
}
