package moe

import (
	"fmt"

	"github.com/moex-project/moex/arch"
	"github.com/moex-project/moex/format/gguf"
	"github.com/moex-project/moex/internal/errkind"
	"github.com/moex-project/moex/kernels"
)

// GGUFConfig is the whole model a GGUF model's metadata describes
// (arch.FromGGUF): the metadata is the first shard's; tensors may be in any
// (a split DeepSeek-V3's exp_probs_b usually lie past its first shard).
func GGUFConfig(m *gguf.Model) (*arch.Config, error) {
	return arch.FromGGUF(m)
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
	g, err := gguf.OpenModel(path)
	if err != nil {
		return nil, err
	}
	l, err := loadGGUF(g, n)
	if err != nil {
		g.Close()
		return nil, err
	}
	l.closer = g
	return l, nil
}

func loadGGUF(g *gguf.Model, n int) (*Layer, error) {
	a, err := GGUFConfig(g)
	if err != nil {
		return nil, err
	}
	return LoadGGUFFrom(g, a, n)
}

// LoadGGUFFrom is LoadGGUF over a model already open (a whole model's,
// shared by its layers) with its config (GGUFConfig): the layer refers to
// the mappings and does not close them.
func LoadGGUFFrom(g *gguf.Model, a *arch.Config, n int) (*Layer, error) {
	var err error
	if err := a.MoELayer(n); err != nil {
		return nil, fmt.Errorf("moe: %s: %w", g.Path(), err)
	}
	cfg := &a.MoE
	H, I, E := cfg.Hidden, cfg.Inter, cfg.NumExperts
	blk := fmt.Sprintf("blk.%d.", n)
	var w Weights
	if w.Gate, err = g.Matrix(blk+"ffn_gate_inp.weight", E, H); err != nil {
		return nil, err
	}
	w.Gate = w.Gate.Clone() // small, read by every token: a copy, as from safetensors
	if err := checkFiniteMatrix(fmt.Sprintf("%s: tensor %q", g.Path(), blk+"ffn_gate_inp.weight"), w.Gate); err != nil {
		return nil, err
	}
	if cfg.Method == NoAuxTC {
		b, err := g.Matrix(blk+"exp_probs_b.bias", 1, E)
		if err != nil {
			return nil, err
		}
		if err := checkFiniteMatrix(fmt.Sprintf("%s: tensor %q", g.Path(), blk+"exp_probs_b.bias"), b); err != nil {
			return nil, err
		}
		w.Bias = make([]float32, E)
		b.RowF32(0, w.Bias)
	}
	if cfg.RouterBias {
		if w.RouterBias, err = ggufVector(g, blk+"ffn_gate_inp.bias", E); err != nil {
			return nil, err
		}
	}
	stacks := make([][]kernels.Matrix, 3)
	fused := !g.Has(blk+"ffn_gate_exps.weight") && g.Has(blk+"ffn_gate_up_exps.weight")
	if fused { // newer llama.cpp files: gate and up in one tensor, an expert's gate rows then its up rows
		if cfg.ExpertBias {
			return nil, errkind.Errorf(ErrUnsupportedFormat, "moe: %s: tensor %q with expert biases is not read yet", g.Path(), blk+"ffn_gate_up_exps.weight")
		}
		if stacks[0], stacks[1], err = g.StackedPairs(blk+"ffn_gate_up_exps.weight", E, I, H); err != nil {
			return nil, err
		}
	}
	for i, p := range []struct {
		name       string
		rows, cols int
	}{{"ffn_gate_exps", I, H}, {"ffn_up_exps", I, H}, {"ffn_down_exps", H, I}} {
		if fused && i < 2 {
			continue
		}
		if stacks[i], err = g.Stacked(blk+p.name+".weight", E, p.rows, p.cols); err != nil {
			return nil, err
		}
	}
	var biases [3][][]float32 // gpt-oss: [inter, experts] and [hidden, experts], a row an expert
	if cfg.ExpertBias {
		for i, p := range []struct {
			name string
			n    int
		}{{"ffn_gate_exps.bias", I}, {"ffn_up_exps.bias", I}, {"ffn_down_exps.bias", H}} {
			if biases[i], err = ggufRows(g, blk+p.name, E, p.n); err != nil {
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
		if x.Gate, err = g.Matrix(blk+"ffn_gate_shexp.weight", S, H); err != nil {
			return nil, err
		}
		if x.Up, err = g.Matrix(blk+"ffn_up_shexp.weight", S, H); err != nil {
			return nil, err
		}
		if x.Down, err = g.Matrix(blk+"ffn_down_shexp.weight", H, S); err != nil {
			return nil, err
		}
		w.Shared = &x
		if cfg.SharedGate {
			sg, err := g.Matrix(blk+"ffn_gate_inp_shexp.weight", 1, H)
			if err != nil {
				return nil, err
			}
			sg = sg.Clone()
			w.SharedGate = &sg
		}
	}
	l, err := New(cfg, w)
	if err != nil {
		return nil, err
	}
	l.Arch = a
	return l, nil
}

// vector is the 1-D tensor name [n], checked finite, as float32.
func ggufVector(g *gguf.Model, name string, n int) ([]float32, error) {
	r, err := ggufRows(g, name, 1, n)
	if err != nil {
		return nil, err
	}
	return r[0], nil
}

// rows is tensor name [rows, n] (PyTorch's order; [n] for one row),
// checked finite, as float32 rows.
func ggufRows(g *gguf.Model, name string, rows, n int) ([][]float32, error) {
	m, err := g.Matrix(name, rows, n)
	if err != nil {
		return nil, err
	}
	if err := checkFiniteMatrix(fmt.Sprintf("%s: tensor %q", g.Path(), name), m); err != nil {
		return nil, err
	}
	out := make([][]float32, rows)
	for i := range out {
		out[i] = make([]float32, n)
		m.RowF32(i, out[i])
	}
	return out, nil
}
