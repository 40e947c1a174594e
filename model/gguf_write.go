package model

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"

	"github.com/moex-project/moex/arch"
	"github.com/moex-project/moex/format"
	"github.com/moex-project/moex/format/gguf"
	"github.com/moex-project/moex/moe"
	"github.com/moex-project/moex/tokenizer"
)

// GGUFMixes are the tensor-type mixes WriteGGUF writes, by the names
// llama.cpp's users know.
var GGUFMixes = []string{"q4_k_m", "q8_0", "q4_0", "mxfp4", "bf16", "f16"}

// WriteGGUF writes a GGUF file of preset p with random weights (the same
// for the same seed), readable by llama.cpp and by Load: a grouped-query
// preset whose family llama.cpp runs (qwen3_moe as qwen3moe, gpt_oss as
// gpt-oss), or DeepSeek-V2's MLA without q-LoRA (deepseek_v2 as deepseek2:
// V2-Lite, which llama.cpp recognises by its 27 layers, so that only a
// preset of 27 layers is a file llama.cpp reads; moex reads any; see
// writeMLALayers), its tensors under llama.cpp's names and in the types
// mix names, quantized by gguf.Encode:
//
//   - q4_k_m: as llama.cpp's Q4_K_M: Q4_K, with Q6_K for output.weight and
//     for attn_v and ffn_down(_exps) on the layers llama.cpp gives more
//     bits (the first and last eighth, every third between); a tensor
//     whose rows are not whole 256-value blocks falls back to Q8_0 (and
//     one whose rows are not whole 32-value blocks, in every mix, to F16);
//   - q8_0, q4_0, bf16, f16: every matrix in that type;
//   - mxfp4: the experts in MXFP4 (as gpt-oss ships them), every other
//     matrix in Q8_0.
//
// Norms, biases, sinks and the router (ffn_gate_inp, as llama.cpp's
// quantizer leaves it) are F32 in every mix. Values are uniform in
// ±1/√fan_in for projections, in ±1 for the embedding, 1 ± 0.2 for norms.
// The vocabulary is p.Vocab byte-level tokens: GPT-2's 256 byte
// characters, then "<N>" placeholders, the last an end-of-text control
// token; no merges (text encodes to bytes).
func WriteGGUF(w io.Writer, p Preset, mix string, seed uint64) error {
	g := p.GQA
	var a string
	switch {
	case g != nil && p.MoE.ModelType == "qwen3_moe":
		a = "qwen3moe"
	case g != nil && p.MoE.ModelType == "gpt_oss":
		a = "gpt-oss"
	case g == nil && p.MoE.ModelType == "deepseek_v2" && p.Attn.QLoraRank == nil && p.MoE.Method == moe.Greedy && p.MoE.Scoring == moe.Softmax:
		a = "deepseek2"
	default:
		return fmt.Errorf("model: write GGUF of preset %q: %w: moex writes qwen3_moe, gpt_oss and deepseek_v2 presets (llama.cpp's qwen3moe, gpt-oss and deepseek2)",
			p.Name, format.ErrUnsupported)
	}
	if y := p.Attn.Scaling; a == "deepseek2" && y != nil && y.Type == "yarn" && (y.MScale != y.MScaleAllDm || y.BetaFast != 32 || y.BetaSlow != 1) {
		return fmt.Errorf("model: write GGUF of preset %q: %w: a deepseek2 file's yarn has one mscale and beta_fast 32, beta_slow 1; the preset's are %v, %v, %v, %v",
			p.Name, format.ErrUnsupported, y.MScale, y.MScaleAllDm, y.BetaFast, y.BetaSlow)
	}
	known := false
	for _, m := range GGUFMixes {
		known = known || m == mix
	}
	if !known {
		return fmt.Errorf("model: write GGUF: mix %q: %w (have %s)", mix, format.ErrUnsupported, strings.Join(GGUFMixes, ", "))
	}
	if p.Layers < 1 || p.Vocab < 257 || p.FirstKDense < 0 || p.FirstKDense >= p.Layers || p.FirstKDense > 0 && a != "deepseek2" {
		return fmt.Errorf("model: write GGUF of preset %q: %d layers (%d dense), vocabulary %d: want layers, dense ones only before MoE ones of deepseek2, more than the 256 bytes",
			p.Name, p.Layers, p.FirstKDense, p.Vocab)
	}
	H, E, I := p.MoE.Hidden, p.MoE.NumExperts, p.MoE.Inter
	typeOf := func(name string, layer, cols int) gguf.Type {
		moreBits := layer < 0 || layer < p.Layers/8 || layer >= 7*p.Layers/8 || (layer-p.Layers/8)%3 == 2
		t := gguf.Q8_0
		switch mix {
		case "q4_k_m":
			t = gguf.Q4_K
			if name == "output" || (name == "attn_v" || name == "ffn_down_exps") && moreBits {
				t = gguf.Q6_K
			}
		case "q4_0":
			t = gguf.Q4_0
		case "mxfp4":
			if strings.HasSuffix(name, "_exps") {
				t = gguf.MXFP4
			}
		case "bf16":
			t = gguf.BF16
		case "f16":
			t = gguf.F16
		}
		if uint64(cols)%t.BlockSize() != 0 {
			t = gguf.Q8_0
		}
		if uint64(cols)%t.BlockSize() != 0 {
			t = gguf.F16
		}
		return t
	}
	var tensors []gguf.TensorOut
	// add appends a tensor of n stacked [rows, cols] matrices (n 0: one
	// matrix; rows 0: a vector of cols) of values uniform in ±scale
	// around around, made and encoded in chunks of rows on GOMAXPROCS
	// goroutines, each chunk from a generator of its own (the values do
	// not depend on the goroutines).
	add := func(name string, n, rows, cols int, scale float64, around float64, t gguf.Type) {
		dims := []uint64{uint64(cols)}
		if rows > 0 {
			dims = append(dims, uint64(rows))
		}
		if n > 0 {
			dims = append(dims, uint64(n))
		}
		idx := uint64(len(tensors))
		tensors = append(tensors, gguf.TensorOut{Name: name, Dims: dims, Type: t, Data: func() ([]byte, error) {
			total := max(rows, 1) * max(n, 1)
			rowBytes := cols / int(t.BlockSize()) * int(t.BlockBytes())
			chunk := max(1, (1<<18)/cols) // rows a chunk: about a megabyte of values
			out := make([]byte, total*rowBytes)
			chunks := (total + chunk - 1) / chunk
			errs := make([]error, chunks)
			var wg sync.WaitGroup
			next := make(chan int)
			for range runtime.GOMAXPROCS(0) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					v := make([]float32, chunk*cols)
					for c := range next {
						r := min(chunk, total-c*chunk)
						rng := rand.New(rand.NewPCG(seed, idx<<32|uint64(c)))
						for i := range v[:r*cols] {
							v[i] = float32(around + scale*(2*rng.Float64()-1))
						}
						b, err := gguf.Encode(t, v[:r*cols], r, cols)
						copy(out[c*chunk*rowBytes:], b)
						errs[c] = err
					}
				}()
			}
			for c := range chunks {
				next <- c
			}
			close(next)
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					return nil, err
				}
			}
			return out, nil
		}})
	}
	// mat is projection prefix+base+".weight" of layer (−1: none).
	mat := func(prefix, base string, layer, rows, cols int) {
		add(prefix+base+".weight", 0, rows, cols, 1/math.Sqrt(float64(cols)), 0, typeOf(base, layer, cols))
	}
	vec := func(name string, n int, scale, around float64) { add(name, 0, 0, n, scale, around, gguf.F32) }
	add("token_embd.weight", 0, p.Vocab, H, 1, 0, typeOf("token_embd", -1, H))
	vec("output_norm.weight", H, 0.2, 1)
	mat("", "output", -1, p.Vocab, H)
	post := "ffn_norm"
	if a == "gpt-oss" {
		post = "post_attention_norm" // llama.cpp's name for gpt-oss's norm before the MoE block
	}
	if a == "deepseek2" {
		writeMLALayers(p, add, mat, vec, typeOf)
	}
	for l := range p.Layers {
		if a == "deepseek2" {
			break
		}
		b := fmt.Sprintf("blk.%d.", l)
		vec(b+"attn_norm.weight", H, 0.2, 1)
		q, kv := g.Heads*g.HeadDim, g.KVHeads*g.HeadDim
		mat(b, "attn_q", l, q, H)
		mat(b, "attn_k", l, kv, H)
		mat(b, "attn_v", l, kv, H)
		mat(b, "attn_output", l, H, q)
		if g.Bias {
			vec(b+"attn_q.bias", q, 0.1, 0)
			vec(b+"attn_k.bias", kv, 0.1, 0)
			vec(b+"attn_v.bias", kv, 0.1, 0)
		}
		if g.OutBias {
			vec(b+"attn_output.bias", H, 0.1, 0)
		}
		if g.Sinks {
			vec(b+"attn_sinks.weight", g.Heads, 1, 0)
		}
		if g.QKNorm == arch.QKNormHead {
			vec(b+"attn_q_norm.weight", g.HeadDim, 0.2, 1)
			vec(b+"attn_k_norm.weight", g.HeadDim, 0.2, 1)
		}
		vec(b+post+".weight", H, 0.2, 1)
		add(b+"ffn_gate_inp.weight", 0, E, H, 1/math.Sqrt(float64(H)), 0, gguf.F32)
		if p.MoE.RouterBias {
			vec(b+"ffn_gate_inp.bias", E, 0.1, 0)
		}
		for _, x := range []struct {
			name       string
			rows, cols int
		}{{"ffn_gate_exps", I, H}, {"ffn_up_exps", I, H}, {"ffn_down_exps", H, I}} {
			add(b+x.name+".weight", E, x.rows, x.cols, 1/math.Sqrt(float64(x.cols)), 0, typeOf(x.name, l, x.cols))
			if p.MoE.ExpertBias {
				add(b+x.name+".bias", 0, E, x.rows, 0.1, 0, gguf.F32)
			}
		}
	}
	u := func(v int) uint32 { return uint32(v) }
	kvs := []gguf.KV{{Key: "general.architecture", Value: a}, {Key: "general.name", Value: p.Name + " (random weights, " + mix + ")"},
		{Key: a + ".context_length", Value: u(p.Context)}, {Key: a + ".embedding_length", Value: u(H)},
		{Key: a + ".block_count", Value: u(p.Layers)}, {Key: a + ".feed_forward_length", Value: u(p.DenseInter)},
		{Key: a + ".attention.layer_norm_rms_epsilon", Value: float32(p.RMSNormEps)},
		{Key: a + ".expert_count", Value: u(E)}, {Key: a + ".expert_used_count", Value: u(p.MoE.TopK)},
		{Key: a + ".expert_feed_forward_length", Value: u(I)}}
	if a == "deepseek2" {
		kvs = append(kvs, mlaKVs(p)...)
	} else {
		kvs = append(kvs, gguf.KV{Key: a + ".attention.head_count", Value: u(g.Heads)}, gguf.KV{Key: a + ".attention.head_count_kv", Value: u(g.KVHeads)},
			gguf.KV{Key: a + ".attention.key_length", Value: u(g.HeadDim)}, gguf.KV{Key: a + ".attention.value_length", Value: u(g.HeadDim)},
			gguf.KV{Key: a + ".rope.freq_base", Value: float32(p.RoPEBase)})
	}
	if g != nil && g.Window > 0 {
		kvs = append(kvs, gguf.KV{Key: a + ".attention.sliding_window", Value: u(g.Window)})
	}
	if s := p.RoPEScaling; s.Type != "" && a != "deepseek2" {
		kvs = append(kvs, gguf.KV{Key: a + ".rope.scaling.type", Value: s.Type}, gguf.KV{Key: a + ".rope.scaling.factor", Value: float32(s.Factor)},
			gguf.KV{Key: a + ".rope.scaling.original_context_length", Value: uint32(s.OrigMaxPos)})
	}
	tokens, types := make([]string, p.Vocab), make([]int32, p.Vocab)
	for i := range tokens {
		tokens[i], types[i] = fmt.Sprintf("<%d>", i), 1 // normal
		if i < 256 {
			tokens[i] = tokenizer.ByteLevelChar(byte(i))
		}
	}
	eos := p.Vocab - 1
	tokens[eos], types[eos] = "<|endoftext|>", 3 // control
	pre := map[string]string{"qwen3moe": "qwen2", "gpt-oss": "gpt-4o", "deepseek2": "deepseek-llm"}[a]
	kvs = append(kvs, gguf.KV{Key: "tokenizer.ggml.model", Value: "gpt2"}, gguf.KV{Key: "tokenizer.ggml.pre", Value: pre},
		gguf.KV{Key: "tokenizer.ggml.tokens", Value: tokens}, gguf.KV{Key: "tokenizer.ggml.token_type", Value: types},
		gguf.KV{Key: "tokenizer.ggml.merges", Value: []string{}}, gguf.KV{Key: "tokenizer.ggml.eos_token_id", Value: u(eos)},
		gguf.KV{Key: "tokenizer.ggml.bos_token_id", Value: u(eos)}, gguf.KV{Key: "tokenizer.ggml.add_bos_token", Value: false})
	return gguf.Write(w, kvs, tensors)
}

// writeMLALayers adds the layers of a deepseek2 file (DeepSeek-V2 without
// q-LoRA) as llama.cpp's converter writes them since it runs MLA: per
// layer attn_q, attn_kv_a_mqa and its norm, kv_b_proj split per head into
// attn_k_b [heads, kv_lora_rank, nope] (the key half, transposed) and
// attn_v_b [heads, v, kv_lora_rank], attn_output; the first FirstKDense
// layers a dense SwiGLU MLP, the others the routed experts, the router
// and the shared experts (_shexp) of their summed width.
func writeMLALayers(p Preset, add func(name string, n, rows, cols int, scale, around float64, t gguf.Type),
	mat func(prefix, base string, layer, rows, cols int), vec func(name string, n int, scale, around float64),
	typeOf func(name string, layer, cols int) gguf.Type) {
	at, H, E, I := p.Attn, p.MoE.Hidden, p.MoE.NumExperts, p.MoE.Inter
	L, nh, nope, rope, vd := at.KVLoraRank, at.Heads, at.NopeDim, at.RopeDim, at.VDim
	// stacked adds n matrices [rows, cols] under one name, fan-in cols.
	stacked := func(name, base string, layer, n, rows, cols int) {
		add(name, n, rows, cols, 1/math.Sqrt(float64(cols)), 0, typeOf(base, layer, cols))
	}
	for l := range p.Layers {
		b := fmt.Sprintf("blk.%d.", l)
		vec(b+"attn_norm.weight", H, 0.2, 1)
		mat(b, "attn_q", l, nh*(nope+rope), H)
		mat(b, "attn_kv_a_mqa", l, L+rope, H)
		vec(b+"attn_kv_a_norm.weight", L, 0.2, 1)
		// kv_b_proj's fan-in is the latent: both halves scaled by 1/√L.
		add(b+"attn_k_b.weight", nh, L, nope, 1/math.Sqrt(float64(L)), 0, typeOf("attn_k_b", l, nope))
		add(b+"attn_v_b.weight", nh, vd, L, 1/math.Sqrt(float64(L)), 0, typeOf("attn_v_b", l, L))
		mat(b, "attn_output", l, H, nh*vd)
		vec(b+"ffn_norm.weight", H, 0.2, 1)
		if l < p.FirstKDense {
			mat(b, "ffn_gate", l, p.DenseInter, H)
			mat(b, "ffn_up", l, p.DenseInter, H)
			mat(b, "ffn_down", l, H, p.DenseInter)
			continue
		}
		add(b+"ffn_gate_inp.weight", 0, E, H, 1/math.Sqrt(float64(H)), 0, gguf.F32)
		stacked(b+"ffn_gate_exps.weight", "ffn_gate_exps", l, E, I, H)
		stacked(b+"ffn_up_exps.weight", "ffn_up_exps", l, E, I, H)
		stacked(b+"ffn_down_exps.weight", "ffn_down_exps", l, E, H, I)
		if S := p.MoE.SharedInter; S > 0 {
			mat(b, "ffn_gate_shexp", l, S, H)
			mat(b, "ffn_up_shexp", l, S, H)
			mat(b, "ffn_down_shexp", l, H, S)
		}
	}
}

// mlaKVs are a deepseek2 file's attention and MoE keys, as llama.cpp's
// converter writes them for MLA: one key/value head of key_length
// kv_lora_rank + rope and value_length kv_lora_rank, the per-head widths
// as key_length_mla and value_length_mla; DeepSeek's yarn as its scaling
// type, factor, original context and log multiplier (0.1 ×
// mscale_all_dim; GGUF keeps no separate mscale, and readers take it equal
// to mscale_all_dim, as in DeepSeek-V2's configs; beta_fast and beta_slow
// are left to their defaults, 32 and 1, which are V2's); the shared
// experts as a count of expert widths.
func mlaKVs(p Preset) []gguf.KV {
	at, a := p.Attn, "deepseek2"
	u := func(v int) uint32 { return uint32(v) }
	kvs := []gguf.KV{{Key: a + ".attention.head_count", Value: u(at.Heads)}, {Key: a + ".attention.head_count_kv", Value: u(1)},
		{Key: a + ".attention.key_length", Value: u(at.KVLoraRank + at.RopeDim)}, {Key: a + ".attention.value_length", Value: u(at.KVLoraRank)},
		{Key: a + ".attention.key_length_mla", Value: u(at.NopeDim + at.RopeDim)}, {Key: a + ".attention.value_length_mla", Value: u(at.VDim)},
		{Key: a + ".attention.kv_lora_rank", Value: u(at.KVLoraRank)}, {Key: a + ".rope.dimension_count", Value: u(at.RopeDim)},
		{Key: a + ".rope.freq_base", Value: float32(at.RopeTheta)}, {Key: a + ".leading_dense_block_count", Value: u(p.FirstKDense)},
		{Key: a + ".expert_shared_count", Value: u(p.MoE.SharedInter / max(p.MoE.Inter, 1))},
		{Key: a + ".expert_weights_scale", Value: float32(p.MoE.RoutedScaling)}, {Key: a + ".expert_weights_norm", Value: p.MoE.NormTopK},
		{Key: a + ".expert_gating_func", Value: u(1)}, {Key: a + ".vocab_size", Value: u(p.Vocab)}}
	if y := at.Scaling; y != nil && y.Type == "yarn" {
		kvs = append(kvs, gguf.KV{Key: a + ".rope.scaling.type", Value: "yarn"}, gguf.KV{Key: a + ".rope.scaling.factor", Value: float32(y.Factor)},
			gguf.KV{Key: a + ".rope.scaling.original_context_length", Value: u(int(y.OrigMaxPos))},
			gguf.KV{Key: a + ".rope.scaling.yarn_log_multiplier", Value: float32(0.1 * y.MScaleAllDm)})
	}
	return kvs
}
