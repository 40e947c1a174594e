package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"

	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/internal/npy"
)

// execMLADecode runs MLA decode attention (absorbed form) on .npy inputs:
// q [batch, heads, D], a dense paged cache [num_blocks, block_size, D], a
// block table [batch, max_blocks] (unused entries -1) and lengths [batch].
func execMLADecode(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("exec mla-decode", flag.ContinueOnError)
	qPath := fs.String("q", "", "float32 .npy [batch, heads, D]")
	kvPath := fs.String("kv-cache", "", "float32 .npy [num_blocks, block_size, D]")
	btPath := fs.String("block-table", "", "int32 .npy [batch, max_blocks], unused entries -1")
	slPath := fs.String("seqlens", "", "int32 .npy [batch], each ≥ 1")
	dv := fs.Int("dv", 0, "value dimensions: the first dv columns of each cached row")
	scale := fs.Float64("scale", math.NaN(), "softmax scale applied to q·k")
	outPath := fs.String("out", "", "output float32 .npy [batch, heads, dv]")
	lsePath := fs.String("lse-out", "", "optional float32 .npy [batch, heads]: natural-log sum-exp of the scaled scores")
	split := fs.Int("split", 0, "split-KV chunk length in rows (0: default)")
	backend := fs.String("backend", "cpu", "cpu, or cuda (the GPU kernels; needs a `make cuda` build)")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	for _, f := range []struct{ name, v string }{{"--q", *qPath}, {"--kv-cache", *kvPath}, {"--block-table", *btPath},
		{"--seqlens", *slPath}, {"--out", *outPath}} {
		if f.v == "" {
			return fmt.Errorf("%w: exec mla-decode: %s is required", errUsage, f.name)
		}
	}
	scaleSet := false
	fs.Visit(func(f *flag.Flag) { scaleSet = scaleSet || f.Name == "scale" })
	switch {
	case *dv <= 0:
		return fmt.Errorf("%w: exec mla-decode: --dv must be positive (got %d)", errUsage, *dv)
	case !scaleSet:
		return fmt.Errorf("%w: exec mla-decode: --scale is required (DeepSeek's: 1/sqrt(qk head dim), times yarn's mscale²)", errUsage)
	case !(*scale > 0) || math.IsInf(*scale, 0):
		return fmt.Errorf("%w: exec mla-decode: --scale %v must be a positive finite number", errUsage, *scale)
	case math.IsInf(float64(float32(*scale)), 0) || float32(*scale) == 0:
		return fmt.Errorf("%w: exec mla-decode: --scale %v is outside float32's range (the kernels' scale is a float32)", errUsage, *scale)
	case *split < 0:
		return fmt.Errorf("%w: exec mla-decode: --split %d must be a positive row count (or 0: the default)", errUsage, *split)
	}
	if err := checkFiles("exec mla-decode", [][2]string{{"--q", *qPath}, {"--kv-cache", *kvPath}, {"--block-table", *btPath}, {"--seqlens", *slPath}},
		[2]string{"--out", *outPath}, [2]string{"--lse-out", *lsePath}); err != nil {
		return err
	}
	q, err := npy.ReadFloat32(*qPath)
	if err != nil {
		return err
	}
	kv, err := npy.ReadFloat32(*kvPath)
	if err != nil {
		return err
	}
	bt, err := npy.ReadInt32(*btPath)
	if err != nil {
		return err
	}
	sl, err := npy.ReadInt32(*slPath)
	if err != nil {
		return err
	}
	if len(q.Shape) != 3 {
		return fmt.Errorf("%s: shape %v, want [batch, heads, D]", *qPath, q.Shape)
	}
	B, H, D := q.Shape[0], q.Shape[1], q.Shape[2]
	if len(kv.Shape) != 3 || kv.Shape[2] != D || kv.Shape[0] < 1 || kv.Shape[1] < 1 {
		return fmt.Errorf("%s: shape %v, want [num_blocks, block_size, %d]", *kvPath, kv.Shape, D)
	}
	if len(bt.Shape) != 2 || bt.Shape[0] != B {
		return fmt.Errorf("%s: shape %v, want [%d, max_blocks]", *btPath, bt.Shape, B)
	}
	if len(sl.Shape) != 1 || sl.Shape[0] != B {
		return fmt.Errorf("%s: shape %v, want [%d]", *slPath, sl.Shape, B)
	}
	if *dv > D {
		return fmt.Errorf("exec mla-decode: --dv %d is larger than D %d", *dv, D)
	}
	MB := bt.Shape[1]
	queries := make([]attn.Query, B)
	for b := range queries {
		if sl.Data[b] < 1 {
			return fmt.Errorf("%s: sequence %d has length %d, need at least 1", *slPath, b, sl.Data[b])
		}
		queries[b] = attn.Query{Table: bt.Data[b*MB : (b+1)*MB], Len: int(sl.Data[b])}
	}
	var out, lse []float32
	switch *backend {
	case "cpu":
		cache := attn.DenseBlocks{Data: kv.Data, NBlocks: kv.Shape[0], BlockRows: kv.Shape[1], Width: D}
		out, lse = make([]float32, B*H**dv), make([]float32, B*H)
		if err := attn.MLA(context.Background(), cache, q.Data, queries, attn.MLAParams{Heads: H, ValueDim: *dv, Scale: float32(*scale), SplitRows: *split}, out, lse); err != nil {
			return fmt.Errorf("exec mla-decode (--q %s, --kv-cache %s, --block-table %s, --seqlens %s): %w", *qPath, *kvPath, *btPath, *slPath, err)
		}
	case "cuda":
		if out, lse, err = mlaOnDevice(mlaJob{q: q.Data, cache: kv.Data, blockSize: kv.Shape[1], d: D,
			blockTable: bt.Data, maxBlocks: MB, seqLens: sl.Data, heads: H, dv: *dv, split: *split,
			scale: float32(*scale)}); err != nil {
			return err
		}
	default:
		return fmt.Errorf("%w: exec mla-decode: --backend %q (want cpu or cuda)", errUsage, *backend)
	}
	if err := npy.WriteFloat32(*outPath, []int{B, H, *dv}, out); err != nil {
		return err
	}
	if *lsePath != "" {
		return npy.WriteFloat32(*lsePath, []int{B, H}, lse)
	}
	return nil
}

// mlaJob is an exec mla-decode batch for the device backend.
type mlaJob struct {
	q, cache                       []float32
	blockTable, seqLens            []int32
	blockSize, d, maxBlocks, heads int
	dv, split                      int
	scale                          float32
}
