package moetest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
)

// GGUF is the whole model as llama.cpp's convert_hf_to_gguf.py writes it
// for architecture arch (qwen3moe, qwen2moe, gpt-oss, or llama for
// Mixtral): the
// metadata llama-model.cpp reads (the MoE block's keys as the layers'
// GGUF writer gives them, the attention's heads and widths, the norms'
// epsilon, RoPE's base, the vocabulary's size), and every tensor under
// its llama.cpp name in ggml's order of dimensions, in the spec's dtype
// (F32 or BF16), the norms in F32. For llama, q_proj's and k_proj's rows
// are permuted as the converter's LlamaModel.permute does (each head's
// halves interleaved, so that llama.cpp rotates pairs). The model must
// have no dense layers (llama.cpp's MoE architectures have none).
func (w *Whole) GGUF(arch string) ([]byte, error) {
	s := w.Spec
	if s.GQA == nil || s.FirstKDense != 0 {
		return nil, fmt.Errorf("moetest: a GGUF whole model needs grouped-query attention and no dense layer")
	}
	typ := uint32(0)
	if s.MoE.DType == "BF16" {
		typ = 30
	}
	enc := func(rows [][]float64, t uint32) []byte {
		var b []byte
		for _, r := range rows {
			for _, v := range r {
				bits := math.Float32bits(float32(v))
				if t == 30 {
					b = binary.LittleEndian.AppendUint16(b, uint16(bits>>16))
				} else {
					b = binary.LittleEndian.AppendUint32(b, bits)
				}
			}
		}
		return b
	}
	u := func(v int) uint64 { return uint64(v) }
	mat := func(name string, rows [][]float64, t uint32) GGUFTensor {
		return GGUFTensor{Name: name, Dims: []uint64{u(len(rows[0])), u(len(rows))}, Type: t, Data: enc(rows, t)}
	}
	vec := func(name string, v []float64) GGUFTensor {
		return GGUFTensor{Name: name, Dims: []uint64{u(len(v))}, Type: 0, Data: enc([][]float64{v}, 0)}
	}
	// permute interleaves each head's halves (LlamaModel.permute).
	permute := func(rows [][]float64, heads int) [][]float64 {
		d := len(rows) / heads
		out := make([][]float64, len(rows))
		for h := 0; h < heads; h++ {
			for i := 0; i < d/2; i++ {
				for half := 0; half < 2; half++ {
					out[h*d+2*i+half] = rows[h*d+half*d/2+i]
				}
			}
		}
		return out
	}
	g := *s.GQA
	tensors := []GGUFTensor{mat("token_embd.weight", w.Embed, typ), vec("output_norm.weight", w.Norm), mat("output.weight", w.LMHead, typ)}
	var kvs []GGUFKV
	for l := 0; l < s.Layers; l++ {
		p := fmt.Sprintf("blk.%d.", l)
		a := w.GQA[l]
		q, k := a.Q, a.K
		if arch == "llama" {
			q, k = permute(q, g.Heads), permute(k, g.KVHeads)
		}
		post := "ffn_norm"
		if arch == "gpt-oss" { // llama.cpp's openai_moe names it so
			post = "post_attention_norm"
		}
		tensors = append(tensors, vec(p+"attn_norm.weight", w.InNorm[l]), vec(p+post+".weight", w.PostNorm[l]),
			mat(p+"attn_q.weight", q, typ), mat(p+"attn_k.weight", k, typ), mat(p+"attn_v.weight", a.V, typ), mat(p+"attn_output.weight", a.O, typ))
		if a.QB != nil {
			tensors = append(tensors, vec(p+"attn_q.bias", a.QB), vec(p+"attn_k.bias", a.KB), vec(p+"attn_v.bias", a.VB))
		}
		if a.OB != nil {
			tensors = append(tensors, vec(p+"attn_output.bias", a.OB))
		}
		if a.Sinks != nil {
			tensors = append(tensors, vec(p+"attn_sinks.weight", a.Sinks))
		}
		if a.QNorm != nil {
			tensors = append(tensors, vec(p+"attn_q_norm.weight", a.QNorm), vec(p+"attn_k_norm.weight", a.KNorm))
		}
		mkv, mt, err := w.MoE[l].ggufParts(arch, typ, nil, nil)
		if err != nil {
			return nil, err
		}
		tensors = append(tensors, mt...)
		kvs = mkv
	}
	kv := func(k string, v any) GGUFKV { return GGUFKV{Key: k, Value: v} }
	for i, x := range kvs {
		if x.Key == arch+".block_count" {
			kvs[i].Value = uint32(s.Layers)
		}
	}
	kvs = append(kvs, kv(arch+".attention.head_count", uint32(g.Heads)), kv(arch+".attention.head_count_kv", uint32(g.KVHeads)),
		kv(arch+".attention.key_length", uint32(g.HeadDim)), kv(arch+".attention.value_length", uint32(g.HeadDim)),
		kv(arch+".attention.layer_norm_rms_epsilon", float32(1e-6)), kv(arch+".rope.freq_base", float32(g.Theta)),
		kv(arch+".vocab_size", uint32(s.Vocab)), kv(arch+".context_length", uint32(4096)))
	if g.Window > 0 {
		kvs = append(kvs, kv(arch+".attention.sliding_window", uint32(g.Window)))
	}
	if g.Yarn {
		kvs = append(kvs, kv(arch+".rope.scaling.type", "yarn"), kv(arch+".rope.scaling.factor", float32(32)),
			kv(arch+".rope.scaling.original_context_length", uint32(4096)))
	}
	var b bytes.Buffer
	if err := WriteGGUF(&b, kvs, tensors, 32); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
