package arch

// MiniMax-M2 (transformers' modeling_minimax_m2.py): sigmoid scores, chosen
// on score + the routing bias (use_routing_bias, true), no groups, the
// unbiased scores of the k renormalised, no routed scaling, no shared
// expert; Mixtral's tensor names.
var minimaxM2 = &family{
	name:    "minimax_m2",
	classes: []string{"MiniMaxM2ForCausalLM"},
	read: func(c *Config, k *keys) error {
		m := &c.MoE
		m.NumExperts = k.need("num_local_experts")
		m.Inter = k.need("intermediate_size")
		c.DenseInter = 0
		m.Scoring, m.NormTopK = Sigmoid, true
		if p := k.Str("scoring_func"); p != nil {
			var err error
			if m.Scoring, err = parseScoring(*p); err != nil {
				return err
			}
		}
		if k.boolOr("use_routing_bias", true) {
			m.Method, m.ScoreBiasInput, m.NumGroups, m.TopKGroups = NoAuxTC, true, 1, 1
		}
		return nil
	},
	names:    blockSparseNames,
	notWhole: "its QK norm over all heads with partial rotary is not wired yet",
}
