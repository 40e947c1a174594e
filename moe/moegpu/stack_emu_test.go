//go:build cudaemu && !cuda

package moegpu

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

// TestQuantizedResident: an FP8 layer's experts stay FP8 on the device, a
// byte a weight plus their block scales (half the memory of bf16); MXFP4
// and INT4 half a byte plus a scale per 32, UINT4 (GGUF's Q4_1, Q4_K) with
// an offset per 32 too, INT8 (Q8_0) a byte plus a scale per 32; a bf16
// layer's take two bytes a weight.
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
		case kernels.MXFP4, kernels.INT4:
			require.Equal(t, map[kernels.DType]cuda.WeightFormat{kernels.MXFP4: cuda.MXFP4, kernels.INT4: cuda.INT4}[dt], g.Format)
			require.Equal(t, weights/2, g.W.Bytes)
			require.Equal(t, weights/32*4, g.Scales.Bytes)
			require.Zero(t, g.Offsets.Bytes)
		case kernels.UINT4:
			require.Equal(t, cuda.UINT4, g.Format)
			require.Equal(t, weights/2, g.W.Bytes)
			require.Equal(t, weights/32*4, g.Scales.Bytes)
			require.Equal(t, weights/32*4, g.Offsets.Bytes)
		case kernels.INT8:
			require.Equal(t, cuda.INT8, g.Format)
			require.Equal(t, weights, g.W.Bytes)
			require.Equal(t, weights/32*4, g.Scales.Bytes)
			require.Zero(t, g.Offsets.Bytes)
		default:
			require.Equal(t, cuda.BF16, g.Format)
			require.Equal(t, 2*weights, g.W.Bytes)
		}
		require.NoError(t, x.Close())
	}
}
