package kernels

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// pow2SIMD returns the implementation with power-of-two 4-bit kernels, and
// a copy of it without them.
func pow2SIMD(t *testing.T) (with, without *simd) {
	for _, s := range simds {
		if len(s.outerQ4P[1]) > 1 {
			w := *s
			w.outerQ4P = outerQ4Table{}
			return s, &w
		}
	}
	t.Skip("no power-of-two 4-bit kernels on this machine")
	return nil, nil
}

// mxfp4 is an MXFP4 matrix [rows, cols] of random nibbles whose E8M0
// scales lie in [elo, ehi].
func mxfp4(t *testing.T, rng *rand.Rand, rows, cols, elo, ehi int) Matrix {
	data := make([]uint8, rows*cols/2)
	for i := range data {
		data[i] = uint8(rng.IntN(256))
	}
	sc := make([]uint8, rows*cols/32)
	for i := range sc {
		sc[i] = uint8(elo + rng.IntN(ehi-elo+1))
	}
	m, err := NewMXFP4(rows, cols, data, sc)
	require.NoError(t, err)
	return m
}

// asF32 is m's dequantized weights as an fp32 matrix.
func asF32(t *testing.T, m Matrix) Matrix {
	v := make([]float32, m.Rows*m.Cols)
	for r := 0; r < m.Rows; r++ {
		m.RowF32(r, v[r*m.Cols:][:m.Cols])
	}
	f, err := NewF32(m.Rows, m.Cols, v)
	require.NoError(t, err)
	return f
}

// TestPow2KernelsExact: the power-of-two MXFP4 kernels, where pow2Exact
// lets them run, give the bits of the other 4-bit kernels and of the fp32
// kernels on the dequantized weights, over scales from 2^-127 to 2^127 and
// activations from subnormal to 2^127 (NaN and infinity aside) — and both
// sides of the guard are taken.
func TestPow2KernelsExact(t *testing.T) {
	with, without := pow2SIMD(t)
	rng := rand.New(rand.NewPCG(21, 22))
	windows := [][2]int{{120, 130}, {100, 127}, {110, 140}, {127, 127}, {0, 20}, {1, 4}, {230, 253}, {250, 254}, {0, 254}, {60, 200}}
	taken, refused := 0, 0
	for trial := 0; trial < 1000; trial++ {
		w := windows[trial%len(windows)]
		const N, K = 40, 96
		m := mxfp4(t, rng, N, K, w[0], w[1])
		pm, pf := Pack(m), Pack(asF32(t, m))
		M := []int{1, 1, 1, 2, 3, with.maxMR + 1, 3 * with.maxMR}[rng.IntN(7)]
		h := make([]float32, M*K)
		for r := 0; r < M; r++ {
			a := rng.IntN(81) - 40 // the row's magnitude: 2^a
			if rng.IntN(8) == 0 {
				a = rng.IntN(270) - 150
			}
			wild := rng.IntN(8) == 0 // and some of any magnitude
			for k := 0; k < K; k++ {
				switch rng.IntN(8) {
				case 0:
					h[r*K+k] = 0
				case 1:
					if !wild {
						h[r*K+k] = float32(math.Ldexp(rng.Float64()*2-1, a))
						break
					}
					h[r*K+k] = float32(math.Ldexp(rng.Float64()*2-1, rng.IntN(280)-150))
				default:
					h[r*K+k] = float32(math.Ldexp(rng.Float64()*2-1, a))
				}
			}
		}
		for r := 0; r < M; r += with.stripRows(M, r) {
			var sr magRange
			for i := r; i < r+with.stripRows(M, r); i++ {
				sr = sr.join(magnitudeRange(h[i*K:][:K]))
			}
			if pm.q.pow2 && pow2Exact(sr.lo, sr.hi, K, pm.q.pmin, pm.q.pmax) {
				taken++
			} else {
				refused++
			}
		}
		got, q4, f32 := make([]float32, M*N), make([]float32, M*N), make([]float32, M*N)
		downOuter(with, got, h, nil, nil, pm, nil, nil, 0, N)
		downOuter(without, q4, h, nil, nil, pm, nil, nil, 0, N)
		downOuter(with, f32, h, nil, nil, pf, nil, nil, 0, N)
		require.Equal(t, bitsOf(f32), bitsOf(q4), "trial %d: 4-bit kernels against fp32", trial)
		require.Equal(t, bitsOf(q4), bitsOf(got), "trial %d: scales [%d, %d], %d rows", trial, w[0], w[1], M)
	}
	require.Greater(t, taken, 250, "strips on the power-of-two kernels")
	require.Greater(t, refused, 250, "strips the guard refused")
}

// TestPow2Guard: what pow2Exact refuses would give other bits. Without
// it, products below the subnormal range that each FMA rounds to zero add
// up in the scaled chain; and a chain scaled by 2^100 overflows where the
// computed one does not.
func TestPow2Guard(t *testing.T) {
	with, _ := pow2SIMD(t)
	const N, K = 16, 32
	cases := []struct {
		name  string
		scale uint8 // E8M0
		x     float32
	}{
		{"underflow", 1, 1.5 * 0x1p-25}, // each 0.5·2^-126·x rounds to 0; 32 of them to 6·2^-149
		{"overflow", 27, 0x1p125},       // 2^-100·6·2^125 ≈ 2^27 a step; scaled, 6·2^125
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			data := make([]uint8, N*K/2)
			for i := range data {
				data[i] = 0x11 // e2m1 0.5 in both nibbles
				if c.name == "overflow" {
					data[i] = 0x77 // 6
				}
			}
			sc := make([]uint8, N*K/32)
			for i := range sc {
				sc[i] = c.scale
			}
			m, err := NewMXFP4(N, K, data, sc)
			require.NoError(t, err)
			pm, pf := Pack(m), Pack(asF32(t, m))
			h := make([]float32, K)
			for i := range h {
				h[i] = c.x
			}
			want := make([]float32, N)
			downOuter(with, want, h, nil, nil, pf, nil, nil, 0, N)
			got := make([]float32, N)
			downOuter(with, got, h, nil, nil, pm, nil, nil, 0, N)
			require.Equal(t, bitsOf(want), bitsOf(got), "guarded")
			mr := magnitudeRange(h)
			require.False(t, pow2Exact(mr.lo, mr.hi, K, pm.q.pmin, pm.q.pmax), "the guard refuses it")

			defer func(f func(uint32, uint32, int, int, int) bool) { pow2Check = f }(pow2Check)
			pow2Check = func(uint32, uint32, int, int, int) bool { return true }
			unguarded := make([]float32, N)
			downOuter(with, unguarded, h, nil, nil, pm, nil, nil, 0, N)
			require.NotEqual(t, bitsOf(want), bitsOf(unguarded), "unguarded: want %v, got %v", want[0], unguarded[0])
		})
	}
}

func bitsOf(v []float32) []uint32 {
	out := make([]uint32, len(v))
	for i, f := range v {
		out[i] = math.Float32bits(f)
	}
	return out
}
