package arch

import (
	"fmt"

	"github.com/moex-project/moex/kernels"
)

// DeepSeek-V4 (its release's DeepseekV4Config and inference code): scores
// sqrt(softplus(logit)) (scoring_func), chosen on score +
// e_score_correction_bias without groups, the unbiased scores of the k
// renormalised (+1e-20, always, as the router does) × routed_scaling_factor;
// the layers mlp_layer_types marks hash_moe (or the first num_hash_layers,
// 3) choose by token id; experts clamp before SiLU at swiglu_limit (10),
// the shared expert (moe_intermediate_size × n_shared_experts wide) does
// not; every layer MoE, the MTP layers stored apart (model.mtp.*); the
// experts fused [out, in].
var deepseekV4 = &family{
	name:     "deepseek_v4",
	classes:  []string{"DeepseekV4ForCausalLM"},
	notWhole: "its compressed sparse attention is not built yet",
	read: func(c *Config, k *keys) error {
		m := &c.MoE
		m.NumExperts = k.need("n_routed_experts")
		m.Inter = k.need("moe_intermediate_size")
		m.SharedInter = k.or("n_shared_experts", 1) * m.Inter
		m.Scoring, m.Method, m.ScoreBiasInput, m.NumGroups, m.TopKGroups = SqrtSoftplus, NoAuxTC, true, 1, 1
		if p := k.Str("scoring_func"); p != nil {
			var err error
			if m.Scoring, err = parseScoring(*p); err != nil {
				return err
			}
		}
		m.NormTopK, m.NormEps = true, 1e-20
		m.RoutedScaling = k.floatOr("routed_scaling_factor", 1.5)
		m.Act = kernels.Activation{Kind: kernels.ClampedSiLU, Limit: float32(k.floatOr("swiglu_limit", 10))}
		m.VocabSize = k.or("vocab_size", 129280)
		var err error
		m.HashLayers, err = hashLayers(k.Strs("mlp_layer_types"), k.Int("num_hash_layers"), c.Layers)
		return err
	},
	names: func(c *Config, root string, layer int) MoENames {
		n := mlpNames(c, root, layer)
		p := fmt.Sprintf("%slayers.%d.mlp.", root, layer)
		n.Fused, n.Layout, n.TokenExperts = p+"experts.", FusedOI, p+"gate.tid2eid"
		return n
	},
}

// hashLayers reads deepseek_v4's hash-routed layers: mlp_layer_types
// ("hash_moe" or "moe", one per layer), or else the first num_hash_layers
// (3 when neither is given).
func hashLayers(types []string, n *int, layers int) ([]int, error) {
	if types == nil {
		k := 3
		if n != nil {
			k = *n
		}
		if k < 0 {
			return nil, fmt.Errorf("num_hash_layers %d must not be negative", k)
		}
		if layers > 0 {
			k = min(k, layers)
		}
		out := make([]int, k)
		for i := range out {
			out[i] = i
		}
		return out, nil
	}
	if layers > 0 && len(types) != layers {
		return nil, fmt.Errorf("mlp_layer_types has %d entries, num_hidden_layers is %d", len(types), layers)
	}
	out := []int{}
	for i, t := range types {
		switch t {
		case "hash_moe":
			out = append(out, i)
		case "moe":
		default:
			return nil, fmt.Errorf("mlp_layer_types[%d] is %q (want hash_moe or moe)", i, t)
		}
	}
	return out, nil
}
