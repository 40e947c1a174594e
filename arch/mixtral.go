package arch

import (
	"fmt"

	"github.com/moex-project/moex/internal/errkind"
)

// Mixtral (transformers' modeling_mixtral.py): softmax, top-k, always
// renormalised; every layer MoE, block_sparse_moe.{gate, experts.N.w1/w3/w2}.
var mixtral = &family{
	name:    "mixtral",
	classes: []string{"MixtralForCausalLM"},
	read: func(c *Config, k *keys) error {
		m := &c.MoE
		m.NumExperts = k.need("num_local_experts")
		m.Inter = k.need("intermediate_size")
		m.NormTopK = true
		c.DenseInter = 0 // intermediate_size is the experts'
		return nil
	},
	names:     blockSparseNames,
	whole:     true,
	ggufWhole: true,
	gguf:      []string{"llama"},
	fromGGUF: func(m *ggufMeta, cfg map[string]any) error {
		if !m.has("expert_count") {
			return errkind.Errorf(ErrUnknownFamily, "%s: a llama GGUF without llama.expert_count has no MoE block", m.path)
		}
		cfg["model_type"] = "mixtral"
		cfg["num_local_experts"] = m.num("expert_count")
		cfg["num_experts_per_tok"] = m.num("expert_used_count")
		cfg["intermediate_size"] = m.num("feed_forward_length")
		return nil
	},
}

// blockSparseNames: Mixtral's names, block_sparse_moe.{gate,
// e_score_correction_bias, experts.N.w1/w3/w2} (MiniMax-M2's too).
func blockSparseNames(c *Config, root string, layer int) MoENames {
	p := fmt.Sprintf("%slayers.%d.block_sparse_moe.", root, layer)
	var n MoENames
	n.Gate, n.Bias = p+"gate.weight", p+"e_score_correction_bias"
	n.Expert = perExpert(p, "w1.weight", "w3.weight", "w2.weight")
	return n
}
