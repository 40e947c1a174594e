package arch

import (
	"fmt"
	"math"

	"github.com/moex-project/moex/internal/errkind"
)

// ERNIE 4.5 MoE (transformers' modeling_ernie4_5_moe.py): softmax (fp32)
// over all experts, chosen on softmax + moe_statics' correction bias, the
// unbiased softmax of the k divided by max(their sum, moe_norm_min);
// shared experts unweighted; no routed scaling. MoE on the layers
// moe_layer_start_index…moe_layer_end_index with (n+1) % moe_layer_interval
// = 0.
var ernie45MoE = &family{
	name:     "ernie4_5_moe",
	classes:  []string{"Ernie4_5_MoeForCausalLM"},
	topK:     []string{"moe_k", "num_experts_per_tok", "experts_per_token"},
	topKName: "num_experts_per_tok",
	notWhole: "its attention is read but not yet checked against transformers' reference",
	read: func(c *Config, k *keys) error {
		m := &c.MoE
		m.NumExperts = k.need("moe_num_experts")
		m.Inter = k.need("moe_intermediate_size")
		m.SharedInter = k.or("moe_num_shared_experts", 0) * m.Inter
		m.Method, m.ScoreBiasInput, m.NumGroups, m.TopKGroups = NoAuxTC, true, 1, 1
		m.NormTopK, m.NormMin = true, k.floatOr("moe_norm_min", 1e-12)
		c.MoEStart, c.MoEEnd, c.MoEInterval = k.or("moe_layer_start_index", 0), k.or("moe_layer_end_index", -1), k.or("moe_layer_interval", 1)
		if c.MoEEnd < 0 { // to the last layer
			c.MoEEnd = math.MaxInt32
		}
		if c.MoEInterval <= 0 || c.MoEStart < 0 {
			return fmt.Errorf("moe_layer_interval %d must be positive and moe_layer_start_index %d not negative", c.MoEInterval, c.MoEStart)
		}
		return nil
	},
	dense: func(c *Config, n int) error {
		if n < c.MoEStart || n > c.MoEEnd || (n+1)%c.MoEInterval != 0 {
			return errkind.Errorf(ErrDenseLayer, "layer %d is a dense MLP layer (MoE layers are %d…%d with (n+1) %% moe_layer_interval %d = 0), not MoE",
				n, c.MoEStart, c.MoEEnd, c.MoEInterval)
		}
		return nil
	},
	names: func(c *Config, root string, layer int) MoENames {
		n := mlpNames(c, root, layer)
		n.Bias, n.BiasRows = fmt.Sprintf("%slayers.%d.mlp.moe_statics.e_score_correction_bias", root, layer), 1
		return n
	},
}
