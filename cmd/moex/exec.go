package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/moex-project/moex/internal/npy"
	"github.com/moex-project/moex/moe"
)

func cmdExec(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: exec needs a block: exec moe ...", errUsage)
	}
	switch args[0] {
	case "moe":
		return execMoE(args[1:], stderr)
	}
	return fmt.Errorf("%w: exec: unknown block %q (have: moe)", errUsage, args[0])
}

// execMoE runs one MoE block of a checkpoint on x.npy [tokens, hidden].
func execMoE(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("exec moe", flag.ContinueOnError)
	model := fs.String("model", "", "Hugging Face checkpoint folder (config.json + *.safetensors)")
	layer := fs.Int("layer", -1, "index of the MoE layer")
	input := fs.String("input", "", "float32 .npy [tokens, hidden]")
	out := fs.String("out", "", "output float32 .npy [tokens, hidden]")
	idsOut := fs.String("ids-out", "", "optional int32 .npy [tokens, top_k]: chosen experts, each row ascending")
	wOut := fs.String("weights-out", "", "optional float32 .npy [tokens, top_k]: routing weights in the order of the ids")
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
	x, err := npy.ReadFloat32(*input)
	if err != nil {
		return err
	}
	l, err := moe.Load(*model, *layer)
	if err != nil {
		return err
	}
	defer l.Close()
	H, K := l.Config.Hidden, l.Config.TopK
	if len(x.Shape) != 2 || x.Shape[1] != H {
		return fmt.Errorf("%s: shape %v, want [tokens, %d]", *input, x.Shape, H)
	}
	T := x.Shape[0]
	y := make([]float32, T*H)
	ids := make([]int32, T*K)
	w := make([]float32, T*K)
	if err := l.ForwardRouting(context.Background(), x.Data, y, ids, w); err != nil {
		return err
	}
	if err := npy.WriteFloat32(*out, []int{T, H}, y); err != nil {
		return err
	}
	if *idsOut != "" {
		if err := npy.WriteInt32(*idsOut, []int{T, K}, ids); err != nil {
			return err
		}
	}
	if *wOut != "" {
		if err := npy.WriteFloat32(*wOut, []int{T, K}, w); err != nil {
			return err
		}
	}
	return nil
}
