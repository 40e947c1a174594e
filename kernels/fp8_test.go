package kernels_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/kernels/kerneltest"
)

// TestE4M3: every byte's value against the format's definition, and the
// encoder's round trip and rounding.
func TestE4M3(t *testing.T) {
	for b := 0; b < 256; b++ {
		want := kerneltest.E4M3(uint8(b))
		got := kernels.E4M3(uint8(b))
		if math.IsNaN(want) {
			require.True(t, math.IsNaN(float64(got)), "byte %#02x", b)
			require.Equal(t, uint8(0x7F), kernels.EncodeE4M3(got))
			continue
		}
		require.Equal(t, want, float64(got), "byte %#02x", b)
		if b != 0x80 { // -0 encodes as itself below
			require.Equal(t, uint8(b), kernels.EncodeE4M3(got), "round trip of byte %#02x", b)
		}
	}
	require.Equal(t, uint8(0x80), kernels.EncodeE4M3(float32(math.Copysign(0, -1))))
	require.Equal(t, float32(448), kernels.E4M3(kernels.EncodeE4M3(1e9)), "saturates")
	require.Equal(t, float32(-448), kernels.E4M3(kernels.EncodeE4M3(-500)))
	// 1.0625 lies halfway between 1 (0x38) and 1.125 (0x39): to the even code.
	require.Equal(t, uint8(0x38), kernels.EncodeE4M3(1.0625))
	require.Equal(t, uint8(0x3A), kernels.EncodeE4M3(1.1875)) // between 0x39 and 0x3A
	require.Equal(t, uint8(0x39), kernels.EncodeE4M3(1.1))
	require.Equal(t, uint8(0x01), kernels.EncodeE4M3(0x1p-9), "the smallest subnormal")
	require.Equal(t, uint8(0x00), kernels.EncodeE4M3(0x1p-11))
	// Random values against the nearest code found by search, ties (the
	// midpoints, drawn on purpose) to the even code.
	rng := rand.New(rand.NewPCG(7, 8))
	for i := 0; i < 20000; i++ {
		v := float32(math.Ldexp(rng.Float64(), -12+rng.IntN(22)))
		if i%4 == 0 { // a midpoint between two neighbouring codes
			c := rng.IntN(0x7E)
			v = float32((kerneltest.E4M3(uint8(c)) + kerneltest.E4M3(uint8(c+1))) / 2)
		}
		if rng.IntN(2) == 0 {
			v = -v
		}
		want, best := uint8(0x7E), math.Inf(1)
		if math.Abs(float64(v)) < 448 {
			for c := 0; c < 0x7F; c++ {
				d := math.Abs(kerneltest.E4M3(uint8(c)) - math.Abs(float64(v)))
				if d < best || d == best && c%2 == 0 {
					want, best = uint8(c), d
				}
			}
		}
		if v < 0 {
			want |= 0x80
		}
		require.Equal(t, want, kernels.EncodeE4M3(v), "%v", v)
	}
}

func bitsOf(v []float32) []uint32 {
	out := make([]uint32, len(v))
	for i, f := range v {
		out[i] = math.Float32bits(f)
	}
	return out
}

// dequantized is an FP8 matrix's dequantized weights as an fp32 matrix.
func dequantized(t *testing.T, m kernels.Matrix) kernels.Matrix {
	v := make([]float32, m.Rows*m.Cols)
	for r := 0; r < m.Rows; r++ {
		m.RowF32(r, v[r*m.Cols:][:m.Cols])
	}
	f, err := kernels.NewF32(m.Rows, m.Cols, v)
	require.NoError(t, err)
	return f
}

// TestFP8Exact: on every implementation, the packed FP8 kernels give the
// bits of the fp32 kernels on the dequantized weights (the widening in
// registers is exact), with scale blocks of every kind (128×128 as the
// checkpoints have them, blocks that split a panel, partial edge blocks),
// and a row's bits do not depend on the rows beside it.
func TestFP8Exact(t *testing.T) {
	blocks := [][2]int{{128, 128}, {8, 24}, {16, 16}, {5, 7}, {1, 1}}
	shapes := []struct{ M, N, K int }{{1, 37, 257}, {3, 64, 300}, {7, 20, 130}, {64, 48, 512}, {13, 16, 2048}}
	forEachImpl(t, func(t *testing.T) {
		for _, blk := range blocks {
			for _, s := range shapes {
				rng := rand.New(rand.NewPCG(uint64(blk[0]*1000+blk[1]), uint64(s.M*s.N+s.K)))
				gate, _ := kerneltest.FP8Weights(rng, s.N, s.K, blk)
				up, _ := kerneltest.FP8Weights(rng, s.N, s.K, blk)
				down, _ := kerneltest.FP8Weights(rng, s.N, s.K, blk)
				x := make([]float32, s.M*s.K)
				for i := range x {
					x[i] = float32(rng.Float64()*2 - 1)
				}
				idx := make([]int32, s.M)
				for i := range idx {
					idx[i] = int32(i)
				}
				pg, pu, pd := kernels.Pack(gate), kernels.Pack(up), kernels.Pack(down)
				fg, fu, fd := kernels.Pack(dequantized(t, gate)), kernels.Pack(dequantized(t, up)), kernels.Pack(dequantized(t, down))
				h8, h32 := make([]float32, s.M*s.N), make([]float32, s.M*s.N)
				kernels.GateUp(h8, x, idx, pg, pu, 0, s.N)
				kernels.GateUp(h32, x, idx, fg, fu, 0, s.N)
				require.Equal(t, bitsOf(h32), bitsOf(h8), "gate/up, block %v, shape %+v", blk, s)
				o8, o32 := make([]float32, s.M*s.N), make([]float32, s.M*s.N)
				kernels.Down(o8, x, pd, nil, 0, s.N)
				kernels.Down(o32, x, fd, nil, 0, s.N)
				require.Equal(t, bitsOf(o32), bitsOf(o8), "down, block %v, shape %+v", blk, s)
				// The last row alone gives the bits it gave in the batch.
				one := make([]float32, s.N)
				kernels.GateUp(one, x, idx[s.M-1:], pg, pu, 0, s.N)
				require.Equal(t, bitsOf(h8[(s.M-1)*s.N:]), bitsOf(one), "gate/up of one row, block %v, shape %+v", blk, s)
			}
		}
	})
}

// TestFP8BadInput: NaN bytes, scales of the wrong count or value, bad
// block sizes: each an error naming the problem.
func TestFP8BadInput(t *testing.T) {
	data := make([]uint8, 4*6)
	scales := []float32{1, 1, 1, 1} // [2, 2] blocks of [2, 3]
	_, err := kernels.NewFP8(4, 6, data, scales, 2, 3)
	require.NoError(t, err)
	for _, c := range []struct {
		name   string
		mutate func(d []uint8, s []float32) ([]uint8, []float32)
		bs     [2]int
		want   string
	}{
		{"NaN byte", func(d []uint8, s []float32) ([]uint8, []float32) { d[7] = 0x7F; return d, s }, [2]int{2, 3},
			"fp8 weight [1, 1] is the NaN byte 0x7f"},
		{"negative NaN byte", func(d []uint8, s []float32) ([]uint8, []float32) { d[23] = 0xFF; return d, s }, [2]int{2, 3},
			"fp8 weight [3, 5] is the NaN byte 0xff"},
		{"too few scales", func(d []uint8, s []float32) ([]uint8, []float32) { return d, s[:3] }, [2]int{2, 3},
			"needs [2, 2] scales, have 3"},
		{"NaN scale", func(d []uint8, s []float32) ([]uint8, []float32) { s[2] = float32(math.NaN()); return d, s }, [2]int{2, 3},
			"fp8 scale [1, 0] is NaN"},
		{"infinite scale", func(d []uint8, s []float32) ([]uint8, []float32) { s[1] = float32(math.Inf(1)); return d, s }, [2]int{2, 3},
			"fp8 scale [0, 1] is +Inf"},
		{"negative zero scale", func(d []uint8, s []float32) ([]uint8, []float32) {
			s[3] = float32(math.Copysign(0, -1))
			return d, s
		}, [2]int{2, 3}, "fp8 scale [1, 1] is -0"},
		{"zero block", func(d []uint8, s []float32) ([]uint8, []float32) { return d, s }, [2]int{0, 3},
			"fp8 block size [0, 3] is not positive"},
		{"short data", func(d []uint8, s []float32) ([]uint8, []float32) { return d[:20], s }, [2]int{2, 3},
			"matrix [4, 6] needs 24 values, have 20"},
	} {
		t.Run(c.name, func(t *testing.T) {
			d, s := c.mutate(append([]uint8(nil), data...), append([]float32(nil), scales...))
			_, err := kernels.NewFP8(4, 6, d, s, c.bs[0], c.bs[1])
			require.ErrorContains(t, err, c.want)
		})
	}
}

// TestFP8LargeScale: a scale of 2^8 or more is beyond the SIMD kernels'
// widening; such a matrix runs on the generic kernels, still right.
func TestFP8LargeScale(t *testing.T) {
	const N, K = 20, 40
	rng := rand.New(rand.NewPCG(3, 4))
	m, _ := kerneltest.FP8Weights(rng, N, K, [2]int{16, 16})
	data := make([]uint8, N*K)
	for r := 0; r < N; r++ {
		for c := 0; c < K; c++ {
			data[r*K+c] = kernels.EncodeE4M3(m.At(r, c) / 512)
		}
	}
	scales := make([]float32, 2*3)
	for i := range scales {
		scales[i] = 512
	}
	big, err := kernels.NewFP8(N, K, data, scales, 16, 16)
	require.NoError(t, err)
	x := make([]float32, 2*K)
	for i := range x {
		x[i] = float32(rng.Float64())
	}
	out := make([]float32, 2*N)
	kernels.Down(out, x, kernels.Pack(big), nil, 0, N)
	for r := 0; r < 2; r++ {
		for n := 0; n < N; n++ {
			var want float64
			for k := 0; k < K; k++ {
				want += float64(x[r*K+k]) * kerneltest.E4M3(data[n*K+k]) * 512
			}
			require.InDelta(t, want, out[r*N+n], 1e-4*(1+math.Abs(want)))
		}
	}
}

// FuzzFP8: any bytes and scales NewFP8 accepts give, through the packed
// SIMD kernels, the bits of the fp32 kernels on the dequantized weights.
func FuzzFP8(f *testing.F) {
	f.Add([]byte{0x00, 0x01, 0x7E, 0x80, 0x81, 0xFE, 0x38, 0xB8, 0x08, 0x07}, float32(0.01), uint8(3), uint8(5))
	f.Fuzz(func(t *testing.T, raw []byte, scale float32, br, bc uint8) {
		const N, K = 17, 33
		if len(raw) == 0 || br == 0 || bc == 0 || !(scale >= 0 && scale < 64) {
			return // (scales of 2^8 or more take the generic kernels)
		}
		data := make([]uint8, N*K)
		for i := range data {
			data[i] = raw[i%len(raw)] ^ uint8(i/len(raw))
		}
		gr, gc := (N+int(br)-1)/int(br), (K+int(bc)-1)/int(bc)
		scales := make([]float32, gr*gc)
		for i := range scales {
			scales[i] = scale * float32(1+i%3)
		}
		m, err := kernels.NewFP8(N, K, data, scales, int(br), int(bc))
		if err != nil {
			return // NaN bytes and bad scales are refused, as they must be
		}
		x := make([]float32, 2*K)
		for i := range x {
			x[i] = float32(i%7) - 3
		}
		o8, o32 := make([]float32, 2*N), make([]float32, 2*N)
		kernels.Down(o8, x, kernels.Pack(m), nil, 0, N)
		kernels.Down(o32, x, kernels.Pack(dequantized(t, m)), nil, 0, N)
		require.Equal(t, bitsOf(o32), bitsOf(o8))
	})
}
