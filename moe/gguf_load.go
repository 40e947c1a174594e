package moe

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"github.com/moex-project/moex/internal/errkind"
	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/kernels"
)

// A GGUF file's metadata is mapped onto the Hugging Face config.json keys
// of the family llama.cpp converted it from, and parsed by ParseConfig: the
// one definition of each family's block serves both formats. Per
// architecture (llama.cpp's convert_hf_to_gguf.py writes the keys, its
// llama-model.cpp reads them):
//
//	deepseek2: expert_count, expert_used_count, expert_feed_forward_length,
//	  expert_shared_count (× the expert width), leading_dense_block_count,
//	  expert_weights_scale (routed_scaling_factor, default 1),
//	  expert_weights_norm (norm_topk_prob, default false),
//	  expert_gating_func (1 softmax, 2 sigmoid; default softmax),
//	  expert_group_count and expert_group_used_count (n_group, topk_group).
//	  GGUF keeps no topk_method: a layer with exp_probs_b is noaux_tc
//	  (DeepSeek-V3's), else groups > 1 mean group_limited_greedy, else greedy.
//	glm4moe: the same keys, as glm4_moe (always noaux_tc, exp_probs_b).
//	Both: block_count includes nextn_predict_layers, the MTP layers stored
//	after the model's.
//	qwen3moe: as qwen3_moe, renormalised (llama.cpp always renormalises it).
//	qwen2moe: as qwen2_moe, not renormalised, the shared expert of
//	  expert_shared_feed_forward_length behind ffn_gate_inp_shexp.
//	llama with expert_count (Mixtral): as mixtral.
//	gpt-oss: as gpt_oss (its router and experts' biases as ffn_*.bias, the
//	  clamped SwiGLU at its default limit of 7).

// hfConfig is the config.json of the file's architecture: its model_type
// and the keys its metadata gives.
// hasTensor reports whether the model (every shard of a split one) holds
// a tensor; hfConfig looks for exp_probs_b with it.
func (g *GGUF) hfConfig(path string, hasTensor func(suffix string) bool) (map[string]any, error) {
	arch := g.Metadata["general.architecture"].Str
	if arch == "" {
		return nil, errkind.Errorf(ErrGGUF, "moe: gguf: %s: no general.architecture", path)
	}
	var missing, bad []string
	num := func(key string, def ...float64) float64 {
		v, ok := g.Metadata[arch+"."+key]
		if f, isNum := v.AsFloat(); ok && isNum {
			if math.IsNaN(f) || math.IsInf(f, 0) {
				bad = append(bad, fmt.Sprintf("%s.%s is %v", arch, key, f))
			}
			return f
		}
		if ok && v.Type == GGUFBool {
			if v.Bool {
				return 1
			}
			return 0
		}
		if ok {
			bad = append(bad, fmt.Sprintf("%s.%s is a %s, not a number", arch, key, v.Type))
			return 0
		}
		if len(def) > 0 {
			return def[0]
		}
		missing = append(missing, arch+"."+key)
		return 0
	}
	// block_count counts the multi-token-prediction layers llama.cpp
	// stores after the model's (nextn_predict_layers: GLM-4.5, DeepSeek-V3.2).
	nextn := num("nextn_predict_layers", 0)
	cfg := map[string]any{"hidden_size": num("embedding_length"), "num_hidden_layers": num("block_count") - nextn}
	switch arch {
	case "deepseek2", "glm4moe":
		inter := num("expert_feed_forward_length")
		groups := num("expert_group_count", 1)
		defGating := 1.0 // softmax: DeepSeek-V2's; GLM-4.5 scores with a sigmoid
		if arch == "glm4moe" {
			defGating = 2
		}
		sigmoid := num("expert_gating_func", defGating) == 2
		noaux := hasTensor(".exp_probs_b.bias")
		method, scoring, model := "greedy", "softmax", "deepseek_v2"
		switch {
		case arch == "glm4moe":
			method, model = "noaux_tc", "glm4_moe"
			cfg["num_nextn_predict_layers"] = nextn
		case noaux:
			method, model = "noaux_tc", "deepseek_v3"
		case groups > 1:
			method = "group_limited_greedy"
		}
		if sigmoid {
			scoring = "sigmoid"
		}
		for k, v := range map[string]any{"model_type": model, "n_routed_experts": num("expert_count"),
			"num_experts_per_tok": num("expert_used_count"), "moe_intermediate_size": inter,
			"n_shared_experts": num("expert_shared_count", 0), "first_k_dense_replace": num("leading_dense_block_count", 0),
			"moe_layer_freq": 1, "routed_scaling_factor": num("expert_weights_scale", 1),
			"norm_topk_prob": num("expert_weights_norm", 0) == 1, "scoring_func": scoring, "topk_method": method,
			"n_group": groups, "topk_group": num("expert_group_used_count", 1),
			"kv_lora_rank": num("attention.kv_lora_rank", 0), "qk_rope_head_dim": num("rope.dimension_count", 0)} {
			cfg[k] = v
		}
	case "qwen3moe", "qwen2moe":
		cfg["model_type"] = map[string]string{"qwen3moe": "qwen3_moe", "qwen2moe": "qwen2_moe"}[arch]
		cfg["num_experts"] = num("expert_count")
		cfg["num_experts_per_tok"] = num("expert_used_count")
		cfg["moe_intermediate_size"] = num("expert_feed_forward_length")
		cfg["norm_topk_prob"] = arch == "qwen3moe"
		cfg["decoder_sparse_step"] = 1
		cfg["mlp_only_layers"] = []int{}
		if arch == "qwen2moe" {
			cfg["shared_expert_intermediate_size"] = num("expert_shared_feed_forward_length")
		}
	case "gpt-oss":
		cfg["model_type"] = "gpt_oss"
		cfg["num_local_experts"] = num("expert_count")
		cfg["num_experts_per_tok"] = num("expert_used_count")
		cfg["intermediate_size"] = num("expert_feed_forward_length")
	case "llama":
		if _, ok := g.Metadata["llama.expert_count"]; !ok {
			return nil, errkind.Errorf(ErrUnknownFamily, "moe: %s: a llama GGUF without llama.expert_count has no MoE block", path)
		}
		cfg["model_type"] = "mixtral"
		cfg["num_local_experts"] = num("expert_count")
		cfg["num_experts_per_tok"] = num("expert_used_count")
		cfg["intermediate_size"] = num("feed_forward_length")
	default:
		return nil, errkind.Errorf(ErrUnknownFamily, "moe: %s: GGUF architecture %q: moex reads deepseek2, glm4moe, qwen3moe, qwen2moe, gpt-oss and llama (Mixtral) MoE blocks",
			path, arch)
	}
	if len(bad) > 0 {
		return nil, errkind.Errorf(ErrGGUF, "moe: gguf: %s: %s", path, strings.Join(bad, "; "))
	}
	if len(missing) > 0 {
		return nil, errkind.Errorf(ErrGGUF, "moe: gguf: %s: the %s block needs %s", path, arch, strings.Join(missing, ", "))
	}
	return cfg, nil
}

// Config is the MoE configuration the file's metadata describes, as
// ParseConfig reads it from the equivalent config.json.
func (f *GGUFFile) Config() (*Config, error) {
	return configOf(f.GGUF, f.Path, func(suffix string) bool {
		return slices.ContainsFunc(f.Names, func(n string) bool { return strings.HasSuffix(n, suffix) })
	})
}

func configOf(g *GGUF, path string, hasTensor func(string) bool) (*Config, error) {
	raw, err := g.hfConfig(path, hasTensor)
	if err != nil {
		return nil, err
	}
	data, err := json.Marshal(raw)
	if err != nil {
		return nil, errkind.Errorf(ErrGGUF, "moe: gguf: %s: %v", path, err)
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("moe: %s: %w", path, err)
	}
	return cfg, nil
}

// LoadGGUF maps a GGUF file and takes the MoE block of layer n: the router
// ffn_gate_inp, the stacked experts ffn_{gate,up,down}_exps (ggml's order:
// [hidden, inter, experts] and [inter, hidden, experts]), the shared
// expert's ffn_*_shexp, exp_probs_b and qwen2moe's ffn_gate_inp_shexp. The
// same Layer as from safetensors; Close unmaps the file. A split model
// (NAME-00001-of-00003.gguf, llama.cpp's gguf-split) is read from all its
// shards, given any one of them. Expert tensors in F32, F16 and BF16 are
// read in place, Q4_0 and MXFP4 as kernels' 4-bit matrices of the same
// values (reordered nibbles); other quantized ggml types are an
// ErrUnsupportedFormat error naming the tensor and its type.
func LoadGGUF(path string, n int) (*Layer, error) {
	g, err := openGGUFModel(path)
	if err != nil {
		return nil, err
	}
	l, err := g.load(n)
	if err != nil {
		g.Close()
		return nil, err
	}
	l.closer = g
	return l, nil
}

// ggufModel is a model's GGUF file, or every shard of a split one.
type ggufModel struct {
	path  string // the first file
	files []*GGUFFile
	where map[string]*GGUFFile // tensor name → its file
}

// splitName matches a shard's name: PREFIX-00001-of-00003.gguf.
var splitName = regexp.MustCompile(`^(.*)-(\d{5})-of-(\d{5})\.gguf$`)

func openGGUFModel(path string) (*ggufModel, error) {
	paths := []string{path}
	if m := splitName.FindStringSubmatch(path); m != nil {
		count, _ := strconv.Atoi(m[3])
		if count < 1 {
			return nil, errkind.Errorf(ErrGGUF, "moe: gguf: %s: a split of %d files", path, count)
		}
		paths = paths[:0]
		for i := 1; i <= count; i++ {
			paths = append(paths, fmt.Sprintf("%s-%05d-of-%05d.gguf", m[1], i, count))
		}
	}
	g := &ggufModel{path: paths[0], where: map[string]*GGUFFile{}}
	for i, p := range paths {
		f, err := OpenGGUF(p)
		if err != nil {
			g.Close()
			return nil, err
		}
		g.files = append(g.files, f)
		if len(paths) > 1 {
			no, okNo := f.Metadata["split.no"].AsInt()
			count, okCount := f.Metadata["split.count"].AsInt()
			if okNo && okCount && (no != int64(i) || count != int64(len(paths))) {
				g.Close()
				return nil, errkind.Errorf(ErrGGUF, "moe: gguf: %s says it is split %d of %d, its name shard %d of %d", p, no+1, count, i+1, len(paths))
			}
		}
		for _, name := range f.Names {
			if prev, dup := g.where[name]; dup {
				g.Close()
				return nil, errkind.Errorf(ErrGGUF, "moe: gguf: tensor %q is in both %s and %s", name, prev.Path, p)
			}
			g.where[name] = f
		}
	}
	return g, nil
}

// Close unmaps every file; a second Close does nothing.
func (g *ggufModel) Close() error {
	var first error
	for _, f := range g.files {
		if err := f.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (g *ggufModel) load(n int) (*Layer, error) {
	// The metadata is the first shard's; tensors may be in any (a split
	// DeepSeek-V3's exp_probs_b usually lie past its first shard).
	cfg, err := configOf(g.files[0].GGUF, g.path, func(suffix string) bool {
		for name := range g.where {
			if strings.HasSuffix(name, suffix) {
				return true
			}
		}
		return false
	})
	if err != nil {
		return nil, err
	}
	if err := cfg.CheckMoELayer(n); err != nil {
		return nil, fmt.Errorf("moe: %s: %w", g.path, err)
	}
	H, I, E := cfg.Hidden, cfg.Inter, cfg.NumExperts
	blk := fmt.Sprintf("blk.%d.", n)
	var w Weights
	if w.Gate, err = g.matrix(blk+"ffn_gate_inp.weight", E, H); err != nil {
		return nil, err
	}
	w.Gate = w.Gate.Clone() // small, read by every token: a copy, as from safetensors
	if err := checkFiniteMatrix(fmt.Sprintf("%s: tensor %q", g.path, blk+"ffn_gate_inp.weight"), w.Gate); err != nil {
		return nil, err
	}
	if cfg.Method == NoAuxTC {
		b, err := g.matrix(blk+"exp_probs_b.bias", 1, E)
		if err != nil {
			return nil, err
		}
		if err := checkFiniteMatrix(fmt.Sprintf("%s: tensor %q", g.path, blk+"exp_probs_b.bias"), b); err != nil {
			return nil, err
		}
		w.Bias = make([]float32, E)
		b.RowF32(0, w.Bias)
	}
	if cfg.RouterBias {
		if w.RouterBias, err = g.vector(blk+"ffn_gate_inp.bias", E); err != nil {
			return nil, err
		}
	}
	stacks := make([][]kernels.Matrix, 3)
	for i, p := range []struct {
		name       string
		rows, cols int
	}{{"ffn_gate_exps", I, H}, {"ffn_up_exps", I, H}, {"ffn_down_exps", H, I}} {
		if stacks[i], err = g.stacked(blk+p.name+".weight", E, p.rows, p.cols); err != nil {
			return nil, err
		}
	}
	var biases [3][][]float32 // gpt-oss: [inter, experts] and [hidden, experts], a row an expert
	if cfg.ExpertBias {
		for i, p := range []struct {
			name string
			n    int
		}{{"ffn_gate_exps.bias", I}, {"ffn_up_exps.bias", I}, {"ffn_down_exps.bias", H}} {
			if biases[i], err = g.rows(blk+p.name, E, p.n); err != nil {
				return nil, err
			}
		}
	}
	w.Experts = make([]Expert, E)
	for e := range w.Experts {
		w.Experts[e] = Expert{Gate: stacks[0][e], Up: stacks[1][e], Down: stacks[2][e]}
		if cfg.ExpertBias {
			w.Experts[e].GateBias, w.Experts[e].UpBias, w.Experts[e].DownBias = biases[0][e], biases[1][e], biases[2][e]
		}
	}
	if S := cfg.SharedInter; S > 0 {
		var x Expert
		if x.Gate, err = g.matrix(blk+"ffn_gate_shexp.weight", S, H); err != nil {
			return nil, err
		}
		if x.Up, err = g.matrix(blk+"ffn_up_shexp.weight", S, H); err != nil {
			return nil, err
		}
		if x.Down, err = g.matrix(blk+"ffn_down_shexp.weight", H, S); err != nil {
			return nil, err
		}
		w.Shared = &x
		if cfg.SharedGate {
			sg, err := g.matrix(blk+"ffn_gate_inp_shexp.weight", 1, H)
			if err != nil {
				return nil, err
			}
			sg = sg.Clone()
			w.SharedGate = &sg
		}
	}
	return New(cfg, w)
}

// vector is the 1-D tensor name [n], checked finite, as float32.
func (g *ggufModel) vector(name string, n int) ([]float32, error) {
	r, err := g.rows(name, 1, n)
	if err != nil {
		return nil, err
	}
	return r[0], nil
}

// rows is tensor name [rows, n] (PyTorch's order; [n] for one row),
// checked finite, as float32 rows.
func (g *ggufModel) rows(name string, rows, n int) ([][]float32, error) {
	m, err := g.matrix(name, rows, n)
	if err != nil {
		return nil, err
	}
	if err := checkFiniteMatrix(fmt.Sprintf("%s: tensor %q", g.path, name), m); err != nil {
		return nil, err
	}
	out := make([][]float32, rows)
	for i := range out {
		out[i] = make([]float32, n)
		m.RowF32(i, out[i])
	}
	return out, nil
}

// tensor is name's info and file.
func (g *ggufModel) tensor(name string) (GGUFTensor, *GGUFFile, error) {
	f, ok := g.where[name]
	if !ok {
		return GGUFTensor{}, nil, errkind.Errorf(ErrMissingTensor, "moe: %s: missing tensor %q", g.path, name)
	}
	return f.Tensors[name], f, nil
}

// matrix is tensor name as a [rows, cols] matrix: ggml's dims [cols, rows]
// (or [cols] for one row), F32, F16 or BF16, a view of the mapping.
func (g *ggufModel) matrix(name string, rows, cols int) (kernels.Matrix, error) {
	t, f, err := g.tensor(name)
	if err != nil {
		return kernels.Matrix{}, err
	}
	want := []uint64{uint64(cols), uint64(rows)}
	if rows == 1 && len(t.Dims) == 1 {
		want = want[:1]
	}
	if !slices.Equal(t.Dims, want) {
		return kernels.Matrix{}, errkind.Errorf(ErrMissingTensor, "moe: %s: tensor %q has ggml dims %v, want %v", f.Path, name, t.Dims, want)
	}
	return f.view(t, 0, rows, cols)
}

// stacked is a 3-D tensor [cols, rows, n] (ggml's order) as n matrices
// [rows, cols], views of the mapping.
func (g *ggufModel) stacked(name string, n, rows, cols int) ([]kernels.Matrix, error) {
	t, f, err := g.tensor(name)
	if err != nil {
		return nil, err
	}
	if want := []uint64{uint64(cols), uint64(rows), uint64(n)}; !slices.Equal(t.Dims, want) {
		return nil, errkind.Errorf(ErrMissingTensor, "moe: %s: tensor %q has ggml dims %v, want %v", f.Path, name, t.Dims, want)
	}
	out := make([]kernels.Matrix, n)
	for e := range out {
		if out[e], err = f.view(t, e, rows, cols); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// view is matrix k of tensor t ([rows, cols] each, stacked), in place.
func (f *GGUFFile) view(t GGUFTensor, k, rows, cols int) (kernels.Matrix, error) {
	data, err := f.TensorData(t.Name)
	if err != nil {
		return kernels.Matrix{}, err
	}
	per := rows * cols
	switch t.Type {
	case GGMLF32:
		v := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(data))), len(data)/4)
		return kernels.NewF32(rows, cols, v[k*per:(k+1)*per])
	case GGMLF16, GGMLBF16:
		v := unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(data))), len(data)/2)
		dt := kernels.F16
		if t.Type == GGMLBF16 {
			dt = kernels.BF16
		}
		return kernels.NewHalf(dt, rows, cols, v[k*per:(k+1)*per])
	case GGMLQ4_0, GGMLMXFP4:
		m, err := q4Blocks(t, data, k, rows, cols)
		if err != nil {
			return m, fmt.Errorf("moe: %s: %w", f.Path, err)
		}
		return m, nil
	}
	if _, ok := intBlocks[t.Type]; ok {
		m, err := codeBlocks(t, data, k, rows, cols)
		if err != nil {
			return m, fmt.Errorf("moe: %s: %w", f.Path, err)
		}
		return m, nil
	}
	return kernels.Matrix{}, errkind.Errorf(ErrUnsupportedFormat,
		"moe: %s: tensor %q is %s: moex reads GGUF weights in F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K and MXFP4",
		f.Path, t.Name, t.Type)
}

// q4Blocks is matrix k of a Q4_0 or MXFP4 tensor as kernels' INT4 (group
// 32) or MXFP4 matrix: the same 4-bit values and per-32 scales, exactly
// (Q4_0: (q − 8)·d with d an f16, so the f32 scale is d; MXFP4: e2m1·2^(e−127),
// what ggml's doubled table times its halved E8M0 scale makes), the
// nibbles reordered from ggml's blocks (byte j of a block: value j low,
// value j + 16 high) to kernels' rows (value c of a row at nibble c, the
// even one low). The nibbles and scales are a copy of the same size.
func q4Blocks(t GGUFTensor, data []byte, k, rows, cols int) (kernels.Matrix, error) {
	bb := int(t.Type.BlockBytes())
	perRow := cols / 32
	blocks := data[k*rows*perRow*bb:][:rows*perRow*bb]
	packed := make([]uint8, rows*cols/2)
	var f32 []float32
	var e8m0 []uint8
	if t.Type == GGMLQ4_0 {
		f32 = make([]float32, rows*perRow)
	} else {
		e8m0 = make([]uint8, rows*perRow)
	}
	for b := 0; b < rows*perRow; b++ {
		blk := blocks[b*bb:][:bb]
		q := blk[bb-16:]
		if f32 != nil {
			f32[b] = half.F16ToF32(binary.LittleEndian.Uint16(blk))
		} else {
			e8m0[b] = blk[0]
		}
		out := packed[b*16:][:16] // the block's 32 values, two a byte, in order
		for j := range 16 {
			lo, hi := q[j]&15, q[j]>>4
			// value j → nibble j, value j+16 → nibble j+16.
			out[j/2] |= lo << (4 * (j & 1))
			out[8+j/2] |= hi << (4 * (j & 1))
		}
	}
	if f32 != nil {
		m, err := kernels.NewINT4(rows, cols, 32, packed, f32)
		if err != nil {
			return m, fmt.Errorf("tensor %q: %w", t.Name, err)
		}
		return m, nil
	}
	m, err := kernels.NewMXFP4(rows, cols, packed, e8m0)
	if err != nil {
		return m, fmt.Errorf("tensor %q: %w", t.Name, err)
	}
	return m, nil
}
