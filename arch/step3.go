package arch

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/moex-project/moex/internal/errkind"
)

// Step3 (SGLang's step3_vl, Step3TextConfig): softmax, top-k (moe_top_k),
// renormalised iff norm_expert_weight; the shared expert
// (share_expert_dim) added unweighted; MoE on the layers moe_layers_enum
// lists (all but layer 0 when it is missing); experts stored as one 3-D
// tensor per projection under moe.; Step3-VL's text model under
// text_config.
var step3Text = &family{
	name:       "step3_text",
	aliases:    []string{"step3_vl"},
	classes:    []string{"Step3VLForConditionalGeneration", "Step3TextForCausalLM"},
	textConfig: []string{"step3_vl"},
	notWhole:   "its attention (a low-rank shared query) is not built yet",
	topK:       []string{"moe_top_k"},
	topKName:   "moe_top_k",
	read: func(c *Config, k *keys) error {
		m := &c.MoE
		m.NumExperts = k.need("moe_num_experts")
		m.Inter = k.need("moe_intermediate_size")
		m.SharedInter = k.need("share_expert_dim")
		m.NormTopK = k.boolOr("norm_expert_weight", false)
		var err error
		c.MoELayers, err = layerEnum(k.Raw("moe_layers_enum"), c.Layers)
		return err
	},
	dense: func(c *Config, n int) error {
		if !slices.Contains(c.MoELayers, n) {
			return errkind.Errorf(ErrDenseLayer, "layer %d is a dense MLP layer (not in moe_layers_enum), not MoE", n)
		}
		return nil
	},
	names: func(c *Config, root string, layer int) MoENames {
		p := fmt.Sprintf("%slayers.%d.", root, layer)
		var n MoENames
		n.Gate, n.Fused, n.Layout = p+"moe.gate.weight", p+"moe.", Stacked
		s := p + "share_expert."
		n.Shared = [3]string{s + "gate_proj.weight", s + "up_proj.weight", s + "down_proj.weight"}
		return n
	},
}

// layerEnum reads step3's moe_layers_enum: "4,5,6" or [4, 5, 6]; missing,
// every layer but the first.
func layerEnum(raw json.RawMessage, layers int) ([]int, error) {
	if isNull(raw) {
		if layers == 0 {
			return nil, fmt.Errorf("step3 config.json has neither moe_layers_enum nor num_hidden_layers: which layers are MoE is unknown")
		}
		out := make([]int, 0, layers)
		for i := 1; i < layers; i++ {
			out = append(out, i)
		}
		return out, nil
	}
	var list []int
	if err := json.Unmarshal(raw, &list); err == nil {
		return list, nil
	}
	var text string
	if err := json.Unmarshal(raw, &text); err != nil {
		return nil, fmt.Errorf("moe_layers_enum is %s: want a comma-separated string or a list of layer indices", raw)
	}
	for _, f := range strings.Split(text, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("moe_layers_enum %q: %q is not a layer index", text, f)
		}
		list = append(list, n)
	}
	return list, nil
}
