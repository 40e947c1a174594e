package arch

import (
	"fmt"
	"slices"

	"github.com/moex-project/moex/format/safetensors"
)

// Config is a whole model as its family defines it, read from config.json
// (Load, Parse) or a GGUF file's metadata (FromGGUF).
type Config struct {
	// Family is the family whose computation the model is (deepseek_v3
	// for kimi_k2); Name is config.json's own model_type.
	Family, Name string
	// Architectures is config.json's architectures.
	Architectures []string

	Hidden int // hidden_size
	// Layers is num_hidden_layers: the decoder's layers, 0 when the file
	// does not say. MTPLayers are the multi-token-prediction layers a
	// checkpoint stores after them (glm4_moe's num_nextn_predict_layers):
	// not layers of the model.
	Layers, MTPLayers int
	// Vocab is vocab_size (0 when the file does not say).
	Vocab int
	// ContextLength is the positions the model was made for
	// (max_position_embeddings; GGUF's context_length); 0 when the file
	// does not say.
	ContextLength int
	// NormEps is the decoder's RMSNorm epsilon (rms_norm_eps).
	NormEps float64
	// TiedEmbeddings: the output projection is the embedding
	// (tie_word_embeddings).
	TiedEmbeddings bool
	// DenseInter is the width of a dense layer's MLP (intermediate_size
	// where the family has dense layers beside MoE ones; 0: none given).
	DenseInter int
	// Missing are the keys a whole model needs that the file lacks
	// (vocab_size, num_hidden_layers, the attention's sizes): a MoE block
	// loads without them, a whole model does not.
	Missing []string

	// Attention is the attention every layer runs.
	Attention Attention

	// MoE is the MoE block the MoE layers run.
	MoE MoE

	// Quant is config.json's quantization_config; nil when there is none.
	Quant *safetensors.Quantization
	// GGUF: the config was read from a GGUF file's metadata (FromGGUF), and
	// the tensors have llama.cpp's names.
	GGUF bool

	// Which layers are MoE (the others are dense MLPs): the family's keys,
	// as its configuration class reads them.
	FirstKDense   int   // deepseek: first_k_dense_replace
	LayerFreq     int   // deepseek: moe_layer_freq
	SparseStep    int   // qwen: decoder_sparse_step; llama4: interleave_moe_layer_step
	MLPOnlyLayers []int // qwen: mlp_only_layers
	// MoELayers lists the MoE layers where the config names them (llama4's
	// moe_layers, step3's moe_layers_enum); nil otherwise.
	MoELayers []int
	// MoEStart, MoEEnd, MoEInterval (ernie4_5_moe): layer n is MoE when
	// MoEStart ≤ n ≤ MoEEnd and (n+1) % MoEInterval == 0.
	MoEStart, MoEEnd, MoEInterval int

	family *family
}

// AttentionKind is how a layer attends.
type AttentionKind uint8

// Attention kinds.
const (
	// GQA is grouped-query attention: Heads query heads share KVHeads
	// key/value heads of HeadDim.
	GQA AttentionKind = iota + 1
	// MLA is DeepSeek's multi-head latent attention: one cached latent of
	// KVLoraRank + RopeDim values a token, shared by every head.
	MLA
)

func (k AttentionKind) String() string {
	switch k {
	case GQA:
		return "gqa"
	case MLA:
		return "mla"
	}
	return fmt.Sprintf("AttentionKind(%d)", uint8(k))
}

// Attention is a model's attention, as its config gives it.
type Attention struct {
	Kind AttentionKind
	// Heads is num_attention_heads; KVHeads num_key_value_heads (GQA).
	Heads, KVHeads int
	// HeadDim is a GQA head's width (head_dim, or hidden_size / heads).
	HeadDim int
	// MLA's widths: q_lora_rank (nil: a plain q_proj), kv_lora_rank,
	// qk_nope_head_dim, qk_rope_head_dim and v_head_dim.
	QLoraRank                          *int
	KVLoraRank, NopeDim, RopeDim, VDim int
	// Bias: the q, k and v projections have biases; OutBias: o_proj has
	// one too (gpt-oss).
	Bias, OutBias bool
	// QKNorm is the RMSNorm on the queries and keys before RoPE, if any.
	QKNorm QKNorm
	// Sinks: a learned logit per head joins the softmax's denominator
	// (gpt-oss's self_attn.sinks).
	Sinks bool
	// Window is the sliding window in tokens (a query attends to the last
	// Window positions, itself included) of the layers WindowLayers marks
	// (nil: every layer); 0: no layer has one.
	Window       int
	WindowLayers []bool
	// RotaryDim is the values of a head that RoPE rotates (head_dim ×
	// partial_rotary_factor); the rest pass unrotated.
	RotaryDim int
	// RoPE is the rotary embedding.
	RoPE RoPE
	// RoPEPairs: the stored q and k rows rotate as interleaved pairs
	// (llama.cpp's converter permutes a llama model's q_proj and k_proj
	// so; transformers rotates halves).
	RoPEPairs bool
	// Unsupported names a setting of the family's attention moex does not
	// compute yet (olmoe's clip_qkv); "" when there is none.
	Unsupported string
}

// QKNorm is where a family normalises its queries and keys.
type QKNorm uint8

// QK norms.
const (
	NoQKNorm QKNorm = iota
	// QKNormHead: one RMSNorm of head_dim shared by every head (Qwen3's
	// q_norm and k_norm).
	QKNormHead
	// QKNormWhole: one RMSNorm over all the heads' queries (keys) at once
	// (OLMoE's q_norm [heads·head_dim], k_norm [kv_heads·head_dim]).
	QKNormWhole
)

// LayerWindow is layer n's sliding window (0: it attends to everything).
func (a *Attention) LayerWindow(n int) int {
	if a.Window <= 0 || (a.WindowLayers != nil && (n >= len(a.WindowLayers) || !a.WindowLayers[n])) {
		return 0
	}
	return a.Window
}

// RoPE is a rotary position embedding: rope_theta and rope_scaling.
type RoPE struct {
	Theta   float64
	Scaling *RoPEScaling // nil: none
}

// RoPEScaling is config.json's rope_scaling.
type RoPEScaling struct {
	// Type is rope_type (or, in older configs, type): "linear", "yarn",
	// "llama3"; "" or "default" for none.
	Type            string   `json:"type"`
	RopeType        string   `json:"rope_type"`
	Factor          float64  `json:"factor"`
	OrigMaxPos      float64  `json:"original_max_position_embeddings"`
	BetaFast        float64  `json:"beta_fast"`
	BetaSlow        float64  `json:"beta_slow"`
	MScale          float64  `json:"mscale"`
	MScaleAllDm     float64  `json:"mscale_all_dim"`
	AttentionFactor *float64 `json:"attention_factor"`
	// Truncate is yarn's truncate (nil: true): false keeps the ramp's
	// bounds unrounded (gpt-oss).
	Truncate       *bool   `json:"truncate"`
	LowFreqFactor  float64 `json:"low_freq_factor"`
	HighFreqFactor float64 `json:"high_freq_factor"`
}

// MoELayer returns nil if layer n runs the MoE block, and otherwise an
// error saying why it does not (out of range, a multi-token-prediction
// layer, or a dense MLP layer: ErrDenseLayer).
func (c *Config) MoELayer(n int) error {
	if c.Layers > 0 && n >= c.Layers && n < c.Layers+c.MTPLayers {
		return fmt.Errorf("layer %d is a multi-token-prediction layer (num_nextn_predict_layers %d, stored after the model's %d layers), not a layer of the model",
			n, c.MTPLayers, c.Layers)
	}
	if n < 0 || (c.Layers > 0 && n >= c.Layers) {
		return fmt.Errorf("layer %d out of range: the model has %d layers", n, c.Layers)
	}
	if f := c.fam(); f != nil && f.dense != nil {
		return f.dense(c, n)
	}
	return nil
}

// fam is the family c was read as (for a Config built in code, the one
// its Family names); nil for an unknown one.
func (c *Config) fam() *family {
	if c.family != nil {
		return c.family
	}
	return byName[c.Family]
}

// MoENames are the tensor names of layer n's MoE block in a Hugging Face
// checkpoint, under the first of the roots where has finds its router.
func (c *Config) MoENames(n int, has func(name string) bool) MoENames {
	f := c.fam()
	if f == nil {
		return MoENames{}
	}
	for _, r := range roots {
		if nm := f.names(c, r, n); has(nm.Gate) {
			return nm
		}
	}
	return f.names(c, roots[0], n)
}

// roots are where checkpoints keep the decoder's layers: a text model's,
// and a multimodal model's text model (Qwen3.5, Qwen3-VL:
// model.language_model.; Llama 4: language_model.model.).
var roots = []string{"model.", "model.language_model.", "language_model.model."}

// MoENames are the checkpoint names of one MoE block's tensors.
type MoENames struct {
	// Gate is the router's weight; Bias its correction bias, stored
	// [BiasRows, experts] (ernie4_5_moe: 1) or [experts] (0).
	Gate, Bias string
	BiasRows   int
	RouterBias string // gpt_oss: router.bias
	// Fused is the prefix of the experts' fused 3-D tensors, stored as
	// Layout says; "" for one tensor per expert and projection (Expert).
	Fused  string
	Layout FusedLayout
	Expert func(e int) (gate, up, down string)
	Shared [3]string // the shared expert's gate, up, down
	// SharedGate: qwen2_moe's sigmoid gate of the shared expert.
	SharedGate string
	// TokenExperts: a hash layer's token → experts table (deepseek_v4).
	TokenExperts string
	// RouterScale, ExpertScale: gemma4's router.scale [hidden] and
	// per_expert_scale [experts]; Norms its block's RMSNorm weights in
	// moe.Norms' order (pre, post1, pre2, post2, post).
	RouterScale, ExpertScale string
	Norms                    [5]string
}

// FusedLayout is how a family stores its experts as fused 3-D tensors.
type FusedLayout uint8

// Fused layouts.
const (
	// FusedOI: gate_up_proj [E, 2I, H] (the gate rows, then the up rows)
	// and down_proj [E, H, I], [out, in] (Qwen3.5).
	FusedOI FusedLayout = iota + 1
	// FusedIO: the same transposed, x·W form: gate_up_proj [E, H, 2I] (the
	// gate columns, then the up columns), down_proj [E, I, H] (Qwen3-VL-MoE,
	// Llama 4).
	FusedIO
	// FusedGptOss: gpt-oss's, gate and up interleaved, with biases, MXFP4
	// or x·W form.
	FusedGptOss
	// Stacked: one 3-D tensor per projection, gate_proj and up_proj
	// [E, I, H], down_proj [E, H, I] (Step3).
	Stacked
)

// mlpNames are most families' names: mlp.gate (with
// gate.e_score_correction_bias), one tensor per expert and projection
// (experts.N.gate_proj, up_proj, down_proj) and mlp.shared_experts.
func mlpNames(c *Config, root string, layer int) MoENames {
	p := fmt.Sprintf("%slayers.%d.mlp.", root, layer)
	var n MoENames
	n.Gate, n.Bias = p+"gate.weight", p+"gate.e_score_correction_bias"
	n.Expert = perExpert(p, "gate_proj.weight", "up_proj.weight", "down_proj.weight")
	s := p + "shared_experts."
	n.Shared = [3]string{s + "gate_proj.weight", s + "up_proj.weight", s + "down_proj.weight"}
	return n
}

// perExpert names expert e's projections under prefix p.
func perExpert(p, gate, up, down string) func(e int) (string, string, string) {
	return func(e int) (string, string, string) {
		q := fmt.Sprintf("%sexperts.%d.", p, e)
		return q + gate, q + up, q + down
	}
}

// HashLayer reports whether layer n chooses its experts by token id.
func (c *MoE) HashLayer(n int) bool { return slices.Contains(c.HashLayers, n) }
