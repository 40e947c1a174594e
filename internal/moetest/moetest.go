// Package moetest makes random MoE checkpoints of every supported family and
// holds the float64 references of a MoE block and of MLA attention, written
// from the model definitions and independent of the code under test: it
// reads nothing of moe's config parsing, gating or kernels, nor of dpattn.
// It is the only source of golden numbers in the tests.
package moetest

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/moex-project/moex/internal/stwrite"
)

// Spec describes a random checkpoint. The semantic fields are explicit; the
// generator writes them into config.json under each family's field names.
type Spec struct {
	ModelType string // mixtral, qwen2_moe, qwen3_moe, deepseek_v2, deepseek_v3, gpt_oss
	Hidden    int
	Experts   int
	TopK      int
	Inter     int // routed expert width
	NumLayers int // num_hidden_layers (≥ Layer+1)
	Layer     int // the MoE layer whose tensors are written

	SharedExperts int // deepseek: n_shared_experts (width SharedExperts×Inter)
	SharedInter   int // qwen2_moe: shared_expert_intermediate_size

	NormTopK  bool    // qwen and deepseek; mixtral always renormalises
	Scaling   float64 // deepseek: routed_scaling_factor (0 means 1)
	Method    string  // deepseek topk_method: greedy, group_limited_greedy, noaux_tc
	Scoring   string  // deepseek scoring_func: softmax, sigmoid
	NGroup    int
	TopKGroup int

	FirstKDense int   // deepseek first_k_dense_replace
	SparseStep  int   // qwen decoder_sparse_step (0 means 1)
	MLPOnly     []int // qwen mlp_only_layers

	// DType is F32, BF16 or F16: the dtype of every weight but the bias
	// (F32); or F8_E4M3: the experts (routed and shared) as fine-grained
	// FP8 with their _scale_inv, the router and qwen2_moe's shared-expert
	// gate BF16, as the FP8 checkpoints ship them.
	// Or INT4: the experts as compressed-tensors' pack-quantized symmetric
	// int4 (weight_packed, weight_scale, weight_shape), the router BF16.
	// Or MXFP4 (gpt_oss only): the experts' _blocks and _scales, the rest
	// BF16.
	DType string
	// FP8Block is the FP8 scale block [rows, cols] (zero: [128, 128]),
	// GroupSize INT4's group along a row (zero: 32), and ScaleDType the
	// scales' dtype (F32 or BF16; zero: F32 for FP8, BF16 for INT4).
	FP8Block   [2]int
	GroupSize  int
	ScaleDType string
	Shards     int // > 1 writes a sharded checkpoint
	// SwigluLimit is gpt_oss's and deepseek_v4's swiglu_limit (zero: 7
	// and 10).
	SwigluLimit float64
	// HashLayers (deepseek_v4): the first HashLayers layers choose their
	// experts by token id from a tid2eid table of Vocab rows, written as
	// num_hash_layers, or as mlp_layer_types when LayerTypes is set.
	HashLayers int
	Vocab      int
	LayerTypes bool
	// DenseInter is gemma4's dense MLP width (intermediate_size); with
	// DoubleWide and KVShared > 0 (use_double_wide_mlp,
	// num_kv_shared_layers) the last KVShared layers' is twice that.
	// TextOnly writes a gemma4_text checkpoint (Gemma4ForCausalLM, tensors
	// under model.) rather than the multimodal wrapper.
	DenseInter int
	DoubleWide bool
	KVShared   int
	TextOnly   bool
	// PerExpert writes qwen3_5_moe's, qwen3_vl_moe's and deepseek_v4's
	// experts as one tensor per expert and projection
	// (experts.N.gate_proj.weight, ...), as FP8 and INT4 releases made
	// Linear by Linear store them, instead of fused 3-D tensors; with
	// DType F8_E4M3 or INT4 they are quantized.
	PerExpert bool
	Seed      uint64
	// HotExpert > 0 makes expert HotExpert-1 win every token whose input is
	// positive (its gate row is all ones).
	HotExpert int
	// Extra overrides config.json keys; a nil value deletes the key.
	Extra map[string]any
}

// Expert64 is one gated expert in float64.
type Expert64 struct {
	Gate, Up [][]float64 // [inter][hidden]
	Down     [][]float64 // [hidden][inter]
	// GateBias, UpBias [inter], DownBias [hidden]: gpt_oss only.
	GateBias, UpBias, DownBias []float64
}

// Model is a generated checkpoint: its config.json, its tensors, and the
// same weights widened exactly from their stored dtype to float64.
type Model struct {
	Spec       Spec
	Config     map[string]any
	Tensors    []stwrite.Tensor
	Gate       [][]float64 // [experts][hidden]
	Bias       []float64   // [experts], noaux_tc only
	RouterBias []float64   // [experts], gpt_oss only: added to the logits
	Experts    []Expert64
	Shared     *Expert64 // the shared expert; gemma4's dense MLP
	SharedGate []float64 // [hidden], qwen2_moe only

	// TokenExperts [vocab][top_k]: deepseek_v4's tid2eid of a hash layer,
	// in stored order.
	TokenExperts [][]int
	// RouterScale [hidden], ExpertScale [experts] and Norms [hidden] each
	// (pre_feedforward_layernorm, post_feedforward_layernorm_1,
	// pre_feedforward_layernorm_2, post_feedforward_layernorm_2,
	// post_feedforward_layernorm): gemma4 only.
	RouterScale, ExpertScale []float64
	Norms                    [5][]float64
}

// Hash reports whether the spec's layer chooses its experts by token id.
func (s Spec) Hash() bool { return s.ModelType == "deepseek_v4" && s.Layer < s.HashLayers }

// denseInter is gemma4's dense MLP width at the spec's layer.
func (s Spec) denseInter() int {
	if s.DoubleWide && s.KVShared > 0 && s.Layer >= s.NumLayers-s.KVShared {
		return 2 * s.DenseInter
	}
	return s.DenseInter
}

// Generate makes a random model; WriteTo then writes it to a folder.
func Generate(s Spec) (*Model, error) {
	if s.NumLayers == 0 {
		s.NumLayers = s.Layer + 1
	}
	if s.DType == "" {
		s.DType = "F32"
	}
	if s.ModelType == "gpt_oss" {
		return generateGptOss(s)
	}
	m := &Model{Spec: s}
	rng := rand.New(rand.NewPCG(s.Seed, 0x6d6f6578))
	H, I, E := s.Hidden, s.Inter, s.Experts
	prefix := fmt.Sprintf("model.layers.%d.mlp.", s.Layer)
	switch s.ModelType {
	case "qwen3_5_moe", "qwen3_vl_moe":
		prefix = fmt.Sprintf("model.language_model.layers.%d.mlp.", s.Layer) // the text model of a multimodal checkpoint
	case "mixtral", "minimax_m2":
		prefix = fmt.Sprintf("model.layers.%d.block_sparse_moe.", s.Layer)
	case "llama4":
		prefix = fmt.Sprintf("language_model.model.layers.%d.feed_forward.", s.Layer)
	case "step3_text": // the router and experts under moe., the shared expert beside them
		prefix = fmt.Sprintf("model.layers.%d.", s.Layer)
	case "gemma4": // the decoder layer holds the router, experts and norms
		prefix = fmt.Sprintf("model.language_model.layers.%d.", s.Layer)
		if s.TextOnly {
			prefix = fmt.Sprintf("model.layers.%d.", s.Layer)
		}
	}
	gateName, biasName := prefix+"gate.weight", prefix+"gate.e_score_correction_bias"
	switch s.ModelType {
	case "step3_text":
		gateName = prefix + "moe.gate.weight"
	case "gemma4":
		gateName = prefix + "router.proj.weight"
	case "llama4":
		gateName = prefix + "router.weight"
	case "minimax_m2":
		biasName = prefix + "e_score_correction_bias"
	case "ernie4_5_moe":
		biasName = prefix + "moe_statics.e_score_correction_bias"
	}
	var err error
	add := func(name, dtype string, rows, cols int, scale float64, fill func(r, c int) (float64, bool)) [][]float64 {
		v := make([]float32, rows*cols)
		for i := range v {
			if f, ok := fill(i/cols, i%cols); ok {
				v[i] = float32(f)
			} else {
				v[i] = float32((rng.Float64()*2 - 1) * scale)
			}
		}
		b, e := stwrite.Encode(dtype, v)
		if e != nil {
			err = e
			return nil
		}
		shape := []int{rows, cols}
		if rows == 1 && cols == E && name == biasName && s.ModelType != "ernie4_5_moe" {
			shape = []int{cols} // ernie4_5_moe's is [1, experts]
		}
		if rows == 1 && s.ModelType == "gemma4" && name != gateName {
			shape = []int{cols} // gemma4's scales and norm weights
		}
		m.Tensors = append(m.Tensors, stwrite.Tensor{Name: name, DType: dtype, Shape: shape, Data: b})
		w, _ := stwrite.Decode(dtype, b)
		out := make([][]float64, rows)
		for r := range out {
			out[r] = w[r*cols : (r+1)*cols]
		}
		return out
	}
	if s.DType == "F8_E4M3" {
		if s.FP8Block == [2]int{} {
			s.FP8Block = [2]int{128, 128}
			m.Spec.FP8Block = s.FP8Block
		}
		if s.ScaleDType == "" {
			s.ScaleDType = "F32"
			m.Spec.ScaleDType = s.ScaleDType
		}
	}
	if s.DType == "INT4" {
		if s.GroupSize == 0 {
			s.GroupSize = 32
			m.Spec.GroupSize = 32
		}
		if s.ScaleDType == "" {
			s.ScaleDType = "BF16"
			m.Spec.ScaleDType = s.ScaleDType
		}
	}
	// addWeight is add for an expert's weight: FP8 or INT4 with its scales
	// where the checkpoint is quantized.
	addWeight := func(name string, rows, cols int, scale float64) [][]float64 {
		if s.DType == "INT4" {
			v := make([]float64, rows*cols)
			for i := range v {
				v[i] = (rng.Float64()*2 - 1) * scale
			}
			packed, scales, vals, e := quantizeINT4(v, rows, cols, s.GroupSize, s.ScaleDType)
			if e != nil {
				err = e
				return nil
			}
			m.Tensors = append(m.Tensors,
				stwrite.Tensor{Name: name + "_packed", DType: "I32", Shape: []int{rows, cols / 8}, Data: packed},
				stwrite.Tensor{Name: name + "_scale", DType: s.ScaleDType, Shape: []int{rows, cols / s.GroupSize}, Data: scales},
				stwrite.Tensor{Name: name + "_shape", DType: "I32", Shape: []int{2}, Data: binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, uint32(rows)), uint32(cols))})
			return vals
		}
		if s.DType != "F8_E4M3" {
			return add(name, s.DType, rows, cols, scale, func(int, int) (float64, bool) { return 0, false })
		}
		v := make([]float64, rows*cols)
		for i := range v {
			v[i] = (rng.Float64()*2 - 1) * scale
		}
		data, scales, vals, e := quantizeFP8(v, rows, cols, s.FP8Block, s.ScaleDType)
		if e != nil {
			err = e
			return nil
		}
		br, bc := s.FP8Block[0], s.FP8Block[1]
		m.Tensors = append(m.Tensors,
			stwrite.Tensor{Name: name, DType: "F8_E4M3", Shape: []int{rows, cols}, Data: data},
			stwrite.Tensor{Name: name + "_scale_inv", DType: s.ScaleDType, Shape: []int{(rows + br - 1) / br, (cols + bc - 1) / bc}, Data: scales})
		return vals
	}
	routerDType := s.DType
	if s.DType == "F8_E4M3" || s.DType == "INT4" {
		routerDType = "BF16"
	}
	none := func(int, int) (float64, bool) { return 0, false }
	hot := func(r, c int) (float64, bool) { return 1, s.HotExpert > 0 && r == s.HotExpert-1 }

	m.Gate = add(gateName, routerDType, E, H, 2/math.Sqrt(float64(H)), hot)
	if s.ModelType == "deepseek_v3" || s.Method == "noaux_tc" || slices.Contains([]string{"glm4_moe", "dots1", "minimax_m2", "ernie4_5_moe"}, s.ModelType) ||
		s.ModelType == "deepseek_v4" && !s.Hash() {
		m.Bias = add(biasName, "F32", 1, E, 0.05, none)[0]
	}
	if s.Hash() {
		// tid2eid [vocab, top_k] I64: distinct experts per token, in no
		// particular order.
		b := make([]byte, 0, s.Vocab*s.TopK*8)
		for range s.Vocab {
			row := rng.Perm(E)[:s.TopK]
			m.TokenExperts = append(m.TokenExperts, row)
			for _, e := range row {
				b = binary.LittleEndian.AppendUint64(b, uint64(e))
			}
		}
		m.Tensors = append(m.Tensors, stwrite.Tensor{Name: prefix + "gate.tid2eid", DType: "I64", Shape: []int{s.Vocab, s.TopK}, Data: b})
	}
	if s.ModelType == "gemma4" {
		// Scales and norm weights around one, so that each matters.
		around1 := func(int, int) (float64, bool) { return 0.5 + rng.Float64(), true }
		m.RouterScale = add(prefix+"router.scale", routerDType, 1, H, 0, around1)[0]
		m.ExpertScale = add(prefix+"router.per_expert_scale", routerDType, 1, E, 0, around1)[0]
		for i, n := range []string{"pre_feedforward_layernorm", "post_feedforward_layernorm_1", "pre_feedforward_layernorm_2",
			"post_feedforward_layernorm_2", "post_feedforward_layernorm"} {
			m.Norms[i] = add(prefix+n+".weight", routerDType, 1, H, 0, around1)[0]
		}
	}
	expert := func(p, gate, up, down string, inter int) Expert64 {
		return Expert64{
			Gate: addWeight(p+gate, inter, H, 1/math.Sqrt(float64(H))),
			Up:   addWeight(p+up, inter, H, 1/math.Sqrt(float64(H))),
			Down: addWeight(p+down, H, inter, 1/math.Sqrt(float64(inter))),
		}
	}
	m.Experts = make([]Expert64, E)
	if s.ModelType == "qwen3_vl_moe" && !s.PerExpert || s.ModelType == "llama4" {
		// Fused, x·W: gate_up_proj [E, H, 2I] (expert e's gate columns, then
		// its up columns), down_proj [E, I, H].
		gate, up, down := make([][][]float64, E), make([][][]float64, E), make([][][]float64, E)
		for e := range gate {
			gate[e], up[e], down[e] = randMat(rng, I, H, 1/math.Sqrt(float64(H))), randMat(rng, I, H, 1/math.Sqrt(float64(H))), randMat(rng, H, I, 1/math.Sqrt(float64(I)))
		}
		gu := make([]float32, 0, E*H*2*I)
		dn := make([]float32, 0, E*I*H)
		for e := range gate {
			for k := 0; k < H; k++ {
				for n := 0; n < 2*I; n++ {
					if n < I {
						gu = append(gu, float32(gate[e][n][k]))
					} else {
						gu = append(gu, float32(up[e][n-I][k]))
					}
				}
			}
			for k := 0; k < I; k++ {
				for n := 0; n < H; n++ {
					dn = append(dn, float32(down[e][n][k]))
				}
			}
		}
		gub, e1 := stwrite.Encode(s.DType, gu)
		db, e2 := stwrite.Encode(s.DType, dn)
		if e1 != nil || e2 != nil {
			return nil, fmt.Errorf("moetest: %v %v", e1, e2)
		}
		m.Tensors = append(m.Tensors, stwrite.Tensor{Name: prefix + "experts.gate_up_proj", DType: s.DType, Shape: []int{E, H, 2 * I}, Data: gub},
			stwrite.Tensor{Name: prefix + "experts.down_proj", DType: s.DType, Shape: []int{E, I, H}, Data: db})
		guw, _ := stwrite.Decode(s.DType, gub)
		dw, _ := stwrite.Decode(s.DType, db)
		for e := range m.Experts {
			x := &m.Experts[e]
			x.Gate, x.Up, x.Down = make([][]float64, I), make([][]float64, I), make([][]float64, H)
			for n := 0; n < I; n++ {
				x.Gate[n], x.Up[n] = make([]float64, H), make([]float64, H)
				for k := 0; k < H; k++ {
					x.Gate[n][k] = guw[(e*H+k)*2*I+n]
					x.Up[n][k] = guw[(e*H+k)*2*I+I+n]
				}
			}
			for n := 0; n < H; n++ {
				x.Down[n] = make([]float64, I)
				for k := 0; k < I; k++ {
					x.Down[n][k] = dw[(e*I+k)*H+n]
				}
			}
		}
	}
	if (s.ModelType == "qwen3_5_moe" || s.ModelType == "deepseek_v4") && !s.PerExpert || s.ModelType == "gemma4" {
		// Fused, [out, in]: gate_up_proj [E, 2I, H] (expert e's gate rows,
		// then its up rows), down_proj [E, H, I].
		gu := make([]float64, 0, E*2*I*H)
		dn := make([]float64, 0, E*H*I)
		for range m.Experts {
			for i := 0; i < 2*I*H; i++ {
				gu = append(gu, (rng.Float64()*2-1)/math.Sqrt(float64(H)))
			}
			for i := 0; i < H*I; i++ {
				dn = append(dn, (rng.Float64()*2-1)/math.Sqrt(float64(I)))
			}
		}
		fused := func(name string, shape []int, v []float64) []float64 {
			f := make([]float32, len(v))
			for i, x := range v {
				f[i] = float32(x)
			}
			b, e := stwrite.Encode(s.DType, f)
			if e != nil {
				err = e
				return nil
			}
			m.Tensors = append(m.Tensors, stwrite.Tensor{Name: name, DType: s.DType, Shape: shape, Data: b})
			w, _ := stwrite.Decode(s.DType, b)
			return w
		}
		guw := fused(prefix+"experts.gate_up_proj", []int{E, 2 * I, H}, gu)
		dw := fused(prefix+"experts.down_proj", []int{E, H, I}, dn)
		for e := range m.Experts {
			if err != nil {
				break
			}
			x := &m.Experts[e]
			for r := 0; r < 2*I; r++ {
				row := guw[(e*2*I+r)*H:][:H]
				if r < I {
					x.Gate = append(x.Gate, row)
				} else {
					x.Up = append(x.Up, row)
				}
			}
			for r := 0; r < H; r++ {
				x.Down = append(x.Down, dw[(e*H+r)*I:][:I])
			}
		}
	}
	if s.ModelType == "step3_text" {
		// One 3-D tensor per projection: gate_proj, up_proj [E, I, H],
		// down_proj [E, H, I].
		stack := func(name string, rows, cols int) [][][]float64 {
			v := add(prefix+"moe."+name, s.DType, E*rows, cols, 1/math.Sqrt(float64(cols)), none)
			find := &m.Tensors[len(m.Tensors)-1]
			find.Shape = []int{E, rows, cols}
			out := make([][][]float64, E)
			for e := range out {
				out[e] = v[e*rows : (e+1)*rows]
			}
			return out
		}
		g, u, d := stack("gate_proj.weight", I, H), stack("up_proj.weight", I, H), stack("down_proj.weight", H, I)
		for e := range m.Experts {
			m.Experts[e] = Expert64{Gate: g[e], Up: u[e], Down: d[e]}
		}
	}
	for e := range m.Experts {
		p := fmt.Sprintf("%sexperts.%d.", prefix, e)
		perExpert := s.PerExpert && slices.Contains([]string{"qwen3_5_moe", "qwen3_vl_moe", "deepseek_v4"}, s.ModelType)
		if !perExpert && slices.Contains([]string{"qwen3_5_moe", "qwen3_vl_moe", "llama4", "deepseek_v4", "gemma4", "step3_text"}, s.ModelType) {
			break
		}
		if s.ModelType == "mixtral" || s.ModelType == "minimax_m2" {
			m.Experts[e] = expert(p, "w1.weight", "w3.weight", "w2.weight", I)
		} else {
			m.Experts[e] = expert(p, "gate_proj.weight", "up_proj.weight", "down_proj.weight", I)
		}
	}
	switch {
	case (s.ModelType == "qwen2_moe" || s.ModelType == "qwen3_next" || s.ModelType == "qwen3_5_moe") && s.SharedInter > 0:
		sh := expert(prefix+"shared_expert.", "gate_proj.weight", "up_proj.weight", "down_proj.weight", s.SharedInter)
		m.Shared = &sh
		m.SharedGate = add(prefix+"shared_expert_gate.weight", routerDType, 1, H, 2/math.Sqrt(float64(H)), none)[0]
	case s.ModelType == "llama4":
		sh := expert(prefix+"shared_expert.", "gate_proj.weight", "up_proj.weight", "down_proj.weight", I)
		m.Shared = &sh
	case s.ModelType == "step3_text":
		sh := expert(prefix+"share_expert.", "gate_proj.weight", "up_proj.weight", "down_proj.weight", s.SharedInter)
		m.Shared = &sh
	case s.ModelType == "gemma4":
		sh := expert(prefix+"mlp.", "gate_proj.weight", "up_proj.weight", "down_proj.weight", s.denseInter())
		m.Shared = &sh
	case DeepSeekBlock(s.ModelType) && s.SharedExperts > 0, s.ModelType == "ernie4_5_moe" && s.SharedExperts > 0,
		s.ModelType == "deepseek_v4" && s.SharedExperts > 0:
		sh := expert(prefix+"shared_experts.", "gate_proj.weight", "up_proj.weight", "down_proj.weight", s.SharedExperts*I)
		m.Shared = &sh
	}
	if err != nil {
		return nil, err
	}
	m.Config = configJSON(s)
	return m, nil
}

// WriteTo writes the model as a Hugging Face checkpoint folder.
func (m *Model) WriteTo(dir string) error {
	return stwrite.WriteCheckpoint(dir, m.Config, m.Tensors, m.Spec.Shards)
}

func configJSON(s Spec) map[string]any {
	c := map[string]any{
		"model_type":          s.ModelType,
		"hidden_size":         s.Hidden,
		"num_hidden_layers":   s.NumLayers,
		"num_experts_per_tok": s.TopK,
		"torch_dtype":         map[string]string{"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F8_E4M3": "bfloat16", "INT4": "bfloat16"}[s.DType],
	}
	if s.DType == "F8_E4M3" {
		c["quantization_config"] = map[string]any{"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
			"weight_block_size": []int{s.FP8Block[0], s.FP8Block[1]},
			// MiniMax-M2's list: "gate" is each layer's router, not the experts' gate_proj.
			"modules_to_not_convert": []string{"gate", "e_score_correction_bias", "lm_head"}}
	}
	if s.DType == "INT4" {
		c["quantization_config"] = map[string]any{"quant_method": "compressed-tensors", "format": "pack-quantized",
			"config_groups": map[string]any{"group_0": map[string]any{
				"targets":           []string{"Linear"},
				"weights":           map[string]any{"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": s.GroupSize, "dynamic": false},
				"input_activations": nil,
			}},
			"ignore": []string{"lm_head", "re:.*mlp.gate$"}}
	}
	switch s.ModelType {
	case "mixtral":
		c["num_local_experts"] = s.Experts
		c["intermediate_size"] = s.Inter
	case "qwen2_moe", "qwen3_moe", "qwen3_next":
		c["num_experts"] = s.Experts
		c["moe_intermediate_size"] = s.Inter
		c["intermediate_size"] = 4 * s.Hidden
		c["norm_topk_prob"] = s.NormTopK
		c["decoder_sparse_step"] = max(s.SparseStep, 1)
		c["mlp_only_layers"] = append([]int{}, s.MLPOnly...)
		if s.ModelType != "qwen3_moe" {
			c["shared_expert_intermediate_size"] = s.SharedInter
		}
	case "qwen3_5_moe":
		// Qwen3_5MoeConfig: the text model's fields under text_config
		// (whose model_type is qwen3_5_moe_text); every layer MoE, always
		// renormalised (no norm_topk_prob, decoder_sparse_step or
		// mlp_only_layers keys).
		text := map[string]any{"model_type": "qwen3_5_moe_text", "num_experts": s.Experts,
			"moe_intermediate_size": s.Inter, "shared_expert_intermediate_size": s.SharedInter}
		for _, k := range []string{"hidden_size", "num_hidden_layers", "num_experts_per_tok", "torch_dtype"} {
			text[k] = c[k]
			delete(c, k)
		}
		c["architectures"] = []string{"Qwen3_5MoeForConditionalGeneration"}
		c["text_config"] = text
	case "olmoe":
		c["num_experts"] = s.Experts
		c["intermediate_size"] = s.Inter
		c["norm_topk_prob"] = s.NormTopK
	case "minimax_m2":
		c["num_local_experts"] = s.Experts
		c["intermediate_size"] = s.Inter
		c["scoring_func"] = "sigmoid"
		c["use_routing_bias"] = true
	case "ernie4_5_moe":
		// Ernie4_5_MoeConfig's names: moe_k for the top-k.
		delete(c, "num_experts_per_tok")
		c["moe_num_experts"] = s.Experts
		c["moe_k"] = s.TopK
		c["moe_intermediate_size"] = s.Inter
		c["intermediate_size"] = 4 * s.Hidden
		c["moe_num_shared_experts"] = s.SharedExperts
		c["moe_layer_start_index"] = s.FirstKDense
		c["moe_layer_end_index"] = s.NumLayers - 1
		c["moe_layer_interval"] = max(s.SparseStep, 1)
	case "qwen3_vl_moe", "llama4":
		text := map[string]any{"model_type": s.ModelType + "_text"}
		if s.ModelType == "qwen3_vl_moe" {
			text["num_experts"], text["moe_intermediate_size"], text["norm_topk_prob"] = s.Experts, s.Inter, s.NormTopK
			text["decoder_sparse_step"] = max(s.SparseStep, 1)
			c["architectures"] = []string{"Qwen3VLMoeForConditionalGeneration"}
		} else {
			text["num_local_experts"], text["intermediate_size"], text["intermediate_size_mlp"] = s.Experts, s.Inter, 2*s.Inter
			text["interleave_moe_layer_step"] = max(s.SparseStep, 1)
			c["architectures"] = []string{"Llama4ForConditionalGeneration"}
		}
		for _, k := range []string{"hidden_size", "num_hidden_layers", "num_experts_per_tok", "torch_dtype"} {
			text[k] = c[k]
			delete(c, k)
		}
		c["text_config"] = text
	case "deepseek_v4":
		c["architectures"] = []string{"DeepseekV4ForCausalLM"}
		c["n_routed_experts"] = s.Experts
		c["moe_intermediate_size"] = s.Inter
		c["n_shared_experts"] = s.SharedExperts
		c["norm_topk_prob"] = true
		c["routed_scaling_factor"] = scaling(s)
		c["scoring_func"] = "sqrtsoftplus"
		c["swiglu_limit"] = v4Limit(s)
		c["vocab_size"] = s.Vocab
		c["num_nextn_predict_layers"] = 1
		if s.LayerTypes {
			types := make([]string, s.NumLayers)
			for i := range types {
				types[i] = "moe"
				if i < s.HashLayers {
					types[i] = "hash_moe"
				}
			}
			c["mlp_layer_types"] = types
		} else {
			c["num_hash_layers"] = s.HashLayers
		}
	case "step3_text":
		// Step3TextConfig's names, under Step3VLConfig's text_config
		// unless TextOnly; the MoE layers from FirstKDense on, listed.
		delete(c, "num_experts_per_tok")
		var layers []string
		for i := s.FirstKDense; i < s.NumLayers; i++ {
			layers = append(layers, fmt.Sprint(i))
		}
		text := map[string]any{"model_type": "step3_text", "moe_num_experts": s.Experts, "moe_top_k": s.TopK,
			"moe_intermediate_size": s.Inter, "share_expert_dim": s.SharedInter, "norm_expert_weight": s.NormTopK,
			"intermediate_size": 4 * s.Hidden, "moe_layers_enum": strings.Join(layers, ",")}
		for _, k := range []string{"hidden_size", "num_hidden_layers", "torch_dtype"} {
			text[k] = c[k]
			delete(c, k)
		}
		if s.TextOnly {
			text["architectures"] = []string{"Step3TextForCausalLM"}
			c = text
		} else {
			c["model_type"] = "step3_vl"
			c["architectures"] = []string{"Step3VLForConditionalGeneration"}
			c["text_config"] = text
		}
	case "gemma4":
		// Gemma4TextConfig's names, under text_config unless TextOnly.
		delete(c, "num_experts_per_tok")
		text := map[string]any{"model_type": "gemma4_text", "num_experts": s.Experts, "top_k_experts": s.TopK,
			"moe_intermediate_size": s.Inter, "intermediate_size": s.DenseInter, "enable_moe_block": true,
			"hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "num_kv_shared_layers": s.KVShared,
			"use_double_wide_mlp": s.DoubleWide}
		for _, k := range []string{"hidden_size", "num_hidden_layers", "torch_dtype"} {
			text[k] = c[k]
			delete(c, k)
		}
		if s.TextOnly {
			text["architectures"] = []string{"Gemma4ForCausalLM"}
			c = text
		} else {
			c["architectures"] = []string{"Gemma4ForConditionalGeneration"}
			c["text_config"] = text
		}
	case "deepseek_v2", "deepseek_v3", "glm4_moe", "dots1":
		c["n_routed_experts"] = s.Experts
		c["moe_intermediate_size"] = s.Inter
		c["intermediate_size"] = 4 * s.Hidden
		c["n_shared_experts"] = s.SharedExperts
		c["norm_topk_prob"] = s.NormTopK
		c["routed_scaling_factor"] = scaling(s)
		if s.ModelType == "glm4_moe" {
			c["num_nextn_predict_layers"] = 1
		}
		if s.ModelType == "deepseek_v2" || s.ModelType == "deepseek_v3" {
			// glm4_moe's and dots1's configuration classes have neither:
			// always DeepSeek-V3's noaux_tc on sigmoid scores.
			c["topk_method"] = s.Method
			c["scoring_func"] = s.Scoring
		}
		c["n_group"] = s.NGroup
		c["topk_group"] = s.TopKGroup
		c["first_k_dense_replace"] = s.FirstKDense
		c["moe_layer_freq"] = 1
	}
	for k, v := range s.Extra {
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
	}
	return c
}

// DeepSeekBlock reports whether family t computes DeepSeek-V2/V3's block
// (glm4_moe and dots1 are V3's under their own configuration classes).
func DeepSeekBlock(t string) bool {
	return t == "deepseek_v2" || t == "deepseek_v3" || t == "glm4_moe" || t == "dots1"
}

// randMat is a [rows, cols] matrix uniform in [-scale, scale).
func randMat(rng *rand.Rand, rows, cols int, scale float64) [][]float64 {
	m := make([][]float64, rows)
	for r := range m {
		m[r] = make([]float64, cols)
		for c := range m[r] {
			m[r][c] = (rng.Float64()*2 - 1) * scale
		}
	}
	return m
}

func v4Limit(s Spec) float64 {
	if s.SwigluLimit == 0 {
		return 10
	}
	return s.SwigluLimit
}

// Tokens returns random token ids [tokens] in [0, vocab).
func Tokens(seed uint64, tokens, vocab int) []int32 {
	rng := rand.New(rand.NewPCG(seed, 0x746f6b))
	ids := make([]int32, tokens)
	for i := range ids {
		ids[i] = int32(rng.IntN(vocab))
	}
	return ids
}

func scaling(s Spec) float64 {
	if s.Scaling == 0 {
		return 1
	}
	return s.Scaling
}

// Input returns a random input [tokens, hidden], uniform in [-1, 1), or in
// [0.1, 1) when positive is set.
func Input(seed uint64, tokens, hidden int, positive bool) []float32 {
	rng := rand.New(rand.NewPCG(seed, 0x78))
	x := make([]float32, tokens*hidden)
	for i := range x {
		if positive {
			x[i] = float32(0.1 + 0.9*rng.Float64())
		} else {
			x[i] = float32(rng.Float64()*2 - 1)
		}
	}
	return x
}
