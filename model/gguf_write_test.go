package model_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/arch"
	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/format"
	"github.com/moex-project/moex/format/gguf"
	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/internal/tokref"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/model"
	"github.com/moex-project/moex/moe"
)

// smallQwen3 and smallGptOss are the two families WriteGGUF writes at
// small shapes: hidden 256 (whole Q4_K blocks), head_dim 64, 4 query
// heads over 2, a vocabulary of 512; gpt-oss with a window of 8 on its
// even layers, so that a prompt of 24 runs past it.
func smallQwen3(layers int) model.Preset {
	m := moe.Config{ModelType: "qwen3_moe", Name: "qwen3_moe", Hidden: 256, NumExperts: 8, TopK: 2, Inter: 256,
		Scoring: moe.Softmax, Method: moe.Greedy, NormTopK: true, RoutedScaling: 1}
	g := &attn.GQAConfig{Hidden: 256, Heads: 4, KVHeads: 2, HeadDim: 64, QKNorm: arch.QKNormHead, NormEps: 1e-6}
	return model.Preset{Name: "qwen3-small", MoE: m, GQA: g, Vocab: 512, Layers: layers, DenseInter: 512, RMSNormEps: 1e-6,
		RoPEBase: 1e6, Context: 4096}
}

func smallGptOss(layers int) model.Preset {
	m := *moe.GptOss20B()
	m.Hidden, m.NumExperts, m.TopK, m.Inter = 256, 4, 2, 256
	g := &attn.GQAConfig{Hidden: 256, Heads: 4, KVHeads: 2, HeadDim: 64, Bias: true, OutBias: true, Sinks: true, Window: 8, NormEps: 1e-5}
	y := kernels.RoPEScaling{Type: "yarn", Factor: 32, OrigMaxPos: 4096, BetaFast: 32, BetaSlow: 1}
	return model.Preset{Name: "gpt-oss-small", MoE: m, GQA: g, Vocab: 512, Layers: layers, DenseInter: 256, RMSNormEps: 1e-5,
		RoPEBase: 150000, RoPEScaling: y, Context: 4096}
}

// smallDeepSeek is DeepSeek-V2-Lite's structure (MLA without q-LoRA over
// a latent of 256 + 32 with its yarn RoPE, a dense first layer, 8 routed
// experts top-2 and two shared) at hidden 256 and its 27 layers: llama.cpp
// reads a deepseek2 file without q-LoRA only at V2-Lite's layer count.
func smallDeepSeek() model.Preset {
	m := moe.Config{ModelType: "deepseek_v2", Name: "deepseek_v2", Hidden: 256, NumExperts: 8, TopK: 2, Inter: 256, SharedInter: 512,
		Scoring: moe.Softmax, Method: moe.Greedy, RoutedScaling: 1}
	a := attn.MLAConfig{Hidden: 256, Heads: 4, KVLoraRank: 256, NopeDim: 64, RopeDim: 32, VDim: 64, RopeTheta: 10000, RMSNormEps: 1e-6,
		Scaling: &attn.YarnScaling{Type: "yarn", Factor: 40, OrigMaxPos: 4096, BetaFast: 32, BetaSlow: 1, MScale: 0.707, MScaleAllDm: 0.707}}
	return model.Preset{Name: "deepseek-small", MoE: m, Attn: a, Vocab: 512, Layers: 27, FirstKDense: 1, DenseInter: 512, RMSNormEps: 1e-6,
		Context: 4096}
}

func writeGGUF(t *testing.T, p model.Preset, mix string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), p.Name+"-"+mix+".gguf")
	f, err := os.Create(path)
	require.NoError(t, err)
	require.NoError(t, model.WriteGGUF(f, p, mix, 7))
	require.NoError(t, f.Close())
	return path
}

// TestWriteGGUFTypes: each mix puts each tensor in the type it names:
// Q4_K_M's Q6_K on output and on attn_v and ffn_down_exps of the first and
// last eighth of the layers and every third between (of 8 layers: 0, 3,
// 6, 7, as llama.cpp's use_more_bits picks them), the router, norms,
// biases and sinks in F32; the file loads as the preset's model.
func TestWriteGGUFTypes(t *testing.T) {
	p := smallQwen3(8)
	m, err := gguf.OpenModel(writeGGUF(t, p, "q4_k_m"))
	require.NoError(t, err)
	typ := func(name string) gguf.Type {
		ti, err := m.Tensor(name)
		require.NoError(t, err, name)
		return ti.Type
	}
	require.Equal(t, gguf.Q6_K, typ("output.weight"))
	require.Equal(t, gguf.Q4_K, typ("token_embd.weight"))
	require.Equal(t, gguf.F32, typ("output_norm.weight"))
	for l := range 8 {
		want := gguf.Q4_K
		if l == 0 || l == 3 || l == 6 || l == 7 {
			want = gguf.Q6_K
		}
		b := fmt.Sprintf("blk.%d.", l)
		require.Equal(t, want, typ(b+"attn_v.weight"), l)
		require.Equal(t, want, typ(b+"ffn_down_exps.weight"), l)
		for _, name := range []string{"attn_q", "attn_k", "attn_output", "ffn_gate_exps", "ffn_up_exps"} {
			require.Equal(t, gguf.Q4_K, typ(b+name+".weight"), b+name)
		}
		for _, name := range []string{"ffn_gate_inp.weight", "attn_norm.weight", "ffn_norm.weight", "attn_q_norm.weight", "attn_k_norm.weight"} {
			require.Equal(t, gguf.F32, typ(b+name), b+name)
		}
	}
	ti, err := m.Tensor("blk.2.ffn_down_exps.weight")
	require.NoError(t, err)
	require.Equal(t, []uint64{256, 256, 8}, ti.Dims)
	require.NoError(t, m.Close())

	g := smallGptOss(2)
	m, err = gguf.OpenModel(writeGGUF(t, g, "mxfp4"))
	require.NoError(t, err)
	require.Equal(t, gguf.MXFP4, typ("blk.1.ffn_gate_exps.weight"))
	require.Equal(t, gguf.Q8_0, typ("blk.1.attn_q.weight"))
	require.Equal(t, gguf.F32, typ("blk.1.attn_sinks.weight"))
	require.Equal(t, gguf.F32, typ("blk.1.ffn_down_exps.bias"))
	require.Equal(t, gguf.F32, typ("blk.1.post_attention_norm.weight"))
	require.NoError(t, m.Close())

	// deepseek2: the MLA tensors (attn_k_b's rows of 64 are not whole
	// Q4_K blocks: Q8_0), the dense first layer, the shared experts.
	d := smallDeepSeek()
	m, err = gguf.OpenModel(writeGGUF(t, d, "q4_k_m"))
	require.NoError(t, err)
	for name, want := range map[string]gguf.Type{"blk.0.ffn_gate.weight": gguf.Q4_K, "blk.0.ffn_down.weight": gguf.Q4_K,
		"blk.1.attn_q.weight": gguf.Q4_K, "blk.1.attn_kv_a_mqa.weight": gguf.Q4_K, "blk.1.attn_kv_a_norm.weight": gguf.F32,
		"blk.1.attn_k_b.weight": gguf.Q8_0, "blk.1.attn_v_b.weight": gguf.Q4_K, "blk.1.attn_output.weight": gguf.Q4_K,
		"blk.1.ffn_gate_inp.weight": gguf.F32, "blk.1.ffn_up_shexp.weight": gguf.Q4_K, "blk.1.ffn_down_exps.weight": gguf.Q6_K,
		"blk.3.ffn_down_exps.weight": gguf.Q4_K, "blk.5.ffn_down_exps.weight": gguf.Q6_K} {
		require.Equal(t, want, typ(name), name)
	}
	_, err = m.Tensor("blk.0.ffn_down_exps.weight")
	require.Error(t, err, "a dense layer has no experts")
	for name, dims := range map[string][]uint64{"blk.1.attn_k_b.weight": {64, 256, 4}, "blk.1.attn_v_b.weight": {256, 64, 4},
		"blk.1.attn_kv_a_mqa.weight": {256, 288}, "blk.1.ffn_down_shexp.weight": {512, 256}, "blk.1.ffn_gate_exps.weight": {256, 256, 8}} {
		ti, err := m.Tensor(name)
		require.NoError(t, err)
		require.Equal(t, dims, ti.Dims, name)
	}
	require.NoError(t, m.Close())
	mod, err := model.Load(writeGGUF(t, d, "q8_0"))
	require.NoError(t, err)
	a := mod.Arch.Attention
	require.Equal(t, []int{4, 256, 64, 32, 64, 27, 1, 512}, []int{a.Heads, a.KVLoraRank, a.NopeDim, a.RopeDim, a.VDim, mod.Arch.Layers, mod.Arch.FirstKDense, mod.Vocab})
	require.NoError(t, mod.Close())

	for _, tc := range []struct {
		p   model.Preset
		mix string
	}{{p, "q4_k_m"}, {p, "q8_0"}, {g, "mxfp4"}, {g, "bf16"}} {
		mod, err := model.Load(writeGGUF(t, tc.p, tc.mix))
		require.NoError(t, err, tc.mix)
		a := mod.Arch
		require.Equal(t, tc.p.MoE.ModelType, a.Family)
		require.Equal(t, []int{4, 2, 64, tc.p.Layers, 512}, []int{a.Attention.Heads, a.Attention.KVHeads, a.Attention.HeadDim, a.Layers, a.Vocab})
		require.Equal(t, tc.p.GQA.Window, a.Attention.Window)
		logits, err := mod.Prefill(context.Background(), []int32{1, 2, 3})
		require.NoError(t, err)
		for _, x := range logits {
			require.False(t, math.IsNaN(float64(x)) || math.IsInf(float64(x), 0))
		}
		require.NoError(t, mod.Close())
	}

	var sink strings.Builder
	qLoRA := model.Tiny() // MLA with q-LoRA: DeepSeek-V2's and V3's, not written
	r := 16
	qLoRA.Attn.QLoraRank = &r
	err = model.WriteGGUF(&sink, qLoRA, "q8_0", 1)
	require.ErrorIs(t, err, format.ErrUnsupported)
	require.ErrorContains(t, err, `preset "tiny"`)
	skew := smallDeepSeek() // a yarn a deepseek2 file cannot state
	y := *skew.Attn.Scaling
	y.MScale = 1
	skew.Attn.Scaling = &y
	err = model.WriteGGUF(&sink, skew, "q8_0", 1)
	require.ErrorIs(t, err, format.ErrUnsupported)
	require.ErrorContains(t, err, "one mscale")
	err = model.WriteGGUF(&sink, p, "q5_k_m", 1)
	require.ErrorIs(t, err, format.ErrUnsupported)
	require.ErrorContains(t, err, `mix "q5_k_m"`)
}

// TestWriteGGUFAgainstLlamaCpp holds moex to llama.cpp on files moex
// writes: llama.cpp (the prebuilt CPU build in node-llama-cpp, installed
// by `make test` into scripts/llamacpp) generates 12 greedy tokens after
// a 24-token prompt; moex, fed the prompt and those tokens, must rank
// each of llama.cpp's tokens first, or within 2 % of its top logit's
// magnitude (llama.cpp rounds activations to 8 bits for its quantized dot
// products and keeps its KV cache in f16: near-ties may fall either way).
// A wrong tensor, layout or semantics gives unrelated tokens.
func TestWriteGGUFAgainstLlamaCpp(t *testing.T) {
	script := filepath.Join(tokref.Root(), "scripts", "llamacpp", "bench.mjs")
	if _, err := os.Stat(filepath.Join(tokref.Root(), "scripts", "llamacpp", "node_modules", "@node-llama-cpp", "linux-x64")); err != nil {
		if os.Getenv("MOEX_REQUIRE_TOKREF") == "1" {
			t.Fatalf("llama.cpp's prebuilt libraries are not installed (scripts/llamacpp/install.sh): %v", err)
		}
		t.Skip("llama.cpp's prebuilt libraries are not installed: scripts/llamacpp/install.sh (make test installs them)")
	}
	prompt := make([]int32, 24)
	var ids []string
	for i := range prompt {
		prompt[i] = int32((i*97 + 13) % 512)
		ids = append(ids, fmt.Sprint(prompt[i]))
	}
	for _, tc := range []struct {
		p   model.Preset
		mix string
	}{{smallQwen3(3), "q4_k_m"}, {smallQwen3(2), "q8_0"}, {smallGptOss(2), "mxfp4"}, {smallDeepSeek(), "q4_k_m"}} {
		t.Run(tc.p.Name+"-"+tc.mix, func(t *testing.T) {
			path := writeGGUF(t, tc.p, tc.mix)
			ctx, cancel := context.WithTimeout(context.Background(), 3*60e9)
			defer cancel()
			out, err := exec.CommandContext(ctx, "node", script, "greedy", path, strings.Join(ids, ","), "12", "2").Output()
			require.NoError(t, err, "%s", out)
			var res struct {
				Tokens []int32 `json:"tokens"`
			}
			require.NoError(t, json.Unmarshal(out, &res), "%s", out)
			require.Len(t, res.Tokens, 12)
			mod, err := model.Load(path)
			require.NoError(t, err)
			defer mod.Close()
			logits, err := mod.Prefill(ctx, append(append([]int32(nil), prompt...), res.Tokens[:11]...))
			require.NoError(t, err)
			exact := 0
			for i, tok := range res.Tokens {
				row := logits[(len(prompt)-1+i)*512:][:512]
				best := 0
				for j, x := range row {
					if x > row[best] {
						best = j
					}
				}
				if best == int(tok) {
					exact++
				}
				gap := float64(row[best] - row[tok])
				require.LessOrEqual(t, gap, 0.02*math.Abs(float64(row[best])),
					"step %d: llama.cpp's token %d is %v below moex's %d", i, tok, gap, best)
			}
			t.Logf("%d of 12 steps: moex's argmax is llama.cpp's token", exact)
			require.GreaterOrEqual(t, exact, 10, "of 12 steps, moex's argmax is llama.cpp's token at %d", exact)
		})
	}
}

// TestInt8DotWholeModel measures the int8-dot mode on whole models (the
// opt-in of run, serve and bench model): the logits of a 16-token prefill
// against the exact mode's on the same file (which the float64 references
// hold within 1e-4), for Q4_K_M, Q8_0 and MXFP4 experts. The error is that
// of rounding each activation row to int8 per 32, carried through the
// layers; it must be there (the mode runs) and stay within 5 %.
func TestInt8DotWholeModel(t *testing.T) {
	ids := make([]int32, 16)
	for i := range ids {
		ids[i] = int32((i*131 + 7) % 512)
	}
	for _, tc := range []struct {
		p   model.Preset
		mix string
	}{{smallQwen3(3), "q4_k_m"}, {smallQwen3(3), "q8_0"}, {smallGptOss(2), "mxfp4"}} {
		path := writeGGUF(t, tc.p, tc.mix)
		var logits [2][]float32
		for i, mode := range []kernels.Numerics{kernels.Exact, kernels.Int8Dot} {
			m, err := model.Load(path)
			require.NoError(t, err)
			require.NoError(t, m.SetNumerics(mode))
			got, n := m.Numerics()
			require.Equal(t, mode, got)
			if mode == kernels.Int8Dot { // the four projections of each layer's attention, and the output
				require.Equal(t, 4*tc.p.Layers+1, n, "%s %s: matrices outside the experts in int8dot", tc.p.Name, tc.mix)
				require.EqualError(t, m.UseDevice(attn.Backend{}, nil), "model: int8dot numerics run on the CPU kernels, not on a device: keep the exact mode there")
				require.NoError(t, m.SetNumerics(kernels.Int8Dot), "the mode it is in: nothing to do")
				require.EqualError(t, m.SetNumerics(kernels.Exact), "model: a model in int8dot numerics cannot go to exact: load it again")
				require.EqualError(t, m.SetNumerics(kernels.BF16Dot), "model: a model in int8dot numerics cannot go to bf16dot: load it again")
			} else {
				require.Zero(t, n)
			}
			logits[i], err = m.Prefill(context.Background(), ids)
			require.NoError(t, err)
			require.NoError(t, m.Close())
		}
		exact := make([]float64, len(logits[0]))
		for i, x := range logits[0] {
			exact[i] = float64(x)
		}
		e := moetest.RelErr(logits[1], exact)
		t.Logf("%s %s: int8dot against exact: relative error %.4e", tc.p.Name, tc.mix, e)
		require.Greater(t, e, 0.0, "%s %s: the int8-dot mode changed nothing", tc.p.Name, tc.mix)
		require.Less(t, e, 0.05, "%s %s", tc.p.Name, tc.mix)
	}
}
