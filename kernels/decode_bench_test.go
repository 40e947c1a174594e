package kernels_test

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/moex-project/moex/kernels"
)

// BenchmarkDecodeExperts times a decode step's grouped FFN at
// DeepSeek-V2-Lite's expert shapes (6 experts chosen, one token each, the
// chosen ones rotating over 32 so that the weights come from DRAM) for
// bf16 (in the exact and the bf16-dot mode), UINT4 (Q4_K as moex holds
// it; in the int8-dot mode also with its scales as fp32 rather than
// factored), INT8 (Q8_0) and INT4 (Q4_0) in the exact and the int8-dot
// mode, the last two also with fp32 scales (each one ulp off its fp16
// value) beside their fp16 ones, Q6_K- and Q5_K-like INT8, and MXFP4 (as
// gpt-oss holds its experts) in both modes; bytes are the weights read:
//
//	go test -run '^$' -bench DecodeExperts ./kernels
func BenchmarkDecodeExperts(b *testing.B) {
	const E, H, I, topK = 32, 2048, 1408, 6 // 32 experts rotated: far more than L3 holds
	rng := rand.New(rand.NewPCG(3, 3))
	fp := func(rows, cols int) []float32 {
		v := make([]float32, rows*cols)
		for i := range v {
			v[i] = (2*rng.Float32() - 1) / 45
		}
		return v
	}
	type expert struct{ gate, up, down kernels.Matrix }
	base := make([][3][]float32, E)
	for e := range base {
		base[e] = [3][]float32{fp(I, H), fp(I, H), fp(H, I)}
	}
	x := make([]float32, H)
	for i := range x {
		x[i] = 2*rng.Float32() - 1
	}
	made := map[kernels.DType][][3]kernels.Matrix{}
	for _, c := range []struct {
		name string
		dt   kernels.DType
		mode kernels.Numerics
		flat bool // UINT4's scales as fp32 only, without Q4_K's factors; INT8's and INT4's as fp32
	}{{"bf16", kernels.BF16, kernels.Exact, false}, {"bf16_bf16dot", kernels.BF16, kernels.BF16Dot, false}, {"uint4", kernels.UINT4, kernels.Exact, false},
		{"uint4_int8dot", kernels.UINT4, kernels.Int8Dot, false}, {"uint4_int8dot_fp32scales", kernels.UINT4, kernels.Int8Dot, true},
		{"int8", kernels.INT8, kernels.Exact, false}, {"int8_int8dot", kernels.INT8, kernels.Int8Dot, false},
		{"int8_fp32scales", kernels.INT8, kernels.Exact, true}, {"int8_int8dot_fp32scales", kernels.INT8, kernels.Int8Dot, true},
		{"int4", kernels.INT4, kernels.Exact, false}, {"int4_int8dot", kernels.INT4, kernels.Int8Dot, false},
		{"int4_fp32scales", kernels.INT4, kernels.Exact, true}, {"int4_int8dot_fp32scales", kernels.INT4, kernels.Int8Dot, true},
		{"q6k", q6K, kernels.Exact, false}, {"q6k_int8dot", q6K, kernels.Int8Dot, false},
		{"q5k", q5K, kernels.Exact, false}, {"q5k_int8dot", q5K, kernels.Int8Dot, false},
		{"mxfp4", kernels.MXFP4, kernels.Exact, false}, {"mxfp4_int8dot", kernels.MXFP4, kernels.Int8Dot, false}} {
		b.Run(c.name, func(b *testing.B) {
			// Each dtype quantized once, for its modes; made only when run.
			stored, ok := made[c.dt]
			if !ok {
				stored = make([][3]kernels.Matrix, E)
				for e := range stored {
					for p, v := range base[e] {
						rows, cols := I, H
						if p == 2 {
							rows, cols = H, I
						}
						var err error
						switch c.dt {
						case q6K, q5K:
							stored[e][p], err = kQuantLike(c.dt == q6K, v, rows, cols)
						case kernels.BF16:
							u := make([]uint16, len(v))
							for i, f := range v {
								u[i] = uint16(math.Float32bits(f) >> 16)
							}
							stored[e][p], err = kernels.NewHalf(kernels.BF16, rows, cols, u)
						default:
							stored[e][p], err = kernels.Quantize(c.dt, v, rows, cols)
						}
						if err != nil {
							b.Fatal(err)
						}
					}
				}
				made[c.dt] = stored
			}
			xs := make([]expert, E)
			var bytes int64
			for e := range xs {
				var m [3]kernels.Matrix
				for p, q := range stored[e] {
					var err error
					if c.flat {
						data, sc, off, g, _ := q.CodeData()
						switch q.DType {
						case kernels.UINT4:
							q, err = kernels.NewUINT4(q.Rows, q.Cols, g, data, sc, off)
						case kernels.INT8:
							q, err = kernels.NewINT8(q.Rows, q.Cols, g, unsafe.Slice((*int8)(unsafe.Pointer(unsafe.SliceData(data))), len(data)), nudged(sc), off)
						default:
							q, err = kernels.NewINT4(q.Rows, q.Cols, g, data, nudged(sc))
						}
						if err != nil {
							b.Fatal(err)
						}
					}
					if m[p], err = c.mode.Pack(q); err != nil {
						b.Fatal(err)
					}
				}
				xs[e] = expert{m[0], m[1], m[2]}
				if e < topK {
					bytes += m[0].Bytes() + m[1].Bytes() + m[2].Bytes()
				}
			}
			var sc kernels.Scratch
			groups := make([]kernels.FFNGroup, topK)
			outs := make([][]float32, topK)
			for i := range outs {
				outs[i] = make([]float32, H)
			}
			b.SetBytes(bytes)
			next := 0
			for b.Loop() {
				for g := range groups {
					x := xs[next%E]
					next++
					groups[g] = kernels.FFNGroup{Gate: x.gate, Up: x.up, Down: x.down, Rows: []int32{0}, Out: outs[g], Expert: next % E}
				}
				if err := kernels.GroupedFFN(context.Background(), 2, x, groups, &sc); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// q6K and q5K name, in BenchmarkDecodeExperts, INT8 matrices made by
// kQuantLike (not dtypes of their own).
const q6K, q5K = kernels.DType(250), kernels.DType(251)

// kQuantLike makes an INT8 matrix [rows, cols] of v with codes and
// factors of Q6_K's shape (six6 true: signed 6-bit codes in groups of 16,
// an int8 factor each, d a super-block of 256) or Q5_K's (unsigned 5-bit
// codes in groups of 32 with offsets, 6-bit factors sc and m, d and dmin
// a super-block; super-blocks narrower where the columns need). Its rounding is plain (not ggml's search for the best
// scales): for timing the 5- and 6-bit layouts.
func kQuantLike(six bool, v []float32, rows, cols int) (kernels.Matrix, error) {
	g, lo, hi := 32, 0.0, 31.0
	if six {
		g, lo, hi = 16, -32, 31
	}
	per := 256 / g // fewer where a row is not whole super-blocks of 256
	for cols/g%per != 0 {
		per /= 2
	}
	n := rows * cols / g
	scales, d, sc := make([]float32, n), make([]float32, n/per), make([]int8, n)
	var offs, dmin []float32
	var mins []int8
	if !six {
		offs, dmin, mins = make([]float32, n), make([]float32, n/per), make([]int8, n)
	}
	codes := make([]int8, rows*cols)
	for sb := range n / per {
		var amax float64
		for _, x := range v[sb*per*g:][:per*g] {
			amax = math.Max(amax, math.Abs(float64(x)))
		}
		d[sb] = float32(amax / 63 / 31)
		if !six {
			d[sb], dmin[sb] = float32(2*amax/63/31), float32(amax/63)
		}
		for k := range per {
			i := sb*per + k
			sc[i] = 63
			scales[i] = d[sb] * float32(sc[i])
			if !six {
				mins[i] = 63
				offs[i] = -(dmin[sb] * float32(mins[i]))
			}
			for j, x := range v[i*g:][:g] {
				o := 0.0
				if !six {
					o = float64(offs[i])
				}
				codes[i*g+j] = int8(max(lo, min(hi, math.RoundToEven((float64(x)-o)/float64(scales[i])))))
			}
		}
	}
	m, err := kernels.NewINT8(rows, cols, g, codes, scales, offs)
	if err != nil {
		return m, err
	}
	return kernels.WithSuperScales(m, per, d, dmin, sc, mins)
}

// nudged is each scale one ulp up: no longer an fp16 value, so held as fp32.
func nudged(sc []float32) []float32 {
	out := make([]float32, len(sc))
	for i, v := range sc {
		out[i] = math.Nextafter32(v, float32(math.Inf(1)))
	}
	return out
}
