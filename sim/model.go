package sim

import (
	"fmt"
	"slices"
	"strings"

	"github.com/moex-project/moex/arch"
)

// Model is the shape of a MoE model, its attention MLA (KVLoraRank > 0)
// or grouped-query: all the formulas need.
type Model struct {
	Name   string `json:"name"`
	Layers int    `json:"layers"`
	// DenseLayers are the layers with a dense MLP of width DenseInter
	// (first_k_dense_replace, and those off moe_layer_freq).
	DenseLayers int `json:"dense_layers"`
	Hidden      int `json:"hidden"`
	// Vocab 0: a layer stack without embedding and lm_head (moex run's).
	Vocab int `json:"vocab"`
	// MLA: Heads query heads; QLoraRank 0 for a plain q_proj; the cache
	// holds KVLoraRank + RopeDim values per token and layer.
	Heads      int `json:"heads"`
	QLoraRank  int `json:"q_lora_rank"`
	KVLoraRank int `json:"kv_lora_rank"`
	NopeDim    int `json:"qk_nope_head_dim"`
	RopeDim    int `json:"qk_rope_head_dim"`
	VDim       int `json:"v_head_dim"`
	// Grouped-query attention (KVLoraRank 0): Heads query heads over
	// KVHeads key/value heads of HeadDim; the cache holds a token's keys and
	// values, 2·KVHeads·HeadDim values a layer.
	KVHeads int `json:"kv_heads,omitempty"`
	HeadDim int `json:"head_dim,omitempty"`
	// MoE: Experts routed experts of width ExpertInter, TopK a token, a
	// shared-expert MLP of width SharedInter (0: none).
	Experts     int `json:"experts"`
	TopK        int `json:"top_k"`
	ExpertInter int `json:"expert_inter"`
	SharedInter int `json:"shared_inter"`
	DenseInter  int `json:"dense_inter"`
}

// Model presets, from each checkpoint's config.json on Hugging Face
// (deepseek-ai/DeepSeek-V2, -V2-Lite, -Coder-V2-Instruct, -V3;
// moonshotai/Kimi-K2-Instruct).
var modelPresets = map[string]Model{
	"deepseek-v2": {Name: "deepseek-v2", Layers: 60, DenseLayers: 1, Hidden: 5120, Vocab: 102400, Heads: 128, QLoraRank: 1536,
		KVLoraRank: 512, NopeDim: 128, RopeDim: 64, VDim: 128, Experts: 160, TopK: 6, ExpertInter: 1536, SharedInter: 2 * 1536, DenseInter: 12288},
	"deepseek-coder-v2": {Name: "deepseek-coder-v2", Layers: 60, DenseLayers: 1, Hidden: 5120, Vocab: 102400, Heads: 128, QLoraRank: 1536,
		KVLoraRank: 512, NopeDim: 128, RopeDim: 64, VDim: 128, Experts: 160, TopK: 6, ExpertInter: 1536, SharedInter: 2 * 1536, DenseInter: 12288},
	"deepseek-v2-lite": {Name: "deepseek-v2-lite", Layers: 27, DenseLayers: 1, Hidden: 2048, Vocab: 102400, Heads: 16,
		KVLoraRank: 512, NopeDim: 128, RopeDim: 64, VDim: 128, Experts: 64, TopK: 6, ExpertInter: 1408, SharedInter: 2 * 1408, DenseInter: 10944},
	"deepseek-v3": {Name: "deepseek-v3", Layers: 61, DenseLayers: 3, Hidden: 7168, Vocab: 129280, Heads: 128, QLoraRank: 1536,
		KVLoraRank: 512, NopeDim: 128, RopeDim: 64, VDim: 128, Experts: 256, TopK: 8, ExpertInter: 2048, SharedInter: 2048, DenseInter: 18432},
	"qwen3-30b-a3b": {Name: "qwen3-30b-a3b", Layers: 48, Hidden: 2048, Vocab: 151936, Heads: 32, KVHeads: 4, HeadDim: 128,
		Experts: 128, TopK: 8, ExpertInter: 768},
	"qwen3-235b-a22b": {Name: "qwen3-235b-a22b", Layers: 94, Hidden: 4096, Vocab: 151936, Heads: 64, KVHeads: 4, HeadDim: 128,
		Experts: 128, TopK: 8, ExpertInter: 1536},
	"kimi-k2": {Name: "kimi-k2", Layers: 61, DenseLayers: 1, Hidden: 7168, Vocab: 163840, Heads: 64, QLoraRank: 1536,
		KVLoraRank: 512, NopeDim: 128, RopeDim: 64, VDim: 128, Experts: 384, TopK: 8, ExpertInter: 2048, SharedInter: 2048, DenseInter: 18432},
}

// ModelPresets lists the model presets' names.
func ModelPresets() []string {
	var names []string
	for n := range modelPresets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// ModelPreset is the named model preset; an unknown name is an error
// listing them.
func ModelPreset(name string) (Model, error) {
	m, ok := modelPresets[strings.ToLower(name)]
	if !ok {
		return Model{}, fmt.Errorf("sim: unknown model preset %q (presets: %s; or --model DIR with a config.json)", name, strings.Join(ModelPresets(), ", "))
	}
	return m, nil
}

// LoadModel reads a model's shape from its config.json (a folder or the
// file). A model without MLA (no kv_lora_rank) is an error: its KV cache
// has heads a TP rank can split, and the formulas here are MLA's.
func LoadModel(path string) (Model, error) {
	a, err := arch.Load(path)
	if err != nil {
		return Model{}, fmt.Errorf("sim: model: %w", err)
	}
	at := a.Attention
	cfg := a.MoE
	m := Model{Name: a.Name, Layers: a.Layers, Hidden: a.Hidden, Vocab: a.Vocab, Heads: at.Heads,
		KVLoraRank: at.KVLoraRank, NopeDim: at.NopeDim, RopeDim: at.RopeDim, VDim: at.VDim,
		Experts: cfg.NumExperts, TopK: cfg.TopK, ExpertInter: cfg.Inter, SharedInter: cfg.SharedInter, DenseInter: a.DenseInter}
	if at.QLoraRank != nil {
		m.QLoraRank = *at.QLoraRank
	}
	if at.Kind == arch.GQA {
		m.KVLoraRank, m.NopeDim, m.RopeDim, m.VDim, m.KVHeads, m.HeadDim = 0, 0, 0, 0, at.KVHeads, at.HeadDim
	}
	for n := range a.Layers {
		if a.MoELayer(n) != nil {
			m.DenseLayers++
		}
	}
	return m, m.Validate()
}

// Validate names the first size that cannot describe a model.
func (m Model) Validate() error {
	type field struct {
		name string
		v    int
	}
	attn := []field{{"kv_lora_rank", m.KVLoraRank}, {"qk_nope_head_dim", m.NopeDim}, {"qk_rope_head_dim", m.RopeDim}, {"v_head_dim", m.VDim}}
	if !m.mla() {
		attn = []field{{"kv_heads", m.KVHeads}, {"head_dim", m.HeadDim}}
		if m.KVHeads > 0 && m.Heads%m.KVHeads != 0 {
			return fmt.Errorf("sim: model %q: %d heads over %d key/value heads", m.Name, m.Heads, m.KVHeads)
		}
	}
	for _, f := range append(append([]field{{"layers", m.Layers}, {"hidden", m.Hidden}, {"heads", m.Heads}}, attn...),
		field{"experts", m.Experts}, field{"top_k", m.TopK}, field{"expert_inter", m.ExpertInter}) {
		if f.v < 1 {
			return fmt.Errorf("sim: model %q: %s is %d, must be positive", m.Name, f.name, f.v)
		}
	}
	switch {
	case m.TopK > m.Experts:
		return fmt.Errorf("sim: model %q: top_k %d exceeds its %d experts", m.Name, m.TopK, m.Experts)
	case m.DenseLayers < 0 || m.DenseLayers > m.Layers:
		return fmt.Errorf("sim: model %q: %d dense layers of %d", m.Name, m.DenseLayers, m.Layers)
	case m.DenseLayers > 0 && m.DenseInter < 1:
		return fmt.Errorf("sim: model %q: %d dense layers of width %d", m.Name, m.DenseLayers, m.DenseInter)
	case m.Vocab < 0:
		return fmt.Errorf("sim: model %q: vocab %d", m.Name, m.Vocab)
	case m.QLoraRank < 0 || m.SharedInter < 0:
		return fmt.Errorf("sim: model %q: negative q_lora_rank or shared width", m.Name)
	}
	return nil
}

// Parameter counts, per layer unless said.

// attnParams splits one MLA block's projections into the part a TP rank
// divides by heads (q_b_proj or q_proj, kv_b_proj, o_proj) and the part
// every rank keeps whole (kv_a_proj_with_mqa, whose latent is not split by
// heads, and q_a_proj, which SGLang replicates).
func (m Model) attnParams() (perHead, whole float64) {
	h, H := float64(m.Heads), float64(m.Hidden)
	if !m.mla() { // q, k, v and o: all split by heads under TP
		hd := float64(m.HeadDim)
		return H*h*hd + 2*H*float64(m.KVHeads)*hd + h*hd*H, 0
	}
	qk := float64(m.NopeDim + m.RopeDim)
	q, qA := H*h*qk, 0.0
	if m.QLoraRank > 0 {
		r := float64(m.QLoraRank)
		q, qA = r*h*qk, H*r
	}
	kvB := float64(m.KVLoraRank) * h * float64(m.NopeDim+m.VDim)
	o := h * float64(m.VDim) * H
	return q + kvB + o, qA + H*float64(m.KVLoraRank+m.RopeDim)
}

func (m Model) expertParams() float64 { return 3 * float64(m.Hidden) * float64(m.ExpertInter) }
func (m Model) sharedParams() float64 { return 3 * float64(m.Hidden) * float64(m.SharedInter) }
func (m Model) denseParams() float64  { return 3 * float64(m.Hidden) * float64(m.DenseInter) }

// Params is the model's parameter count.
func (m Model) Params() float64 {
	a, whole := m.attnParams()
	moeL := float64(m.Layers - m.DenseLayers)
	return float64(m.Layers)*(a+whole) + moeL*(float64(m.Experts)*m.expertParams()+m.sharedParams()) +
		float64(m.DenseLayers)*m.denseParams() + 2*float64(m.Vocab)*float64(m.Hidden)
}

// mla reports whether the model's attention is MLA.
func (m Model) mla() bool { return m.KVLoraRank > 0 }

// kvValues is the cache's values per token and layer on one rank with
// attention over tpRanks: MLA's latent (which heads cannot split), or the
// keys and values of the rank's key/value heads (replicated where there
// are fewer than ranks).
func (m Model) kvValues(tpRanks int) int {
	if m.mla() {
		return m.KVLoraRank + m.RopeDim
	}
	return 2 * m.HeadDim * ((m.KVHeads + tpRanks - 1) / tpRanks)
}
