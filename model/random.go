package model

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/moex-project/moex/arch"
	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/internal/memlimit"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// Preset is a random model's shapes: the MoE block, the attention block,
// the vocabulary, the layer count (the first FirstKDense dense, of width
// DenseInter) and the norms' epsilon.
type Preset struct {
	Name string
	MoE  moe.Config
	// Attn is MLA's attention, unless GQA is set: grouped-query attention,
	// its window (GQA.Window) on the layers Windowed reports (nil: all).
	Attn          attn.MLAConfig
	GQA           *attn.GQAConfig
	Windowed      func(layer int) bool
	Vocab, Layers int
	FirstKDense   int
	DenseInter    int
	RMSNormEps    float64
	WeightDType   kernels.DType
	// ExpertDType, when set, is the experts' (quantized as checkpoints
	// are: kernels.Quantize); the attention and dense layers stay in
	// WeightDType.
	ExpertDType    kernels.DType
	EmbeddingDType kernels.DType
	// RoPEBase and RoPEScaling are the grouped-query presets' RoPE (MLA's
	// is in Attn), Context a preset's context length, as a GGUF file of
	// them states them (WriteGGUF).
	RoPEBase    float64
	RoPEScaling kernels.RoPEScaling
	Context     int
}

// ByteVocab is the random presets' vocabulary: the 256 byte values and
// four specials (bos, eos, pad, unk).
const ByteVocab = 260

// Tiny is a preset whose requests cost milliseconds: DeepSeek-V2's
// structure (MLA without q-LoRA, greedy softmax routing, a shared expert,
// a dense first layer) at hidden 64, three layers, eight experts of width
// 32, top-2, over the byte vocabulary.
func Tiny() Preset {
	m := moe.Config{ModelType: "deepseek_v2", Name: "deepseek_v2", Hidden: 64, NumExperts: 8, TopK: 2, Inter: 32, SharedInter: 32,
		Scoring: moe.Softmax, Method: moe.Greedy, RoutedScaling: 1}
	a := attn.MLAConfig{Hidden: 64, Heads: 4, KVLoraRank: 32, NopeDim: 16, RopeDim: 8, VDim: 16, RopeTheta: 10000, RMSNormEps: 1e-6}
	return Preset{Name: "tiny", MoE: m, Attn: a, Vocab: ByteVocab, Layers: 3, FirstKDense: 1, DenseInter: 128, RMSNormEps: 1e-6,
		WeightDType: kernels.BF16, EmbeddingDType: kernels.F32}
}

// DeepSeekV2Lite is DeepSeek-V2-Lite's layers at its shapes (hidden 2048,
// MLA of 16 heads over a 512 + 64 latent with yarn RoPE, 64 experts of
// width 1408 top-6 and two shared, a dense first layer of width 10944) in
// bf16, layers of them (its own count is 27: ~31 GB), over the byte
// vocabulary instead of its 102,400 tokens (random weights have no
// tokenizer; the embedding and lm_head are 2 MB instead of 0.8 GB).
func DeepSeekV2Lite(layers int) Preset {
	m := *moe.DeepSeekV2Lite()
	return Preset{Name: "deepseek-v2-lite", MoE: m, Attn: attn.DeepSeekV2LiteAttention(), Vocab: ByteVocab, Layers: layers,
		FirstKDense: min(1, layers-1), DenseInter: 10944, RMSNormEps: 1e-6, WeightDType: kernels.BF16, EmbeddingDType: kernels.BF16,
		Context: 163840}
}

// Qwen3_30B_A3B is Qwen3-30B-A3B at its shapes (hidden 2048; grouped-query
// attention of 32 heads over 4 of width 128 with per-head QK norms, RoPE
// base 10⁶; 128 experts of width 768, top-8, renormalised; its 151,936-token
// vocabulary) in bf16, layers of its 48.
func Qwen3_30B_A3B(layers int) Preset {
	m := moe.Config{ModelType: "qwen3_moe", Name: "qwen3_moe", Hidden: 2048, NumExperts: 128, TopK: 8, Inter: 768,
		Scoring: moe.Softmax, Method: moe.Greedy, NormTopK: true, RoutedScaling: 1}
	r, _, _ := kernels.NewRoPE(128, 1e6, kernels.RoPEScaling{}, kernels.RoPEHalves)
	g := &attn.GQAConfig{Hidden: 2048, Heads: 32, KVHeads: 4, HeadDim: 128, QKNorm: arch.QKNormHead, NormEps: 1e-6, RoPE: r,
		Scale: float32(1 / math.Sqrt(128))}
	return Preset{Name: "qwen3-30b-a3b", MoE: m, GQA: g, Vocab: 151936, Layers: layers, DenseInter: 6144, RMSNormEps: 1e-6,
		WeightDType: kernels.BF16, EmbeddingDType: kernels.BF16, RoPEBase: 1e6, Context: 40960}
}

// GptOss20B is gpt-oss-20b at its shapes (hidden 2880; grouped-query
// attention of 64 heads over 8 of width 64 with biases and sinks, a window
// of 128 on every other layer, yarn RoPE; 32 experts of width 2880, top-4,
// with biases and the clamped SwiGLU; its 201,088-token vocabulary) in
// bf16, layers of its 24.
func GptOss20B(layers int) Preset {
	y := kernels.RoPEScaling{Type: "yarn", Factor: 32, OrigMaxPos: 4096, BetaFast: 32, BetaSlow: 1, NoTruncate: true}
	r, _, _ := kernels.NewRoPE(64, 150000, y, kernels.RoPEHalves)
	g := &attn.GQAConfig{Hidden: 2880, Heads: 64, KVHeads: 8, HeadDim: 64, Bias: true, OutBias: true, Sinks: true, Window: 128,
		NormEps: 1e-5, RoPE: r, Scale: float32(1 / math.Sqrt(64))}
	return Preset{Name: "gpt-oss-20b", MoE: *moe.GptOss20B(), GQA: g, Windowed: func(l int) bool { return l%2 == 0 },
		Vocab: 201088, Layers: layers, DenseInter: 2880, RMSNormEps: 1e-5, WeightDType: kernels.BF16, EmbeddingDType: kernels.BF16,
		RoPEBase: 150000, RoPEScaling: y, Context: 131072}
}

// NewRandom makes a model of p with random weights (projections uniform in
// ±1/√fan_in, norm weights 1 ± 0.2, the embedding in ±1), the same for the
// same seed. It is for demonstrations, benchmarks and the serving tests.
func NewRandom(p Preset, seed uint64) (*Model, error) {
	H := p.MoE.Hidden
	attnHidden := p.Attn.Hidden
	if p.GQA != nil {
		attnHidden = p.GQA.Hidden
	}
	switch {
	case H < 1 || attnHidden != H:
		return nil, fmt.Errorf("model: preset %q: hidden sizes %d (MoE) and %d (attention)", p.Name, H, attnHidden)
	case p.Vocab < 1 || p.Layers < 1 || p.FirstKDense < 0 || p.FirstKDense >= p.Layers || p.DenseInter < 1 || !(p.RMSNormEps > 0):
		return nil, fmt.Errorf("model: preset %q: vocab %d, %d layers (%d dense of width %d), eps %v", p.Name, p.Vocab, p.Layers,
			p.FirstKDense, p.DenseInter, p.RMSNormEps)
	}
	// The weights' bytes, checked before any is made.
	w := float64(p.WeightDType.Bits()) / 8
	we := w
	if p.ExpertDType != 0 {
		we = float64(p.ExpertDType.Bits()) / 8
	}
	perMoE := float64(p.MoE.NumExperts*3*p.MoE.Inter*H+3*p.MoE.SharedInter*H) * we
	perDense := float64(3*p.DenseInter*H) * w
	perAttn := float64(H*(p.Attn.Heads*(p.Attn.NopeDim+p.Attn.RopeDim)+p.Attn.KVLoraRank+p.Attn.RopeDim+p.Attn.Heads*p.Attn.VDim)) * w
	if g := p.GQA; g != nil {
		perAttn = float64(2*H*(g.Heads+g.KVHeads)*g.HeadDim) * w
	}
	total := float64(p.Layers-p.FirstKDense)*perMoE + float64(p.FirstKDense)*perDense + float64(p.Layers)*perAttn +
		2*float64(p.Vocab*H)*float64(p.EmbeddingDType.Bits())/8
	if err := memlimit.Check(fmt.Sprintf("model: preset %q", p.Name), total); err != nil {
		return nil, err
	}
	a := &arch.Config{Family: p.MoE.ModelType, Name: p.MoE.Name, Hidden: H, Layers: p.Layers, Vocab: p.Vocab, NormEps: p.RMSNormEps, ContextLength: p.Context,
		DenseInter: p.DenseInter, FirstKDense: p.FirstKDense, LayerFreq: 1, SparseStep: 1, MoE: p.MoE,
		Attention: arch.Attention{Kind: arch.MLA, Heads: p.Attn.Heads, KVHeads: p.Attn.Heads, HeadDim: p.Attn.NopeDim + p.Attn.RopeDim,
			QLoraRank: p.Attn.QLoraRank, KVLoraRank: p.Attn.KVLoraRank, NopeDim: p.Attn.NopeDim, RopeDim: p.Attn.RopeDim, VDim: p.Attn.VDim,
			RoPE: arch.RoPE{Theta: p.Attn.RopeTheta, Scaling: p.Attn.Scaling}}}
	if g := p.GQA; g != nil {
		a.Attention = arch.Attention{Kind: arch.GQA, Heads: g.Heads, KVHeads: g.KVHeads, HeadDim: g.HeadDim, Bias: g.Bias, OutBias: g.OutBias,
			QKNorm: g.QKNorm, Sinks: g.Sinks, Window: g.Window, RotaryDim: g.RoPE.Dim()}
	}
	cfg := a.MoE
	m := &Model{Arch: a, Config: &a.MoE, Vocab: p.Vocab, Hidden: H, eps: p.RMSNormEps}
	rng := rand.New(rand.NewPCG(seed, 0x6d6f64))
	uniform := func(rows, cols int, scale float64, dt kernels.DType) kernels.Matrix {
		v := make([]float32, rows*cols)
		for i := range v {
			v[i] = float32((2*rng.Float64() - 1) * scale)
		}
		if dt == kernels.BF16 {
			u := make([]uint16, len(v))
			for i, x := range v {
				u[i] = half.F32ToBF16(x)
			}
			mat, _ := kernels.NewHalf(kernels.BF16, rows, cols, u)
			return mat
		}
		mat, _ := kernels.NewF32(rows, cols, v)
		return mat
	}
	norm := func() []float32 {
		v := make([]float32, H)
		for i := range v {
			v[i] = float32(1 + 0.2*(2*rng.Float64()-1))
		}
		return v
	}
	m.embed = uniform(p.Vocab, H, 1, p.EmbeddingDType)
	m.lmHead = uniform(p.Vocab, H, 1/math.Sqrt(float64(H)), p.EmbeddingDType)
	m.norm = norm()
	for l := 0; l < p.Layers; l++ {
		d := decoderLayer{inNorm: norm(), postNorm: norm()}
		var err error
		ls := seed*1000003 + uint64(l)
		if g := p.GQA; g != nil {
			lg := *g
			if p.Windowed != nil && !p.Windowed(l) {
				lg.Window = 0
			}
			d.attn, err = attn.NewRandomGQABlock(lg, p.WeightDType, ls)
		} else {
			d.attn, err = attn.NewRandomMLABlock(p.Attn, p.WeightDType, ls)
		}
		if err != nil {
			return nil, err
		}
		if l < p.FirstKDense {
			I := p.DenseInter
			g := &d.dense
			g.Gate = uniform(I, H, 1/math.Sqrt(float64(H)), p.WeightDType)
			g.Up = uniform(I, H, 1/math.Sqrt(float64(H)), p.WeightDType)
			g.Down = uniform(H, I, 1/math.Sqrt(float64(I)), p.WeightDType)
			if kernels.PacksWeights() {
				g.Gate, g.Up, g.Down = kernels.Pack(g.Gate), kernels.Pack(g.Up), kernels.Pack(g.Down)
			}
		} else {
			lc := cfg
			dt := p.WeightDType
			if p.ExpertDType != 0 {
				dt = p.ExpertDType
			}
			if d.moe, err = moe.NewRandom(&lc, dt, ls); err != nil {
				return nil, err
			}
		}
		m.layers = append(m.layers, d)
	}
	return m, nil
}
