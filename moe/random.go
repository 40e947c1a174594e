package moe

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"unsafe"

	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/internal/hugepage"
	"github.com/moex-project/moex/internal/memlimit"
	"github.com/moex-project/moex/kernels"
)

// DeepSeekV2Lite returns the MoE block of DeepSeek-V2-Lite: 64 routed
// experts of width 1408, top-6, greedy softmax routing without
// renormalisation, two shared experts, hidden size 2048.
func DeepSeekV2Lite() *Config {
	return &Config{
		ModelType: "deepseek_v2", Name: "deepseek_v2", Hidden: 2048, NumExperts: 64, TopK: 6, Inter: 1408,
		SharedInter: 2 * 1408, Scoring: Softmax, Method: Greedy, RoutedScaling: 1,
	}
}

// GptOss20B returns the MoE block of gpt-oss-20b: 32 experts of width
// 2880, top-4 on the biased router logits, experts with biases and the
// clamped SwiGLU (limit 7), hidden size 2880, no shared expert.
func GptOss20B() *Config {
	return &Config{
		ModelType: "gpt_oss", Name: "gpt_oss", Hidden: 2880, NumExperts: 32, TopK: 4, Inter: 2880,
		Scoring: Softmax, Method: Greedy, NormTopK: true, RoutedScaling: 1, RouterBias: true, ExpertBias: true,
		Act: kernels.Activation{Kind: kernels.ClampedSwiGLU, Alpha: 1.702, Limit: 7},
	}
}

// DeepSeekV4Flash returns the MoE block of DeepSeek-V4-Flash's score
// layers: 256 experts of width 2048, top-6 on sqrt(softplus) scores plus
// the correction bias, routed scaling 1.5, one shared expert, experts
// clamped at 10, hidden size 4096.
func DeepSeekV4Flash() *Config {
	return &Config{
		ModelType: "deepseek_v4", Name: "deepseek_v4", Hidden: 4096, NumExperts: 256, TopK: 6, Inter: 2048, SharedInter: 2048,
		Scoring: SqrtSoftplus, Method: NoAuxTC, ScoreBiasInput: true, NumGroups: 1, TopKGroups: 1,
		NormTopK: true, NormEps: 1e-20, RoutedScaling: 1.5, VocabSize: 129280,
		Act: kernels.Activation{Kind: kernels.ClampedSiLU, Limit: 10},
	}
}

// NewRandom makes a layer of cfg with random weights in dtype, uniform in
// ±1/√fan_in (the correction bias and a router logit bias, if any, in
// ±0.05, expert biases in ±0.5, gemma4's scales and norms in 1 ± 0.5; a
// deepseek_v4 layer chooses by score, not by token id), the same for the
// same seed. With a quantized dtype (F8E4M3, MXFP4, INT4, UINT4, INT8) the experts are
// quantized as those checkpoints are (kernels.Quantize) and the router
// stays bf16. It is for benchmarks and demonstrations.
func NewRandom(cfg *Config, dtype kernels.DType, seed uint64) (*Layer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("moe: %w", err)
	}
	switch dtype {
	case kernels.F32, kernels.BF16, kernels.F16, kernels.F8E4M3, kernels.MXFP4, kernels.INT4, kernels.UINT4, kernels.INT8:
	default:
		return nil, fmt.Errorf("moe: random weights of dtype %v", dtype)
	}
	H := cfg.Hidden
	perWeight := float64(dtype.Bits()) / 8
	if dtype.Quantized() {
		perWeight += 0.25 // scales (and offsets), at most two fp32 per 32 weights
	}
	weights := 3 * float64(H) * (float64(cfg.NumExperts)*float64(cfg.Inter) + float64(cfg.SharedInter))
	if err := memlimit.Check(fmt.Sprintf("moe: random %v weights for %d experts of [%d, %d]", dtype, cfg.NumExperts, cfg.Inter, H),
		weights*perWeight+float64(cfg.NumExperts)*float64(H)*4); err != nil {
		return nil, err
	}
	var mu sync.Mutex
	var firstErr error
	// Each matrix has its own stream, so the weights do not depend on the
	// order the goroutines run in. With tmp, the values are made in tmp's
	// buffers (reused) and the matrix is the packed copy of them; without,
	// in memory of their own.
	type scratch struct {
		f32 []float32
		u16 []uint16
	}
	matrixOf := func(dtype kernels.DType, stream uint64, rows, cols int, tmp *scratch) kernels.Matrix {
		rng := rand.New(rand.NewPCG(seed, stream))
		a := 1 / math.Sqrt(float64(cols))
		var m kernels.Matrix
		var err error
		switch dtype {
		case kernels.F8E4M3, kernels.MXFP4, kernels.INT4, kernels.UINT4, kernels.INT8:
			v := make([]float32, rows*cols)
			for i := range v {
				v[i] = float32((2*rng.Float64() - 1) * a)
			}
			m, err = kernels.Quantize(dtype, v, rows, cols)
		case kernels.F32:
			var v []float32
			if tmp != nil {
				tmp.f32 = slices.Grow(tmp.f32[:0], rows*cols)[:rows*cols]
				v = tmp.f32
			} else {
				v = make([]float32, rows*cols)
				hugepage.Advise(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 4*len(v)))
			}
			for i := range v {
				v[i] = float32((2*rng.Float64() - 1) * a)
			}
			m, err = kernels.NewF32(rows, cols, v)
		default:
			conv := half.F32ToBF16
			if dtype == kernels.F16 {
				conv = half.F32ToF16
			}
			var v []uint16
			if tmp != nil {
				tmp.u16 = slices.Grow(tmp.u16[:0], rows*cols)[:rows*cols]
				v = tmp.u16
			} else {
				v = make([]uint16, rows*cols)
				hugepage.Advise(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), 2*len(v)))
			}
			for i := range v {
				v[i] = conv(float32((2*rng.Float64() - 1) * a))
			}
			m, err = kernels.NewHalf(dtype, rows, cols, v)
		}
		if err != nil {
			mu.Lock()
			firstErr = err
			mu.Unlock()
		}
		if tmp != nil {
			m = kernels.Pack(m) // a copy: tmp is reused
		}
		return m
	}
	matrix := func(stream uint64, rows, cols int, tmp *scratch) kernels.Matrix {
		return matrixOf(dtype, stream, rows, cols, tmp)
	}
	routerDType := dtype // the router (and qwen2_moe's shared-expert gate) of a quantized checkpoint stays bf16
	if dtype.Quantized() {
		routerDType = kernels.BF16
	}
	var w Weights
	w.Experts = make([]Expert, cfg.NumExperts)
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			// Where layers pack their experts, each worker makes the values
			// in one reused buffer and keeps only the packed copies.
			var tmp *scratch
			if kernels.PacksWeights() {
				tmp = new(scratch)
			}
			for e := range jobs {
				s := uint64(e+1) * 4
				w.Experts[e] = Expert{Gate: matrix(s, cfg.Inter, H, tmp), Up: matrix(s+1, cfg.Inter, H, tmp), Down: matrix(s+2, H, cfg.Inter, tmp)}
			}
		})
	}
	for e := range w.Experts {
		jobs <- e
	}
	close(jobs)
	wg.Wait()
	w.Gate = matrixOf(routerDType, 1, cfg.NumExperts, H, nil)
	if cfg.SharedInter > 0 {
		w.Shared = &Expert{Gate: matrix(2, cfg.SharedInter, H, nil), Up: matrix(3, cfg.SharedInter, H, nil), Down: matrix(0, H, cfg.SharedInter, nil)}
		if cfg.SharedGate {
			g := matrixOf(routerDType, 1<<32, 1, H, nil)
			w.SharedGate = &g
		}
	}
	biases := func(stream uint64, n int, a float64) []float32 {
		rng := rand.New(rand.NewPCG(seed, stream))
		b := make([]float32, n)
		for i := range b {
			b[i] = float32((2*rng.Float64() - 1) * a)
		}
		return b
	}
	if cfg.Method == NoAuxTC {
		w.Bias = biases(1<<33, cfg.NumExperts, 0.05)
	}
	if cfg.RouterBias {
		w.RouterBias = biases(1<<34, cfg.NumExperts, 0.05)
	}
	if cfg.ResidualInput {
		// gemma4's scales and norm weights, around one.
		around1 := func(stream uint64, n int) []float32 {
			b := biases(stream, n, 0.5)
			for i := range b {
				b[i]++
			}
			return b
		}
		w.RouterScale, w.ExpertScale = around1(1<<36, H), around1(1<<36+1, cfg.NumExperts)
		w.Norms = &Norms{Pre: around1(1<<36+2, H), Post1: around1(1<<36+3, H), Pre2: around1(1<<36+4, H),
			Post2: around1(1<<36+5, H), Post: around1(1<<36+6, H)}
	}
	if cfg.ExpertBias {
		for e := range w.Experts {
			s := 1<<35 + uint64(e)*4
			x := &w.Experts[e]
			x.GateBias, x.UpBias = biases(s, cfg.Inter, 0.5), biases(s+1, cfg.Inter, 0.5)
			x.DownBias = biases(s+2, H, 0.5)
		}
	}
	if firstErr != nil {
		return nil, firstErr
	}
	return New(cfg, w)
}
