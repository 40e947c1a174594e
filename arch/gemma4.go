package arch

import (
	"fmt"

	"github.com/moex-project/moex/format"
	"github.com/moex-project/moex/internal/errkind"
	"github.com/moex-project/moex/kernels"
)

// Gemma 4 (transformers' modeling_gemma4.py): a MoE block on every layer
// when enable_moe_block, beside the dense MLP (intermediate_size, the
// "shared expert"); softmax, top-k (top_k_experts), renormalised, ×
// per_expert_scale; GeGLU experts and MLP (hidden_activation). The block
// reads the residual stream and owns its norms (moe.Config.ResidualInput);
// the router, experts and norms sit on the decoder layer itself, the dense
// MLP under mlp. The text model under text_config (gemma4_text: a
// text-only checkpoint, at the top level).
var gemma4 = &family{
	name:       "gemma4",
	aliases:    []string{"gemma4_text"},
	classes:    []string{"Gemma4ForConditionalGeneration", "Gemma4ForCausalLM"},
	textConfig: []string{"gemma4"},
	notWhole:   "its sliding and global attention with their own norms and KV sharing are not built yet",
	topK:       []string{"top_k_experts"},
	topKName:   "top_k_experts",
	read: func(c *Config, k *keys) error {
		m := &c.MoE
		if on := k.Bool("enable_moe_block"); on == nil || !*on {
			return errkind.Errorf(ErrDenseLayer, "gemma4 config.json has no MoE block (enable_moe_block is %s): the dense Gemma 4 models are not MoE", boolOrMissing(on))
		}
		m.NumExperts = k.need("num_experts")
		m.Inter = k.need("moe_intermediate_size")
		m.SharedInter = k.need("intermediate_size")
		m.NormTopK, m.ResidualInput = true, true
		m.RMSNormEps = k.floatOr("rms_norm_eps", 1e-6)
		act := "gelu_pytorch_tanh"
		if p := k.Str("hidden_activation"); p != nil {
			act = *p
		}
		switch act {
		case "gelu_pytorch_tanh", "gelu_new", "gelu_fast": // GELU's tanh approximation, each
		default:
			return errkind.Errorf(format.ErrUnsupported, "gemma4 hidden_activation %q is not supported (supported: gelu_pytorch_tanh, gelu_new, gelu_fast)", act)
		}
		m.Act = kernels.Activation{Kind: kernels.GeGLU}
		m.SharedAct = m.Act
		if kv := k.or("num_kv_shared_layers", 0); k.boolOr("use_double_wide_mlp", false) && kv > 0 && c.Layers-kv > 0 {
			m.DoubleWideFrom = c.Layers - kv
		}
		return nil
	},
	names: func(c *Config, root string, layer int) MoENames {
		p := fmt.Sprintf("%slayers.%d.", root, layer)
		var n MoENames
		n.Gate, n.RouterScale, n.ExpertScale = p+"router.proj.weight", p+"router.scale", p+"router.per_expert_scale"
		n.Fused, n.Layout = p+"experts.", FusedOI
		n.Shared = [3]string{p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight", p + "mlp.down_proj.weight"}
		for i, norm := range []string{"pre_feedforward_layernorm", "post_feedforward_layernorm_1", "pre_feedforward_layernorm_2",
			"post_feedforward_layernorm_2", "post_feedforward_layernorm"} {
			n.Norms[i] = p + norm + ".weight"
		}
		return n
	},
}
