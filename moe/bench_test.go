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

// BenchmarkFamilies runs each family whose experts compute more than
// SwiGLU beside a plain layer of the same shape, so that the ratio is what
// its epilogues, scores and norms cost: gpt-oss-20b's expert shape (hidden
// = inter = 2880, top-4; router bias, expert biases, the clamped SwiGLU)
// beside qwen3_moe; DeepSeek-V4-Flash's (hidden 4096, inter 2048, top-6,
// a shared expert; sqrt-softplus scores, the clamped SiLU) beside
// deepseek_v3's sigmoid noaux_tc; and a Gemma 4 block (hidden 2816, inter
// 704, top-8, a dense MLP of 2112; router norm, GeGLU, five norms) beside
// qwen2_moe-style routing with a shared expert of the dense MLP's width.
// Each with 8 experts, to keep the setup short.
func BenchmarkFamilies(b *testing.B) {
	oss := moe.GptOss20B()
	oss.NumExperts = 8
	v4 := moe.DeepSeekV4Flash()
	v4.NumExperts = 8
	v3 := &moe.Config{ModelType: "deepseek_v3", Hidden: v4.Hidden, NumExperts: 8, TopK: v4.TopK, Inter: v4.Inter, SharedInter: v4.SharedInter,
		Scoring: moe.Sigmoid, Method: moe.NoAuxTC, ScoreBiasInput: true, NumGroups: 1, TopKGroups: 1, NormTopK: true, NormEps: 1e-20,
		RoutedScaling: 1.5}
	gemma := &moe.Config{ModelType: "gemma4", Hidden: 2816, NumExperts: 8, TopK: 8, Inter: 704, SharedInter: 2112,
		Scoring: moe.Softmax, Method: moe.Greedy, NormTopK: true, RoutedScaling: 1, ResidualInput: true, RMSNormEps: 1e-6,
		Act: kernels.Activation{Kind: kernels.GeGLU}, SharedAct: kernels.Activation{Kind: kernels.GeGLU}}
	plain := func(c *moe.Config) *moe.Config {
		return &moe.Config{ModelType: "qwen3_moe", Hidden: c.Hidden, NumExperts: c.NumExperts, TopK: c.TopK, Inter: c.Inter,
			SharedInter: c.SharedInter, Scoring: moe.Softmax, Method: moe.Greedy, NormTopK: true, RoutedScaling: 1}
	}
	for _, pair := range [][2]*moe.Config{{oss, plain(oss)}, {v4, v3}, {gemma, plain(gemma)}, {plain(gemma), gemma}} {
		for _, dt := range []kernels.DType{kernels.BF16, kernels.MXFP4} {
			if dt == kernels.MXFP4 && pair[0] != oss {
				continue
			}
			for _, cfg := range pair {
				l, err := moe.NewRandom(cfg, dt, 1)
				require.NoError(b, err)
				b.Run(pair[0].ModelType+"/"+cfg.ModelType, func(b *testing.B) { benchForward(b, l, dt) })
			}
		}
	}
}
