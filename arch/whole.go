package arch

import (
	"errors"
	"fmt"

	"github.com/moex-project/moex/internal/errkind"
)

// ErrNoWholeModel: the family's MoE block loads, but its whole model
// (attention of a kind moex does not compute yet) does not.
var ErrNoWholeModel = errors.New("arch: no whole model of this family")

// WholeModel returns nil if moex runs the family's whole model, and
// otherwise an ErrNoWholeModel error saying why not, or the first key a
// whole model needs that the file lacks.
func (c *Config) WholeModel() error {
	f := c.fam()
	if f == nil || !f.whole {
		why := "its attention is not built yet"
		if f != nil && f.notWhole != "" {
			why = f.notWhole
		}
		return errkind.Errorf(ErrNoWholeModel, "arch: model_type %q (read as %s): moex runs its MoE block, not yet its whole model: %s", c.Name, c.Family, why)
	}
	if c.GGUF && !f.ggufWhole {
		return errkind.Errorf(ErrNoWholeModel, "arch: GGUF architecture of model_type %q: moex runs its MoE block from GGUF, not yet its whole model (the safetensors checkpoint runs whole)", c.Name)
	}
	if c.Attention.Unsupported != "" {
		return errkind.Errorf(ErrNoWholeModel, "arch: model_type %q: %s", c.Name, c.Attention.Unsupported)
	}
	for _, key := range c.Missing {
		return fmt.Errorf("arch: model_type %q: %s is missing: a whole model needs it", c.Name, key)
	}
	if c.Attention.Kind == GQA {
		a := c.Attention
		if a.Heads < 1 || a.KVHeads < 1 || a.Heads%a.KVHeads != 0 || a.HeadDim < 1 || a.HeadDim%2 != 0 {
			return fmt.Errorf("arch: model_type %q: %d heads over %d key/value heads of width %d: want positive sizes, heads a multiple of the key/value heads, an even width",
				c.Name, a.Heads, a.KVHeads, a.HeadDim)
		}
		if a.RotaryDim < 2 || a.RotaryDim > a.HeadDim {
			return fmt.Errorf("arch: model_type %q: %d rotated values of a head of %d", c.Name, a.RotaryDim, a.HeadDim)
		}
	}
	return nil
}

// Root is where the checkpoint keeps the decoder (model., or a multimodal
// model's model.language_model. or language_model.model.): the first of
// the roots where has finds the embedding.
func (c *Config) Root(has func(name string) bool) string {
	if c.GGUF {
		return ""
	}
	for _, r := range roots {
		if has(r + "embed_tokens.weight") {
			return r
		}
	}
	return roots[0]
}

// ModelNames are the embedding, final norm and output projection of a
// Hugging Face checkpoint whose decoder is under root (the output is the
// embedding when tied, as transformers ties them).
func (c *Config) ModelNames(root string) (embed, norm, head string) {
	embed, norm, head = root+"embed_tokens.weight", root+"norm.weight", "lm_head.weight"
	if c.GGUF { // llama.cpp's names; no output tensor means the embedding
		embed, norm, head = "token_embd.weight", "output_norm.weight", "output.weight"
	}
	if c.TiedEmbeddings {
		head = embed
	}
	return embed, norm, head
}

// LayerNames are one decoder layer's tensors other than the MoE block's.
// A projection's bias is its name with ".bias" for ".weight".
type LayerNames struct {
	InNorm, PostNorm     string // input_layernorm, post_attention_layernorm
	Q, K, V, O           string // the attention's projections
	QNorm, KNorm         string // the QK norms' weights, when QKNorm is set
	Sinks                string // gpt-oss's per-head sinks
	Gate, Up, Down       string // a dense layer's MLP
	Attention, MLPPrefix string // self_attn. and mlp. under the layer
}

// LayerNames are layer n's names, the decoder under root. Every family
// moex runs whole names them as transformers' Llama does.
func (c *Config) LayerNames(root string, n int) LayerNames {
	if c.GGUF {
		p := fmt.Sprintf("blk.%d.", n)
		names := LayerNames{InNorm: p + "attn_norm.weight", PostNorm: p + "ffn_norm.weight",
			Q: p + "attn_q.weight", K: p + "attn_k.weight", V: p + "attn_v.weight", O: p + "attn_output.weight",
			QNorm: p + "attn_q_norm.weight", KNorm: p + "attn_k_norm.weight", Sinks: p + "attn_sinks.weight",
			Gate: p + "ffn_gate.weight", Up: p + "ffn_up.weight", Down: p + "ffn_down.weight", Attention: p + "attn_", MLPPrefix: p + "ffn_"}
		if f := c.fam(); f != nil && f.ggufNames != nil {
			f.ggufNames(&names)
		}
		return names
	}
	p := fmt.Sprintf("%slayers.%d.", root, n)
	a, m := p+"self_attn.", p+"mlp."
	return LayerNames{InNorm: p + "input_layernorm.weight", PostNorm: p + "post_attention_layernorm.weight",
		Q: a + "q_proj.weight", K: a + "k_proj.weight", V: a + "v_proj.weight", O: a + "o_proj.weight",
		QNorm: a + "q_norm.weight", KNorm: a + "k_norm.weight", Sinks: a + "sinks",
		Gate: m + "gate_proj.weight", Up: m + "up_proj.weight", Down: m + "down_proj.weight", Attention: a, MLPPrefix: m}
}

// MLANames are one layer's MLA tensors (DeepSeek-V2/V3): q_proj, or
// q_a_proj, its norm and q_b_proj; kv_a_proj_with_mqa and its norm;
// kv_b_proj, or (newer GGUF files) its halves split per head, KB [heads,
// kv_lora_rank, qk_nope_head_dim] (each head's key half transposed) and
// VB [heads, v_head_dim, kv_lora_rank]; o_proj.
type MLANames struct {
	Q, QA, QANorm, QB, KVA, KVANorm, KVB, KB, VB, O string
}

// MLANames are layer n's MLA names, the decoder under root.
func (c *Config) MLANames(root string, n int) MLANames {
	if c.GGUF {
		p := fmt.Sprintf("blk.%d.attn_", n)
		return MLANames{Q: p + "q.weight", QA: p + "q_a.weight", QANorm: p + "q_a_norm.weight", QB: p + "q_b.weight",
			KVA: p + "kv_a_mqa.weight", KVANorm: p + "kv_a_norm.weight", KVB: p + "kv_b.weight", KB: p + "k_b.weight", VB: p + "v_b.weight",
			O: p + "output.weight"}
	}
	p := fmt.Sprintf("%slayers.%d.self_attn.", root, n)
	return MLANames{Q: p + "q_proj.weight", QA: p + "q_a_proj.weight", QANorm: p + "q_a_layernorm.weight", QB: p + "q_b_proj.weight",
		KVA: p + "kv_a_proj_with_mqa.weight", KVANorm: p + "kv_a_layernorm.weight", KVB: p + "kv_b_proj.weight", O: p + "o_proj.weight"}
}
