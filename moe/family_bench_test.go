package moe_test

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/moe"
)

var (
	familyShape = flag.String("family-shape", "128,64,8,2",
		"BenchmarkFamilyCheckpoints' hidden,inter,experts,top_k (e.g. 2048,1408,8,6)")
	familyRounds = flag.Int("family-rounds", 1,
		"BenchmarkFamilyCheckpoints times every family this many times in turn")
)

// BenchmarkFamilyCheckpoints writes a bf16 checkpoint of every family at one
// shape (-family-shape; a shared expert, dense MLP or shared experts of the
// routed width where the family has one), loads it through moe.Load as
// moex bench moe --model does, and times the layer at 1, 16 and 128
// tokens. The five families moex ran first are in the same run, so each
// new family compares with qwen3_moe (no shared expert) or deepseek_v2 (a
// shared expert) of its shape. Routing differs by family, so above one
// token the experts a batch touches differ too. Every layer is loaded
// first, then each token count times the families in turn, -family-rounds
// times over, so that a drift of the machine falls on all of them alike.
func BenchmarkFamilyCheckpoints(b *testing.B) {
	var H, I, E, K int
	if _, err := fmt.Sscanf(*familyShape, "%d,%d,%d,%d", &H, &I, &E, &K); err != nil {
		b.Fatalf("-family-shape %q: %v", *familyShape, err)
	}
	const vocab = 64
	specs := []moetest.Spec{
		{ModelType: "qwen3_moe", NormTopK: true},
		{ModelType: "deepseek_v2", SharedExperts: 1, Method: "greedy", Scoring: "softmax", NGroup: 1, TopKGroup: 1},
		{ModelType: "qwen2_moe", SharedInter: I, NormTopK: true},
		{ModelType: "deepseek_v3", SharedExperts: 1, Method: "noaux_tc", Scoring: "sigmoid", NGroup: 1, TopKGroup: 1, NormTopK: true, Scaling: 2.5},
		{ModelType: "mixtral"},
		{ModelType: "qwen3_next", SharedInter: I, NormTopK: true},
		{ModelType: "qwen3_5_moe", SharedInter: I},
		{ModelType: "qwen3_vl_moe", NormTopK: true},
		{ModelType: "olmoe"},
		{ModelType: "glm4_moe", SharedExperts: 1, NGroup: 1, TopKGroup: 1, NormTopK: true, Scaling: 2.5},
		{ModelType: "dots1", SharedExperts: 1, NGroup: 1, TopKGroup: 1, NormTopK: true, Scaling: 2.5},
		{ModelType: "minimax_m2"},
		{ModelType: "ernie4_5_moe", SharedExperts: 1},
		{ModelType: "llama4"},
		{ModelType: "gpt_oss"},
		{ModelType: "deepseek_v4", SharedExperts: 1, Scaling: 1.5, NumLayers: 2, Layer: 1, HashLayers: 1, Vocab: vocab},
		{ModelType: "deepseek_v4", SharedExperts: 1, Scaling: 1.5, NumLayers: 2, Layer: 0, HashLayers: 1, Vocab: vocab},
		{ModelType: "gemma4", DenseInter: I},
		{ModelType: "step3_text", SharedInter: I, NumLayers: 2, Layer: 1},
	}
	type loaded struct {
		name string
		l    *moe.Layer
	}
	var layers []loaded
	defer func() {
		for _, l := range layers {
			require.NoError(b, l.l.Close())
		}
	}()
	for i, s := range specs {
		s.Hidden, s.Inter, s.Experts, s.DType, s.Seed = H, I, E, "BF16", uint64(900+i)
		if s.TopK == 0 {
			s.TopK = K
		}
		name := s.ModelType
		if s.Hash() {
			name += "-hash"
		}
		dir := b.TempDir()
		m, err := moetest.Generate(s)
		require.NoError(b, err)
		require.NoError(b, m.WriteTo(dir))
		m = nil
		runtime.GC()
		l, err := moe.Load(dir, s.Layer)
		require.NoError(b, err)
		layers = append(layers, loaded{name, l})
	}
	for _, tokens := range []int{1, 16, 128} {
		x := moetest.Input(1, tokens, H, false)
		ids := moetest.Tokens(2, tokens, vocab)
		y := make([]float32, len(x))
		for r := range *familyRounds {
			for _, l := range layers {
				b.Run(fmt.Sprintf("tokens=%d/round=%d/%s", tokens, r, l.name), func(b *testing.B) {
					for b.Loop() {
						if err := l.l.ForwardTokens(context.Background(), x, ids, y, nil, nil); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(l.l.Config.FLOPs(tokens)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				})
			}
		}
	}
}
