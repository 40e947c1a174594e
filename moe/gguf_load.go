package moe

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"

	"github.com/moex-project/moex/format/gguf"
	"github.com/moex-project/moex/internal/errkind"
	"github.com/moex-project/moex/kernels"
)

// A GGUF file's metadata is mapped onto the Hugging Face config.json keys
// of the family llama.cpp converted it from, and parsed by ParseConfig: the
// one definition of each family's block serves both formats. Per
// architecture (llama.cpp's convert_hf_to_gguf.py writes the keys, its
// llama-model.cpp reads them):
//
//	deepseek2: expert_count, expert_used_count, expert_feed_forward_length,
//	  expert_shared_count (× the expert width), leading_dense_block_count,
//	  expert_weights_scale (routed_scaling_factor, default 1),
//	  expert_weights_norm (norm_topk_prob, default false),
//	  expert_gating_func (1 softmax, 2 sigmoid; default softmax),
//	  expert_group_count and expert_group_used_count (n_group, topk_group).
//	  GGUF keeps no topk_method: a layer with exp_probs_b is noaux_tc
//	  (DeepSeek-V3's), else groups > 1 mean group_limited_greedy, else greedy.
//	glm4moe: the same keys, as glm4_moe (always noaux_tc, exp_probs_b).
//	Both: block_count includes nextn_predict_layers, the MTP layers stored
//	after the model's.
//	qwen3moe: as qwen3_moe, renormalised (llama.cpp always renormalises it).
//	qwen2moe: as qwen2_moe, not renormalised, the shared expert of
//	  expert_shared_feed_forward_length behind ffn_gate_inp_shexp.
//	llama with expert_count (Mixtral): as mixtral.
//	gpt-oss: as gpt_oss (its router and experts' biases as ffn_*.bias, the
//	  clamped SwiGLU at its default limit of 7).

// hfConfig is the config.json of the file's architecture: its model_type
// and the keys its metadata gives.
// hasTensor reports whether the model (every shard of a split one) holds
// a tensor; hfConfig looks for exp_probs_b with it.
func hfConfig(g *gguf.Header, path string, hasTensor func(suffix string) bool) (map[string]any, error) {
	arch := g.Metadata["general.architecture"].Str
	if arch == "" {
		return nil, errkind.Errorf(ErrGGUF, "moe: gguf: %s: no general.architecture", path)
	}
	var missing, bad []string
	num := func(key string, def ...float64) float64 {
		v, ok := g.Metadata[arch+"."+key]
		if f, isNum := v.AsFloat(); ok && isNum {
			if math.IsNaN(f) || math.IsInf(f, 0) {
				bad = append(bad, fmt.Sprintf("%s.%s is %v", arch, key, f))
			}
			return f
		}
		if ok && v.Type == gguf.Bool {
			if v.Bool {
				return 1
			}
			return 0
		}
		if ok {
			bad = append(bad, fmt.Sprintf("%s.%s is a %s, not a number", arch, key, v.Type))
			return 0
		}
		if len(def) > 0 {
			return def[0]
		}
		missing = append(missing, arch+"."+key)
		return 0
	}
	// block_count counts the multi-token-prediction layers llama.cpp
	// stores after the model's (nextn_predict_layers: GLM-4.5, DeepSeek-V3.2).
	nextn := num("nextn_predict_layers", 0)
	cfg := map[string]any{"hidden_size": num("embedding_length"), "num_hidden_layers": num("block_count") - nextn}
	switch arch {
	case "deepseek2", "glm4moe":
		inter := num("expert_feed_forward_length")
		groups := num("expert_group_count", 1)
		defGating := 1.0 // softmax: DeepSeek-V2's; GLM-4.5 scores with a sigmoid
		if arch == "glm4moe" {
			defGating = 2
		}
		sigmoid := num("expert_gating_func", defGating) == 2
		noaux := hasTensor(".exp_probs_b.bias")
		method, scoring, model := "greedy", "softmax", "deepseek_v2"
		switch {
		case arch == "glm4moe":
			method, model = "noaux_tc", "glm4_moe"
			cfg["num_nextn_predict_layers"] = nextn
		case noaux:
			method, model = "noaux_tc", "deepseek_v3"
		case groups > 1:
			method = "group_limited_greedy"
		}
		if sigmoid {
			scoring = "sigmoid"
		}
		for k, v := range map[string]any{"model_type": model, "n_routed_experts": num("expert_count"),
			"num_experts_per_tok": num("expert_used_count"), "moe_intermediate_size": inter,
			"n_shared_experts": num("expert_shared_count", 0), "first_k_dense_replace": num("leading_dense_block_count", 0),
			"moe_layer_freq": 1, "routed_scaling_factor": num("expert_weights_scale", 1),
			"norm_topk_prob": num("expert_weights_norm", 0) == 1, "scoring_func": scoring, "topk_method": method,
			"n_group": groups, "topk_group": num("expert_group_used_count", 1),
			"kv_lora_rank": num("attention.kv_lora_rank", 0), "qk_rope_head_dim": num("rope.dimension_count", 0)} {
			cfg[k] = v
		}
	case "qwen3moe", "qwen2moe":
		cfg["model_type"] = map[string]string{"qwen3moe": "qwen3_moe", "qwen2moe": "qwen2_moe"}[arch]
		cfg["num_experts"] = num("expert_count")
		cfg["num_experts_per_tok"] = num("expert_used_count")
		cfg["moe_intermediate_size"] = num("expert_feed_forward_length")
		cfg["norm_topk_prob"] = arch == "qwen3moe"
		cfg["decoder_sparse_step"] = 1
		cfg["mlp_only_layers"] = []int{}
		if arch == "qwen2moe" {
			cfg["shared_expert_intermediate_size"] = num("expert_shared_feed_forward_length")
		}
	case "gpt-oss":
		cfg["model_type"] = "gpt_oss"
		cfg["num_local_experts"] = num("expert_count")
		cfg["num_experts_per_tok"] = num("expert_used_count")
		cfg["intermediate_size"] = num("expert_feed_forward_length")
	case "llama":
		if _, ok := g.Metadata["llama.expert_count"]; !ok {
			return nil, errkind.Errorf(ErrUnknownFamily, "moe: %s: a llama GGUF without llama.expert_count has no MoE block", path)
		}
		cfg["model_type"] = "mixtral"
		cfg["num_local_experts"] = num("expert_count")
		cfg["num_experts_per_tok"] = num("expert_used_count")
		cfg["intermediate_size"] = num("feed_forward_length")
	default:
		return nil, errkind.Errorf(ErrUnknownFamily, "moe: %s: GGUF architecture %q: moex reads deepseek2, glm4moe, qwen3moe, qwen2moe, gpt-oss and llama (Mixtral) MoE blocks",
			path, arch)
	}
	if len(bad) > 0 {
		return nil, errkind.Errorf(ErrGGUF, "moe: gguf: %s: %s", path, strings.Join(bad, "; "))
	}
	if len(missing) > 0 {
		return nil, errkind.Errorf(ErrGGUF, "moe: gguf: %s: the %s block needs %s", path, arch, strings.Join(missing, ", "))
	}
	return cfg, nil
}

// GGUFConfig is the MoE configuration a GGUF model's metadata describes,
// as ParseConfig reads it from the equivalent config.json.
func GGUFConfig(m *gguf.Model) (*Config, error) {
	// The metadata is the first shard's; tensors may be in any (a split
	// DeepSeek-V3's exp_probs_b usually lie past its first shard).
	return configOf(m.Header(), m.Path(), m.HasSuffix)
}

func configOf(g *gguf.Header, path string, hasTensor func(string) bool) (*Config, error) {
	raw, err := hfConfig(g, path, hasTensor)
	if err != nil {
		return nil, err
	}
	data, err := json.Marshal(raw)
	if err != nil {
		return nil, errkind.Errorf(ErrGGUF, "moe: gguf: %s: %v", path, err)
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("moe: %s: %w", path, err)
	}
	return cfg, nil
}

// LoadGGUF maps a GGUF file and takes the MoE block of layer n: the router
// ffn_gate_inp, the stacked experts ffn_{gate,up,down}_exps (ggml's order:
// [hidden, inter, experts] and [inter, hidden, experts]), the shared
// expert's ffn_*_shexp, exp_probs_b and qwen2moe's ffn_gate_inp_shexp. The
// same Layer as from safetensors; Close unmaps the file. A split model
// (NAME-00001-of-00003.gguf, llama.cpp's gguf-split) is read from all its
// shards, given any one of them. Expert tensors in F32, F16 and BF16 are
// read in place, Q4_0 and MXFP4 as kernels' 4-bit matrices of the same
// values (reordered nibbles); other quantized ggml types are an
// ErrUnsupportedFormat error naming the tensor and its type.
func LoadGGUF(path string, n int) (*Layer, error) {
	g, err := gguf.OpenModel(path)
	if err != nil {
		return nil, err
	}
	l, err := loadGGUF(g, n)
	if err != nil {
		g.Close()
		return nil, err
	}
	l.closer = g
	return l, nil
}

func loadGGUF(g *gguf.Model, n int) (*Layer, error) {
	cfg, err := GGUFConfig(g)
	if err != nil {
		return nil, err
	}
	if err := cfg.CheckMoELayer(n); err != nil {
		return nil, fmt.Errorf("moe: %s: %w", g.Path(), err)
	}
	H, I, E := cfg.Hidden, cfg.Inter, cfg.NumExperts
	blk := fmt.Sprintf("blk.%d.", n)
	var w Weights
	if w.Gate, err = g.Matrix(blk+"ffn_gate_inp.weight", E, H); err != nil {
		return nil, err
	}
	w.Gate = w.Gate.Clone() // small, read by every token: a copy, as from safetensors
	if err := checkFiniteMatrix(fmt.Sprintf("%s: tensor %q", g.Path(), blk+"ffn_gate_inp.weight"), w.Gate); err != nil {
		return nil, err
	}
	if cfg.Method == NoAuxTC {
		b, err := g.Matrix(blk+"exp_probs_b.bias", 1, E)
		if err != nil {
			return nil, err
		}
		if err := checkFiniteMatrix(fmt.Sprintf("%s: tensor %q", g.Path(), blk+"exp_probs_b.bias"), b); err != nil {
			return nil, err
		}
		w.Bias = make([]float32, E)
		b.RowF32(0, w.Bias)
	}
	if cfg.RouterBias {
		if w.RouterBias, err = ggufVector(g, blk+"ffn_gate_inp.bias", E); err != nil {
			return nil, err
		}
	}
	stacks := make([][]kernels.Matrix, 3)
	for i, p := range []struct {
		name       string
		rows, cols int
	}{{"ffn_gate_exps", I, H}, {"ffn_up_exps", I, H}, {"ffn_down_exps", H, I}} {
		if stacks[i], err = g.Stacked(blk+p.name+".weight", E, p.rows, p.cols); err != nil {
			return nil, err
		}
	}
	var biases [3][][]float32 // gpt-oss: [inter, experts] and [hidden, experts], a row an expert
	if cfg.ExpertBias {
		for i, p := range []struct {
			name string
			n    int
		}{{"ffn_gate_exps.bias", I}, {"ffn_up_exps.bias", I}, {"ffn_down_exps.bias", H}} {
			if biases[i], err = ggufRows(g, blk+p.name, E, p.n); err != nil {
				return nil, err
			}
		}
	}
	w.Experts = make([]Expert, E)
	for e := range w.Experts {
		w.Experts[e] = Expert{Gate: stacks[0][e], Up: stacks[1][e], Down: stacks[2][e]}
		if cfg.ExpertBias {
			w.Experts[e].GateBias, w.Experts[e].UpBias, w.Experts[e].DownBias = biases[0][e], biases[1][e], biases[2][e]
		}
	}
	if S := cfg.SharedInter; S > 0 {
		var x Expert
		if x.Gate, err = g.Matrix(blk+"ffn_gate_shexp.weight", S, H); err != nil {
			return nil, err
		}
		if x.Up, err = g.Matrix(blk+"ffn_up_shexp.weight", S, H); err != nil {
			return nil, err
		}
		if x.Down, err = g.Matrix(blk+"ffn_down_shexp.weight", H, S); err != nil {
			return nil, err
		}
		w.Shared = &x
		if cfg.SharedGate {
			sg, err := g.Matrix(blk+"ffn_gate_inp_shexp.weight", 1, H)
			if err != nil {
				return nil, err
			}
			sg = sg.Clone()
			w.SharedGate = &sg
		}
	}
	return New(cfg, w)
}

// vector is the 1-D tensor name [n], checked finite, as float32.
func ggufVector(g *gguf.Model, name string, n int) ([]float32, error) {
	r, err := ggufRows(g, name, 1, n)
	if err != nil {
		return nil, err
	}
	return r[0], nil
}

// rows is tensor name [rows, n] (PyTorch's order; [n] for one row),
// checked finite, as float32 rows.
func ggufRows(g *gguf.Model, name string, rows, n int) ([][]float32, error) {
	m, err := g.Matrix(name, rows, n)
	if err != nil {
		return nil, err
	}
	if err := checkFiniteMatrix(fmt.Sprintf("%s: tensor %q", g.Path(), name), m); err != nil {
		return nil, err
	}
	out := make([][]float32, rows)
	for i := range out {
		out[i] = make([]float32, n)
		m.RowF32(i, out[i])
	}
	return out, nil
}
