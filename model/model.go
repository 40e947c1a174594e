// Package model is one decoder for every family whose whole model moex
// runs (arch.Config.WholeModel): the token embedding, every decoder layer
// (attention over a paged cache, MLA or grouped-query, then the MoE block
// or a dense MLP, as the family's layer plan says), the final RMSNorm and
// the output projection or the tied embedding. It reads the family's
// config and tensor names from package arch, composes the blocks of attn
// (attn.Block) and moe (Layer), and adds nothing to their maths but the
// residual stream and its norms.
package model

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"

	"github.com/moex-project/moex/format"

	"github.com/moex-project/moex/arch"
	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/format/gguf"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// Model is a loaded whole model. Its methods may be called from several
// goroutines once loaded; Close releases the checkpoint's mappings.
type Model struct {
	// Arch is the whole model's config (arch.Load); Config its MoE block.
	Arch   *arch.Config
	Config *moe.Config
	// Vocab and Hidden are vocab_size and hidden_size.
	Vocab, Hidden int

	eps    float64
	embed  kernels.Matrix // [vocab, hidden], read a row at a time
	norm   []float32
	lmHead kernels.Matrix // [vocab, hidden]
	layers []decoderLayer
	// src is the model's tensors: a checkpoint folder (ck) or a GGUF model
	// (gg), opened once and shared by every layer; where names it.
	src   format.Source
	ck    *moe.Checkpoint
	gg    *gguf.Model
	where string
	// backend runs the attention blocks' projections and MLA (the zero
	// Backend: the host).
	backend attn.Backend
	// numerics is the mode SetNumerics put the model in.
	numerics kernels.Numerics
	inMode   int // matrices outside the routed experts in numerics
	// times, when set, accumulates the parts' times (TimeSteps).
	times *StepTimes
}

// UseDevice puts every layer's attention on be (its projections, and MLA
// over device copies of the caches) and each MoE layer's experts on the
// runner experts makes for it (nil: they stay on the host); the embedding,
// norms, dense MLP layers and lm_head stay on the host. Call it before any
// Forward; the runners are the caller's to close, after the model's last
// use. A DP group's shards keep their experts on the host. A model in a
// mode other than kernels.Exact is refused.
func (m *Model) UseDevice(be attn.Backend, experts func(*moe.Layer) (moe.ExpertRunner, error)) error {
	if m.numerics != kernels.Exact {
		return fmt.Errorf("model: %v numerics run on the CPU kernels, not on a device: keep the exact mode there", m.numerics)
	}
	m.backend = be
	if experts == nil {
		return nil
	}
	for l, d := range m.layers {
		if d.moe == nil {
			continue
		}
		r, err := experts(d.moe)
		if err != nil {
			return fmt.Errorf("model: layer %d experts on the device: %w", l, err)
		}
		d.moe.SetExpertRunner(r)
	}
	return nil
}

type decoderLayer struct {
	inNorm, postNorm []float32
	attn             attn.Block       // MLA or grouped-query attention
	moe              *moe.Layer       // a MoE layer, or
	dense            kernels.FFNGroup // the dense MLP's weights (Rows, Out unset)
}

// Load opens a Hugging Face checkpoint folder, or a GGUF file (any shard
// of a split one), as a whole model, of a family whose whole model moex
// runs (arch.Config.WholeModel: from folders deepseek_v2, deepseek_v3 and
// their aliases, qwen3_moe, qwen2_moe, mixtral, olmoe, gpt_oss, glm4_moe; from GGUF
// deepseek2, qwen3moe, qwen2moe, gpt-oss, glm4moe, olmoe and llama with experts): its config read once
// (arch.Load, arch.FromGGUF) and its files opened once, shared by every
// layer. It fails naming the file, the tensor or the key when something is
// missing or misshapen.
func Load(path string) (*Model, error) {
	m := &Model{where: path}
	if strings.HasSuffix(path, ".gguf") {
		g, err := gguf.OpenModel(path)
		if err != nil {
			return nil, err
		}
		if m.Arch, err = moe.GGUFConfig(g); err != nil {
			g.Close()
			return nil, err
		}
		m.src, m.gg = g, g
		if t, err := g.Tensor("token_embd.weight"); err == nil && m.Arch.Vocab == 0 && len(t.Dims) == 2 {
			m.Arch.Vocab = int(t.Dims[1]) // llama.cpp's n_vocab when the metadata has no vocabulary
			m.Arch.Missing = slices.DeleteFunc(m.Arch.Missing, func(k string) bool { return k == "vocab_size" })
		}
	} else {
		ck, err := moe.OpenCheckpoint(path)
		if err != nil {
			return nil, err
		}
		m.Arch, m.src, m.ck, m.where = ck.Arch, ck, ck, filepath.Join(ck.Dir, "config.json")
	}
	if err := m.open(); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// open checks the config and loads every layer from m.src.
func (m *Model) open() error {
	a, path := m.Arch, m.where
	if err := a.WholeModel(); errors.Is(err, arch.ErrNoWholeModel) {
		return fmt.Errorf("model: %s: %w (its MoE blocks load alone: moe.Load)", path, err)
	}
	switch {
	case slices.Contains(a.Missing, "vocab_size"):
		return fmt.Errorf("model: %s: vocab_size is missing", path)
	case a.Vocab < 1:
		return fmt.Errorf("model: %s: vocab_size is %d, must be positive", path, a.Vocab)
	case a.Layers < 1:
		return fmt.Errorf("model: %s: num_hidden_layers is missing: a whole model needs it", path)
	case !(a.NormEps > 0):
		return fmt.Errorf("model: %s: rms_norm_eps %v must be positive", path, a.NormEps)
	}
	m.Config, m.Vocab, m.Hidden, m.eps = &a.MoE, a.Vocab, a.Hidden, a.NormEps
	return m.load()
}

func (m *Model) load() error {
	H, V, a := m.Hidden, m.Vocab, m.Arch
	root := a.Root(m.src.Has)
	embed, norm, head := a.ModelNames(root) // a tied head is the embedding, whatever lm_head.weight holds
	var err error
	if m.embed, err = m.src.Matrix(embed, V, H); err != nil {
		return err
	}
	if a.GGUF && !m.src.Has(head) {
		head = embed // llama.cpp: no output tensor, the embedding
	}
	if m.lmHead, err = m.src.Matrix(head, V, H); err != nil {
		return err
	}
	if kernels.PacksWeights() && m.lmHead.DType.Quantized() {
		// A quantized output projection (a GGUF file's Q6_K, Q8_0, Q4_K)
		// runs on the SIMD kernels only in panels, as the experts do: a
		// copy of its bytes (the tied embedding keeps its rows for lookups).
		m.lmHead = kernels.Pack(m.lmHead)
	}
	if m.norm, err = m.vector(norm); err != nil {
		return err
	}
	for l := range a.Layers {
		names := a.LayerNames(root, l)
		var d decoderLayer
		if d.inNorm, err = m.vector(names.InNorm); err != nil {
			return err
		}
		if d.postNorm, err = m.vector(names.PostNorm); err != nil {
			return err
		}
		switch {
		case a.Attention.Kind == arch.MLA && m.gg != nil:
			d.attn, err = attn.LoadMLABlockGGUF(m.gg, a, l)
		case a.Attention.Kind == arch.MLA:
			d.attn, err = attn.LoadMLABlockFrom(m.ck, l)
		default:
			d.attn, err = attn.LoadGQABlock(m.src.Matrix, a, names, l)
		}
		if err != nil {
			return fmt.Errorf("model: layer %d: %w", l, err)
		}
		m.layers = append(m.layers, d) // so that Close releases what is loaded
		last := &m.layers[len(m.layers)-1]
		if m.gg != nil {
			last.moe, err = moe.LoadGGUFFrom(m.gg, a, l)
		} else {
			last.moe, err = moe.LoadFrom(m.ck, l)
		}
		if errors.Is(err, moe.ErrDenseLayer) {
			last.moe, err = nil, m.loadDense(last, names, a.DenseInter)
		}
		if err != nil {
			return fmt.Errorf("model: layer %d: %w", l, err)
		}
	}
	return nil
}

// loadDense reads a dense layer's MLP (gate, up and down projections of
// width inter), packed where the kernels pack.
func (m *Model) loadDense(d *decoderLayer, names arch.LayerNames, inter int) error {
	if inter < 1 {
		return fmt.Errorf("intermediate_size is %d: a dense layer's MLP needs a positive width", inter)
	}
	H := m.Hidden
	g := &d.dense
	var err error
	if g.Gate, err = m.src.Matrix(names.Gate, inter, H); err != nil {
		return err
	}
	if g.Up, err = m.src.Matrix(names.Up, inter, H); err != nil {
		return err
	}
	if g.Down, err = m.src.Matrix(names.Down, H, inter); err != nil {
		return err
	}
	if kernels.PacksWeights() {
		g.Gate, g.Up, g.Down = kernels.Pack(g.Gate), kernels.Pack(g.Up), kernels.Pack(g.Down)
	}
	return nil
}

// vector reads a norm weight [hidden], checked finite.
func (m *Model) vector(name string) ([]float32, error) {
	w, err := m.src.Matrix(name, m.Hidden)
	if err != nil {
		return nil, err
	}
	v := make([]float32, m.Hidden)
	w.RowF32(0, v)
	for i, x := range v {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return nil, fmt.Errorf("model: %s: tensor %q [%d] is %v", m.where, name, i, x)
		}
	}
	return v, nil
}

// Close releases the layers and the checkpoint.
func (m *Model) Close() error {
	var errs []error
	for _, d := range m.layers {
		if d.attn != nil {
			errs = append(errs, d.attn.Close())
		}
		if d.moe != nil {
			errs = append(errs, d.moe.Close())
		}
	}
	if m.src != nil {
		errs = append(errs, m.src.Close())
	}
	return errors.Join(errs...)
}

// SetNumerics computes the model's products in mode (kernels.Int8Dot:
// llama.cpp's numerics, for integer-code weights; kernels.BF16Dot, for
// bf16 ones). Every MoE layer's routed experts must take it (an error
// names the layer that cannot, as moe.Layer.SetNumerics); the rest takes
// it where its dtype can and stays exact otherwise, as llama.cpp's
// matrices each keep their type: the shared experts and dense MLPs (all
// three matrices or none), the attention projections on the host (a
// device keeps its own), and the output projection. The embedding's
// lookups stay exact. Call it before any Forward; a model in another mode
// does not go back (load it again).
func (m *Model) SetNumerics(mode kernels.Numerics) error {
	if mode == m.numerics {
		return nil
	}
	if m.numerics != kernels.Exact || mode == kernels.Exact {
		return fmt.Errorf("model: a model in %v numerics cannot go to %v: load it again", m.numerics, mode)
	}
	for l, d := range m.layers {
		if d.moe == nil {
			continue
		}
		if err := d.moe.SetNumerics(mode); err != nil {
			return fmt.Errorf("model: layer %d: %w", l, err)
		}
	}
	for l := range m.layers {
		d := &m.layers[l]
		if m.backend.Proj == nil {
			m.inMode += d.attn.SetNumerics(mode)
		}
		if d.moe == nil { // all three matrices or none
			g := d.dense
			var errs [3]error
			g.Gate, errs[0] = mode.Pack(g.Gate)
			g.Up, errs[1] = mode.Pack(g.Up)
			g.Down, errs[2] = mode.Pack(g.Down)
			if errors.Join(errs[:]...) == nil {
				d.dense, m.inMode = g, m.inMode+3
			}
		}
	}
	if p, err := mode.Pack(m.lmHead); err == nil {
		m.lmHead = p
		m.inMode++
	}
	m.numerics = mode
	return nil
}

// Numerics is the mode SetNumerics set (kernels.Exact until then), and
// how many of the matrices outside the MoE layers took it: attention
// projections on the host, dense MLPs', the output projection.
func (m *Model) Numerics() (mode kernels.Numerics, matrices int) {
	return m.numerics, m.inMode
}

// DecodeBytes is the weight bytes a decode step of one token reads: every
// layer's attention weights, each MoE layer's router, top-k experts and
// shared expert (or a dense layer's MLP), the output projection and one
// row of the embedding. A step's time over these bytes is its share of the
// memory's read bandwidth.
func (m *Model) DecodeBytes() int64 {
	n := m.lmHead.Bytes() + m.embed.Bytes()/int64(max(m.Vocab, 1))
	for _, d := range m.layers {
		n += d.attn.WeightBytes()
		if d.moe != nil {
			ids := make([]int32, d.moe.Config.TopK)
			for i := range ids {
				ids[i] = int32(i)
			}
			n += d.moe.WeightBytesRead(ids)
		} else {
			n += d.dense.Gate.Bytes() + d.dense.Up.Bytes() + d.dense.Down.Bytes()
		}
	}
	return n
}

// KVBytesPerToken is the bytes a token's cache rows take over every layer
// in dtype: MLA's latent, or grouped-query attention's keys and values.
func (m *Model) KVBytesPerToken(dtype kernels.DType) int64 {
	var n int64
	for _, d := range m.layers {
		n += int64(d.attn.RowDim())
	}
	return n * int64(dtype.Bits()) / 8
}

// NumLayers is the decoder layers' count.
func (m *Model) NumLayers() int { return len(m.layers) }

// Prefill runs the tokens ids of one sequence from position 0 and returns
// the logits of every position, [len(ids), vocab] float32 (the last row
// predicts the next token), on caches made for this call.
func (m *Model) Prefill(ctx context.Context, ids []int32) ([]float32, error) {
	T := len(ids)
	if T == 0 {
		return nil, errors.New("model: prefill of no tokens")
	}
	const blockRows = 16
	kv, err := m.NewKV((T+blockRows-1)/blockRows, blockRows, kernels.F32)
	if err != nil {
		return nil, err
	}
	return m.Forward(ctx, kv, make([]int, T), ids, nil)
}

// denseMLP is a dense layer's SwiGLU MLP over every row of x.
func (m *Model) denseMLP(ctx context.Context, g kernels.FFNGroup, x, y []float32) error {
	T := len(x) / m.Hidden
	g.Rows = make([]int32, T)
	for t := range g.Rows {
		g.Rows[t] = int32(t)
	}
	g.Out = y
	return kernels.GroupedFFN(ctx, 0, x, []kernels.FFNGroup{g}, nil)
}

// add adds y to x.
func add(x, y []float32) {
	for i := range x {
		x[i] += y[i]
	}
}
