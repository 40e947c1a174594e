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
func (w *Whole) GGUF(arch string) ([]byte, error) { return w.GGUFSplit(arch, false) }

// GGUFSplit is GGUF; for deepseek2 (MLA, dense leading layers allowed)
// with kv_b_proj as one attn_kv_b tensor, or (splitKVB) split per head
// into attn_k_b [heads, kv_lora_rank, nope] (the key half transposed) and
// attn_v_b [heads, v_head_dim, kv_lora_rank], as newer files store it.
func (w *Whole) GGUFSplit(arch string, splitKVB bool) ([]byte, error) {
	s := w.Spec
	if (s.GQA == nil) != (arch == "deepseek2") || (s.GQA != nil && s.FirstKDense != 0 && arch != "glm4moe") {
		return nil, fmt.Errorf("moetest: a GGUF whole model: grouped-query attention without dense layers (but glm4moe's), or deepseek2's MLA")
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
	tensors := []GGUFTensor{mat("token_embd.weight", w.Embed, typ), vec("output_norm.weight", w.Norm), mat("output.weight", w.LMHead, typ)}
	var kvs []GGUFKV
	kv := func(k string, v any) GGUFKV { return GGUFKV{Key: k, Value: v} }
	if s.GQA == nil {
		for l := 0; l < s.Layers; l++ {
			p := fmt.Sprintf("blk.%d.", l)
			tensors = append(tensors, vec(p+"attn_norm.weight", w.InNorm[l]), vec(p+"ffn_norm.weight", w.PostNorm[l]))
			tensors = append(tensors, w.Attn[l].ggufTensors(p, typ, splitKVB, mat, vec)...)
			if d := w.Dense[l]; d != nil {
				tensors = append(tensors, mat(p+"ffn_gate.weight", d.Gate, typ), mat(p+"ffn_up.weight", d.Up, typ), mat(p+"ffn_down.weight", d.Down, typ))
				continue
			}
			mkv, mt, err := w.MoE[l].ggufParts(arch, typ, nil, nil)
			if err != nil {
				return nil, err
			}
			tensors, kvs = append(tensors, mt...), mkv
		}
		for i, x := range kvs {
			if x.Key == arch+".block_count" {
				kvs[i].Value = uint32(s.Layers)
			}
		}
		at := s.Attn
		kvs = append(kvs, kv(arch+".attention.head_count", uint32(at.Heads)), kv(arch+".attention.head_count_kv", uint32(at.Heads)),
			kv(arch+".attention.key_length", uint32(at.Nope+at.Rope)), kv(arch+".attention.value_length", uint32(at.VDim)),
			kv(arch+".attention.kv_lora_rank", uint32(at.KVLoraRank)), kv(arch+".attention.q_lora_rank", uint32(at.QLoraRank)),
			kv(arch+".rope.dimension_count", uint32(at.Rope)), kv(arch+".rope.freq_base", float32(at.Theta)),
			kv(arch+".attention.layer_norm_rms_epsilon", float32(1e-6)), kv(arch+".vocab_size", uint32(s.Vocab)),
			kv(arch+".feed_forward_length", uint32(s.DenseInter)))
		if at.Yarn { // DeepSeek-V2-Lite's, as the converter writes it: log multiplier 0.1·mscale_all_dim
			kvs = append(kvs, kv(arch+".rope.scaling.type", "yarn"), kv(arch+".rope.scaling.factor", float32(40)),
				kv(arch+".rope.scaling.original_context_length", uint32(4096)), kv(arch+".rope.scaling.yarn_log_multiplier", float32(0.0707)))
		}
		var b bytes.Buffer
		if err := WriteGGUF(&b, kvs, tensors, 32); err != nil {
			return nil, err
		}
		return b.Bytes(), nil
	}
	g := *s.GQA
	for l := 0; l < s.Layers; l++ {
		p := fmt.Sprintf("blk.%d.", l)
		a := w.GQA[l]
		q, k := a.Q, a.K
		if arch == "llama" {
			q, k = permute(q, g.Heads), permute(k, g.KVHeads)
		}
		post := "ffn_norm"
		if arch == "gpt-oss" || arch == "glm4moe" { // llama.cpp's openai_moe and glm4moe name it so
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
		if d := w.Dense[l]; d != nil {
			tensors = append(tensors, mat(p+"ffn_gate.weight", d.Gate, typ), mat(p+"ffn_up.weight", d.Up, typ), mat(p+"ffn_down.weight", d.Down, typ))
			continue
		}
		mkv, mt, err := w.MoE[l].ggufParts(arch, typ, nil, nil)
		if err != nil {
			return nil, err
		}
		tensors = append(tensors, mt...)
		kvs = mkv
	}
	for i, x := range kvs {
		if x.Key == arch+".block_count" {
			kvs[i].Value = uint32(s.Layers)
			if arch == "glm4moe" { // the MTP layer counts among the blocks (its tensors are not written)
				kvs[i].Value = uint32(s.Layers + 1)
			}
		}
	}
	if g.Partial != 0 {
		kvs = append(kvs, kv(arch+".rope.dimension_count", uint32(float64(g.HeadDim)*g.Partial)))
	}
	if s.FirstKDense > 0 {
		kvs = append(kvs, kv(arch+".feed_forward_length", uint32(s.DenseInter)))
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

// ggufTensors are the MLA block's tensors under llama.cpp's names (p:
// blk.N.), kv_b whole or split per head.
func (m *AttnModel) ggufTensors(p string, typ uint32, splitKVB bool, mat func(string, [][]float64, uint32) GGUFTensor,
	vec func(string, []float64) GGUFTensor) []GGUFTensor {
	s := m.Spec
	var out []GGUFTensor
	if s.QLoraRank == 0 {
		out = append(out, mat(p+"attn_q.weight", m.QProj, typ))
	} else {
		out = append(out, mat(p+"attn_q_a.weight", m.QA, typ), vec(p+"attn_q_a_norm.weight", m.QANorm), mat(p+"attn_q_b.weight", m.QB, typ))
	}
	out = append(out, mat(p+"attn_kv_a_mqa.weight", m.KVA, typ), vec(p+"attn_kv_a_norm.weight", m.KVANorm), mat(p+"attn_output.weight", m.OProj, typ))
	if !splitKVB {
		return append(out, mat(p+"attn_kv_b.weight", m.KVB, typ))
	}
	L, per := s.KVLoraRank, s.Nope+s.VDim
	var kb, vb [][]float64 // [heads·L][nope] and [heads·v][L], stacked by head
	for h := 0; h < s.Heads; h++ {
		for c := 0; c < L; c++ {
			row := make([]float64, s.Nope)
			for j := range row {
				row[j] = m.KVB[h*per+j][c]
			}
			kb = append(kb, row)
		}
		for j := 0; j < s.VDim; j++ {
			vb = append(vb, m.KVB[h*per+s.Nope+j])
		}
	}
	k, v := mat(p+"attn_k_b.weight", kb, typ), mat(p+"attn_v_b.weight", vb, typ)
	k.Dims = []uint64{uint64(s.Nope), uint64(L), uint64(s.Heads)}
	v.Dims = []uint64{uint64(L), uint64(s.VDim), uint64(s.Heads)}
	return append(out, k, v)
}
