package arch

import (
	"fmt"
	"slices"

	"github.com/moex-project/moex/internal/errkind"
)

// The Qwen MoE families (transformers' modeling_qwen2_moe.py,
// modeling_qwen3_moe.py, modeling_qwen3_next.py, modeling_qwen3_5_moe.py,
// modeling_qwen3_vl_moe.py) share one reader: softmax, top-k, MoE on every
// decoder_sparse_step-th layer not in mlp_only_layers.
//   - qwen2_moe: renormalised iff norm_topk_prob (false by default), a
//     shared expert behind a sigmoid gate (shared_expert_gate).
//   - qwen3_moe: no shared expert.
//   - qwen3_next: Qwen2MoeSparseMoeBlock, norm_topk_prob true by default.
//   - qwen3_5_moe: the same block, always renormalised, every layer MoE
//     (its config dropped the keys), the experts fused [out, in], the text
//     model under text_config.
//   - qwen3_vl_moe: qwen3_moe's block, always renormalised, the experts
//     fused in x·W form, the text model under text_config.
var (
	qwen2MoE = &family{name: "qwen2_moe", classes: []string{"Qwen2MoeForCausalLM"}, read: readQwen, dense: qwenDense, names: qwenNames,
		gguf: []string{"qwen2moe"}, fromGGUF: qwenGGUF, whole: true, ggufWhole: true}
	qwen3MoE = &family{name: "qwen3_moe", classes: []string{"Qwen3MoeForCausalLM"}, read: readQwen, dense: qwenDense, names: qwenNames,
		gguf: []string{"qwen3moe"}, fromGGUF: qwenGGUF, whole: true, ggufWhole: true}
	qwen3Next = &family{name: "qwen3_next", classes: []string{"Qwen3NextForCausalLM"}, read: readQwen, dense: qwenDense, names: qwenNames,
		notWhole: "three of its four layers attend by gated DeltaNet, a linear attention moex does not compute yet"}
	qwen35MoE = &family{name: "qwen3_5_moe", classes: []string{"Qwen3_5MoeForConditionalGeneration"}, textConfig: []string{"qwen3_5_moe"},
		read: readQwen, dense: qwenDense, names: qwenNames,
		notWhole: "three of its four layers attend by gated DeltaNet, a linear attention moex does not compute yet"}
	qwen3VLMoE = &family{name: "qwen3_vl_moe", classes: []string{"Qwen3VLMoeForConditionalGeneration"}, textConfig: []string{"qwen3_vl_moe"},
		read: readQwen, dense: qwenDense, names: qwenNames,
		notWhole: "its multimodal RoPE (mrope sections) is not built yet"}
)

func readQwen(c *Config, k *keys) error {
	m := &c.MoE
	m.NumExperts = k.need("num_experts")
	m.Inter = k.need("moe_intermediate_size")
	norm := k.Bool("norm_topk_prob")
	m.NormTopK = norm != nil && *norm
	if c.Family == "qwen3_next" && norm == nil || c.Family == "qwen3_5_moe" || c.Family == "qwen3_vl_moe" {
		m.NormTopK = true // qwen3_vl_moe's router renormalises whatever norm_topk_prob says
	}
	c.SparseStep = k.or("decoder_sparse_step", 1)
	c.MLPOnlyLayers = k.Ints("mlp_only_layers")
	if c.Family == "qwen3_5_moe" {
		c.SparseStep, c.MLPOnlyLayers = 1, nil
	}
	if c.Family != "qwen3_moe" && c.Family != "qwen3_vl_moe" {
		m.SharedInter = k.need("shared_expert_intermediate_size")
		m.SharedGate = m.SharedInter > 0
	}
	if c.SparseStep <= 0 {
		return fmt.Errorf("decoder_sparse_step %d must be positive", c.SparseStep)
	}
	// Attention: Qwen2-MoE's q, k and v projections have biases, Qwen3's
	// queries and keys a per-head RMSNorm; a sliding window only where
	// use_sliding_window says so, on the layers from max_window_layers on.
	a := &c.Attention
	switch c.Family {
	case "qwen2_moe":
		a.Bias = true
	case "qwen3_moe", "qwen3_vl_moe":
		a.QKNorm = QKNormHead
	}
	a.Window = 0
	if k.boolOr("use_sliding_window", false) {
		a.Window = k.or("sliding_window", 0)
		a.WindowLayers = make([]bool, c.Layers)
		for i := k.or("max_window_layers", 28); i < c.Layers; i++ {
			a.WindowLayers[i] = true
		}
	}
	return nil
}

// qwenDense: mlp_only_layers are dense, and the layers between the
// decoder_sparse_step-th.
func qwenDense(c *Config, n int) error {
	if slices.Contains(c.MLPOnlyLayers, n) {
		return errkind.Errorf(ErrDenseLayer, "layer %d is a dense MLP layer (in mlp_only_layers), not MoE", n)
	}
	if (n+1)%c.SparseStep != 0 {
		return errkind.Errorf(ErrDenseLayer, "layer %d is a dense MLP layer (decoder_sparse_step %d makes layers %d, %d, … MoE), not MoE",
			n, c.SparseStep, c.SparseStep-1, 2*c.SparseStep-1)
	}
	return nil
}

// qwenNames: mlp.gate and per-expert tensors (qwen3_5_moe's fused [out,
// in], qwen3_vl_moe's fused x·W), the shared expert under
// mlp.shared_expert. with its gate mlp.shared_expert_gate.
func qwenNames(c *Config, root string, layer int) MoENames {
	n := mlpNames(c, root, layer)
	p := fmt.Sprintf("%slayers.%d.mlp.", root, layer)
	switch c.Family {
	case "qwen3_5_moe":
		n.Fused, n.Layout = p+"experts.", FusedOI
	case "qwen3_vl_moe":
		n.Fused, n.Layout = p+"experts.", FusedIO
	}
	if c.Family == "qwen2_moe" || c.Family == "qwen3_next" || c.Family == "qwen3_5_moe" {
		s := p + "shared_expert."
		n.Shared = [3]string{s + "gate_proj.weight", s + "up_proj.weight", s + "down_proj.weight"}
		n.SharedGate = p + "shared_expert_gate.weight"
	}
	return n
}

// qwenGGUF: llama.cpp's qwen3moe (renormalised: llama.cpp always
// renormalises it) and qwen2moe (not renormalised, the shared expert of
// expert_shared_feed_forward_length behind ffn_gate_inp_shexp).
func qwenGGUF(m *ggufMeta, cfg map[string]any) error {
	cfg["model_type"] = map[string]string{"qwen3moe": "qwen3_moe", "qwen2moe": "qwen2_moe"}[m.arch]
	cfg["num_experts"] = m.num("expert_count")
	cfg["num_experts_per_tok"] = m.num("expert_used_count")
	cfg["moe_intermediate_size"] = m.num("expert_feed_forward_length")
	cfg["norm_topk_prob"] = m.arch == "qwen3moe"
	cfg["decoder_sparse_step"] = 1
	cfg["mlp_only_layers"] = []int{}
	if m.arch == "qwen2moe" {
		cfg["shared_expert_intermediate_size"] = m.num("expert_shared_feed_forward_length")
	}
	return nil
}
