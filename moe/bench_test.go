package moe_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// BenchmarkForward: a DeepSeek-V2-Lite expert shape (hidden 2048, inter
// 1408, top-6, two shared experts) with 16 experts instead of 64 to keep
// the setup short, bf16, fp8 and mxfp4 weights; decode and batch sizes.
func BenchmarkForward(b *testing.B) {
	cfg := moe.DeepSeekV2Lite()
	cfg.NumExperts = 16
	for _, dt := range []kernels.DType{kernels.BF16, kernels.F8E4M3, kernels.MXFP4} {
		l, err := moe.NewRandom(cfg, dt, 1)
		require.NoError(b, err)
		benchForward(b, l, dt)
	}
}

func benchForward(b *testing.B, l *moe.Layer, dt kernels.DType) {
	cfg := l.Config
	for _, tokens := range []int{1, 16, 128} {
		b.Run(fmt.Sprintf("%v/tokens=%d", dt, tokens), func(b *testing.B) {
			x := moetest.Input(1, tokens, cfg.Hidden, false)
			y := make([]float32, len(x))
			b.SetBytes(0)
			for b.Loop() {
				if err := l.Forward(context.Background(), x, y); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(cfg.FLOPs(tokens)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// BenchmarkFamilies: gpt-oss-20b's expert shape (hidden = inter = 2880,
// top-4) with 8 experts, as gpt_oss (router bias, expert biases, the
// clamped SwiGLU) and as a qwen3_moe layer of the same shape (plain
// SwiGLU): what gpt_oss's epilogues cost.
func BenchmarkFamilies(b *testing.B) {
	oss := moe.GptOss20B()
	oss.NumExperts = 8
	plain := &moe.Config{ModelType: "qwen3_moe", Hidden: oss.Hidden, NumExperts: 8, TopK: oss.TopK, Inter: oss.Inter,
		Scoring: moe.Softmax, Method: moe.Greedy, NormTopK: true, RoutedScaling: 1, SparseStep: 1}
	for _, dt := range []kernels.DType{kernels.BF16, kernels.MXFP4} {
		for _, cfg := range []*moe.Config{oss, plain} {
			l, err := moe.NewRandom(cfg, dt, 1)
			require.NoError(b, err)
			b.Run(cfg.ModelType, func(b *testing.B) { benchForward(b, l, dt) })
		}
	}
}
