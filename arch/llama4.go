package arch

import (
	"fmt"
	"slices"

	"github.com/moex-project/moex/internal/errkind"
)

// Llama 4 (transformers' modeling_llama4.py): top-k on the raw logits, the
// weight sigmoid(logit) of a chosen expert multiplies its input; a shared
// expert of the same width on the unscaled input; MoE on the layers
// moe_layers names, or every interleave_moe_layer_step-th; the experts
// fused in x·W form under feed_forward.; the text model under text_config
// (llama4_text: a text-only checkpoint, at the top level).
var llama4 = &family{
	name:       "llama4",
	aliases:    []string{"llama4_text"},
	classes:    []string{"Llama4ForConditionalGeneration", "Llama4ForCausalLM"},
	textConfig: []string{"llama4"},
	notWhole:   "its chunked local attention and no-RoPE layers are not built yet",
	read: func(c *Config, k *keys) error {
		m := &c.MoE
		m.NumExperts = k.need("num_local_experts")
		m.Inter = k.need("intermediate_size")
		m.Scoring, m.ChooseOnLogits, m.WeightOnInput = Sigmoid, true, true
		m.SharedInter = m.Inter
		c.SparseStep = k.or("interleave_moe_layer_step", 1)
		c.MoELayers = k.Ints("moe_layers")
		if c.MoELayers == nil && c.SparseStep <= 0 {
			return fmt.Errorf("interleave_moe_layer_step %d must be positive", c.SparseStep)
		}
		c.DenseInter = k.or("intermediate_size_mlp", 0)
		return nil
	},
	dense: func(c *Config, n int) error {
		if c.MoELayers != nil && !slices.Contains(c.MoELayers, n) {
			return errkind.Errorf(ErrDenseLayer, "layer %d is a dense MLP layer (not in moe_layers %v), not MoE", n, c.MoELayers)
		}
		if c.MoELayers == nil && (n+1)%c.SparseStep != 0 {
			return errkind.Errorf(ErrDenseLayer, "layer %d is a dense MLP layer (interleave_moe_layer_step %d makes layers %d, %d, … MoE), not MoE",
				n, c.SparseStep, c.SparseStep-1, 2*c.SparseStep-1)
		}
		return nil
	},
	names: func(c *Config, root string, layer int) MoENames {
		p := fmt.Sprintf("%slayers.%d.feed_forward.", root, layer)
		var n MoENames
		n.Gate, n.Fused, n.Layout = p+"router.weight", p+"experts.", FusedIO
		s := p + "shared_expert."
		n.Shared = [3]string{s + "gate_proj.weight", s + "up_proj.weight", s + "down_proj.weight"}
		return n
	},
}
