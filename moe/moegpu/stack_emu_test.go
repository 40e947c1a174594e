//go:build cudaemu && !cuda

package moegpu

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/kernels/kerneltest"
	"github.com/moex-project/moex/moe"
)

// TestQuantizedResident: an FP8 layer's experts stay FP8 on the device, a
// byte a weight plus their block scales (half the memory of bf16); MXFP4
// half a byte plus an E8M0 byte per 32, INT4 (Q4_0, as kernels.Quantize
// makes it) half a byte plus an fp16 scale per 32, UINT4 (GGUF's Q4_K) a
// scale and an offset per 32 as Q4_K's factors (4.75 bits a weight in
// all), INT8 (Q8_0) a byte plus an fp16 scale per 32; a bf16 layer's take
// two bytes a weight.
func TestQuantizedResident(t *testing.T) {
	cfg := &moe.Config{ModelType: "mixtral", Hidden: 256, NumExperts: 4, TopK: 2, Inter: 128, Scoring: moe.Softmax,
		Method: moe.Greedy, NormTopK: true, RoutedScaling: 1}
	for _, dt := range []kernels.DType{kernels.F8E4M3, kernels.MXFP4, kernels.INT4, kernels.UINT4, kernels.INT8, kernels.BF16} {
		l, err := moe.NewRandom(cfg, dt, 3)
		require.NoError(t, err)
		x, err := NewExperts(cuda.NewEmu(), l)
		require.NoError(t, err)
		weights := int64(cfg.NumExperts * cfg.Inter * cfg.Hidden)
		g := x.routed.gate
		switch dt {
		case kernels.F8E4M3:
			require.Equal(t, cuda.FP8, g.Format)
			require.Equal(t, weights, g.W.Bytes)
			require.Equal(t, int64(cfg.NumExperts*1*2*4), g.Scales.Bytes, "one 128×128 scale block by two, fp32")
			require.Equal(t, [2]int{128, 128}, [2]int{g.BlockRows, g.BlockCols})
		case kernels.MXFP4:
			require.Equal(t, cuda.MXFP4, g.Format)
			require.Equal(t, weights/2, g.W.Bytes)
			require.True(t, g.E8)
			require.Equal(t, weights/32, g.Scales.Bytes, "an E8M0 byte a group")
			require.Zero(t, g.Offsets.Bytes)
		case kernels.INT4:
			require.Equal(t, cuda.INT4, g.Format)
			require.Equal(t, weights/2, g.W.Bytes)
			require.True(t, g.Half)
			require.Equal(t, weights/32*2, g.Scales.Bytes)
			require.Zero(t, g.Offsets.Bytes)
		case kernels.UINT4: // Q4_K's factors: d and −dmin a super-block of 8 groups, sc and m a group
			require.Equal(t, cuda.UINT4, g.Format)
			require.Equal(t, weights/2, g.W.Bytes)
			require.Equal(t, 8, g.Super)
			require.Equal(t, weights/256*4, g.Scales.Bytes)
			require.Equal(t, weights/256*4, g.Offsets.Bytes)
			require.Equal(t, weights/32*2, g.Factors.Bytes)
		case kernels.INT8:
			require.Equal(t, cuda.INT8, g.Format)
			require.Equal(t, weights, g.W.Bytes)
			require.True(t, g.Half)
			require.Equal(t, weights/32*2, g.Scales.Bytes)
			require.Zero(t, g.Offsets.Bytes)
		default:
			require.Equal(t, cuda.BF16, g.Format)
			require.Equal(t, 2*weights, g.W.Bytes)
		}
		require.NoError(t, x.Close())
	}
}

// TestNarrowResident: GGUF's 5- and 6-bit codes stay in their bits on the
// device (a row's low nibbles, then a plane a high bit), the K-quants'
// factors and Q8_0's and Q4_1's fp16 scales as the file holds them, and a layer whose
// projections are stored differently (Q4_K_M: Q4_K gate and up, Q6_K
// down) keeps each projection's format rather than widening all three to
// bf16; the experts run on the emulation give the CPU layer's output
// (bf16 activations: within 1e-2).
func TestNarrowResident(t *testing.T) {
	cfg := &moe.Config{ModelType: "mixtral", Hidden: 64, NumExperts: 4, TopK: 2, Inter: 96, Scoring: moe.Softmax,
		Method: moe.Greedy, NormTopK: true, RoutedScaling: 1}
	weights := int64(cfg.NumExperts * cfg.Inter * cfg.Hidden)
	rng := rand.New(rand.NewPCG(5, 6))
	// Each case's experts' projections, made from random codes.
	q6k := func(rows, cols int) kernels.Matrix {
		m, _ := kerneltest.KQuantWeights(rng, kernels.INT8, rows, cols, 16, -32, 64, false)
		return m
	}
	q5k := func(rows, cols int) kernels.Matrix {
		m, _ := kerneltest.KQuantWeights(rng, kernels.INT8, rows, cols, 32, 0, 32, true)
		return m
	}
	q50 := func(rows, cols int) kernels.Matrix {
		m, _ := kerneltest.INT8CodeWeights(rng, rows, cols, 32, -16, 32, false)
		return m
	}
	q4k := func(rows, cols int) kernels.Matrix {
		m, _ := kerneltest.KQuantWeights(rng, kernels.UINT4, rows, cols, 32, 0, 16, true)
		return m
	}
	// GGUF's Q8_0 and Q4_1: fp16 scales (and offsets), held so on the device.
	f16 := func(n int, lo, span float64) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = half.F16ToF32(half.F32ToF16(float32(lo + rng.Float64()*span)))
		}
		return v
	}
	q80 := func(rows, cols int) kernels.Matrix {
		codes := make([]int8, rows*cols)
		for i := range codes {
			codes[i] = int8(rng.IntN(255) - 127)
		}
		m, err := kernels.NewINT8(rows, cols, 32, codes, f16(rows*cols/32, 1e-4, 1e-3), nil)
		require.NoError(t, err)
		return m
	}
	q41 := func(rows, cols int) kernels.Matrix {
		packed := make([]uint8, rows*cols/2)
		for i := range packed {
			packed[i] = uint8(rng.IntN(256))
		}
		m, err := kernels.NewUINT4(rows, cols, 32, packed, f16(rows*cols/32, 1e-3, 1e-2), f16(rows*cols/32, -0.08, 0.01))
		require.NoError(t, err)
		return m
	}
	for _, c := range []struct {
		name              string
		gateUp, down      func(rows, cols int) kernels.Matrix
		first, second     cuda.WeightFormat
		firstBits, bits   int64
		offsets, offsets2 bool
		// The super-blocks' groups on the device (0: fp32 scales): the
		// factors' (see kerneltest.KQuantWeights), but for super-blocks of
		// one group (Q5_K's down, 3 groups a row).
		super, super2 int
		half          bool // fp16 scales and offsets on the device
	}{
		{"q4_k_m", q4k, q6k, cuda.UINT4, cuda.INT6, 4, 6, true, false, 2, 2, false},
		{"q5_k", q5k, q5k, cuda.UINT5, cuda.UINT5, 5, 5, true, true, 2, 0, false},
		{"q5_0", q50, q50, cuda.INT5, cuda.INT5, 5, 5, false, false, 0, 0, false},
		{"q6_k", q6k, q6k, cuda.INT6, cuda.INT6, 6, 6, false, false, 4, 2, false},
		{"q8_0", q80, q80, cuda.INT8, cuda.INT8, 8, 8, false, false, 0, 0, true},
		{"q4_1", q41, q41, cuda.UINT4, cuda.UINT4, 4, 4, true, true, 0, 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := residentLayer(t, cfg, rng, func() moe.Expert {
				return moe.Expert{Gate: kernels.Pack(c.gateUp(cfg.Inter, cfg.Hidden)), Up: kernels.Pack(c.gateUp(cfg.Inter, cfg.Hidden)),
					Down: kernels.Pack(c.down(cfg.Hidden, cfg.Inter))}
			})
			ex, err := NewExperts(cuda.NewEmu(), l)
			require.NoError(t, err)
			defer ex.Close()
			st := ex.routed
			require.Equal(t, [3]cuda.WeightFormat{c.first, c.first, c.second}, [3]cuda.WeightFormat{st.gate.Format, st.up.Format, st.down.Format})
			require.Equal(t, weights*c.firstBits/8, st.gate.W.Bytes)
			require.Equal(t, weights*c.firstBits/8, st.up.W.Bytes)
			require.Equal(t, weights*c.bits/8, st.down.W.Bytes)
			require.Equal(t, c.offsets, st.gate.Offsets.Bytes > 0)
			require.Equal(t, c.offsets2, st.down.Offsets.Bytes > 0)
			// The scales' bytes: fp32 (fp16 for Q8_0's and Q4_1's) a
			// group, or fp32 a super-block and a byte a group (two with
			// offsets).
			for _, p := range []struct {
				w     cuda.Weights
				super int
			}{{st.gate, c.super}, {st.up, c.super}, {st.down, c.super2}} {
				groups := weights / int64(p.w.BlockCols)
				require.Equal(t, p.super, p.w.Super)
				require.Equal(t, c.half, p.w.Half)
				if p.super == 0 {
					size := int64(4)
					if c.half {
						size = 2
					}
					require.Equal(t, size*groups, p.w.Scales.Bytes)
					if p.w.Offsets.Bytes > 0 {
						require.Equal(t, size*groups, p.w.Offsets.Bytes)
					}
					require.Zero(t, p.w.Factors.Bytes)
					continue
				}
				require.Equal(t, 4*groups/int64(p.super), p.w.Scales.Bytes)
				fpg := int64(1)
				if p.w.Offsets.Bytes > 0 {
					fpg = 2
					require.Equal(t, 4*groups/int64(p.super), p.w.Offsets.Bytes)
				}
				require.Equal(t, fpg*groups, p.w.Factors.Bytes)
			}
			for _, T := range []int{1, 9} {
				e := emuRelErr(t, l, ex, T, cfg.Hidden)
				t.Logf("%d tokens: relative error %.2e", T, e)
				require.LessOrEqual(t, e, 1e-2)
			}
		})
	}
}

// TestMixedScalesResident: a gate with K-quant factors (Q4_K) beside an up
// projection without (Q4_1) share one launch, so both keep fp32 scales on
// the device, and the layer runs (before, gate and up were uploaded in
// formats that one launch refuses).
func TestMixedScalesResident(t *testing.T) {
	cfg := &moe.Config{ModelType: "mixtral", Hidden: 64, NumExperts: 4, TopK: 2, Inter: 96, Scoring: moe.Softmax,
		Method: moe.Greedy, NormTopK: true, RoutedScaling: 1}
	rng := rand.New(rand.NewPCG(7, 8))
	l := residentLayer(t, cfg, rng, func() moe.Expert {
		g, _ := kerneltest.KQuantWeights(rng, kernels.UINT4, cfg.Inter, cfg.Hidden, 32, 0, 16, true)
		u, _ := kerneltest.UINT4Weights(rng, cfg.Inter, cfg.Hidden, 32, true)
		d, _ := kerneltest.UINT4Weights(rng, cfg.Hidden, cfg.Inter, 32, true)
		return moe.Expert{Gate: kernels.Pack(g), Up: kernels.Pack(u), Down: kernels.Pack(d)}
	})
	ex, err := NewExperts(cuda.NewEmu(), l)
	require.NoError(t, err)
	defer ex.Close()
	require.Equal(t, [2]int{0, 0}, [2]int{ex.routed.gate.Super, ex.routed.up.Super})
	require.LessOrEqual(t, emuRelErr(t, l, ex, 3, cfg.Hidden), 1e-2)
}

// residentLayer is a layer of cfg with a random fp32 router and the
// experts expert makes.
func residentLayer(t *testing.T, cfg *moe.Config, rng *rand.Rand, expert func() moe.Expert) *moe.Layer {
	router := make([]float32, cfg.NumExperts*cfg.Hidden)
	for i := range router {
		router[i] = float32(rng.NormFloat64() / 8)
	}
	w := moe.Weights{Experts: make([]moe.Expert, cfg.NumExperts)}
	var err error
	w.Gate, err = kernels.NewF32(cfg.NumExperts, cfg.Hidden, router)
	require.NoError(t, err)
	for e := range w.Experts {
		w.Experts[e] = expert()
	}
	l, err := moe.New(cfg, w)
	require.NoError(t, err)
	return l
}

// emuRelErr runs T tokens of bf16-exact input through l on the CPU and
// with its experts on ex, and returns the relative error between them.
func emuRelErr(t *testing.T, l *moe.Layer, ex *Experts, T, hidden int) float64 {
	x := moetest.Input(uint64(T), T, hidden, false)
	for i, v := range x {
		x[i] = half.BF16ToF32(half.F32ToBF16(v))
	}
	want := make([]float32, len(x))
	l.SetExpertRunner(nil)
	require.NoError(t, l.Forward(context.Background(), x, want))
	got := make([]float32, len(x))
	l.SetExpertRunner(ex)
	require.NoError(t, l.Forward(context.Background(), x, got))
	l.SetExpertRunner(nil)
	ref := make([]float64, len(want))
	for i, v := range want {
		ref[i] = float64(v)
	}
	return moetest.RelErr(got, ref)
}
