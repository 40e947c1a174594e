package kernels

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/moex-project/moex/internal/half"
	"github.com/stretchr/testify/require"
)

// dot8Cases are the matrices of the int8-dot tests: UINT4 and INT8, with
// offsets and without, in groups of 32, 16 and 8; with K-quant factors;
// MXFP4; INT4 (Q4_0's) in groups of 32 and 8; INT8 codes of 5 and 6 bits.
func dot8Cases(rng *rand.Rand, rows, cols int) map[string]Matrix {
	out := map[string]Matrix{}
	for _, g := range []int{32, 16, 8} {
		for _, offsets := range []bool{false, true} {
			n := rows * cols / g
			scales, offs := make([]float32, n), []float32(nil)
			for i := range scales {
				scales[i] = float32((rng.Float64()*2 - 1) * 0.01)
			}
			if offsets {
				offs = make([]float32, n)
				for i := range offs {
					offs[i] = float32((rng.Float64()*2 - 1) * 0.05)
				}
			}
			nib := make([]uint8, rows*cols/2)
			for i := range nib {
				nib[i] = uint8(rng.IntN(256))
			}
			codes := make([]int8, rows*cols)
			for i := range codes {
				codes[i] = int8(rng.IntN(256) - 128)
			}
			u, err := NewUINT4(rows, cols, g, nib, scales, offs)
			if err != nil {
				panic(err)
			}
			q, err := NewINT8(rows, cols, g, codes, scales, offs)
			if err != nil {
				panic(err)
			}
			out[fmt.Sprintf("uint4 g%d offsets=%v", g, offsets)] = u
			out[fmt.Sprintf("int8 g%d offsets=%v", g, offsets)] = q
		}
	}
	// K-quant factors: scales d·sc, offsets −dmin·m, in super-blocks of
	// per groups (Q4_K, Q5_K, Q6_K's shapes where the columns allow).
	for _, c := range []struct {
		dt      DType
		g       int
		offsets bool
	}{{UINT4, 32, true}, {INT8, 32, true}, {INT8, 16, false}} {
		gc := cols / c.g
		per := 1
		for _, p := range []int{8, 4, 2} {
			if gc%p == 0 {
				per = p
				break
			}
		}
		n := rows * gc
		d, sc := make([]float32, n/per), make([]int8, n)
		var dmin []float32
		var mins []int8
		for i := range d {
			d[i] = float32(rng.Float64()*0.001 + 1e-4)
		}
		for i := range sc {
			sc[i] = int8(rng.IntN(128) - 64)
		}
		scales, offs := make([]float32, n), []float32(nil)
		for i := range scales {
			scales[i] = d[i/gc*(gc/per)+i%gc/per] * float32(sc[i])
		}
		if c.offsets {
			dmin, mins, offs = make([]float32, n/per), make([]int8, n), make([]float32, n)
			for i := range dmin {
				dmin[i] = float32(rng.Float64()*0.002 + 1e-4)
			}
			for i := range mins {
				mins[i] = int8(rng.IntN(64))
				offs[i] = -(dmin[i/gc*(gc/per)+i%gc/per] * float32(mins[i]))
			}
		}
		var m Matrix
		var err error
		if c.dt == UINT4 {
			nib := make([]uint8, rows*cols/2)
			for i := range nib {
				nib[i] = uint8(rng.IntN(256))
			}
			m, err = NewUINT4(rows, cols, c.g, nib, scales, offs)
		} else {
			codes := make([]int8, rows*cols)
			for i := range codes {
				codes[i] = int8(rng.IntN(64) - 32)
			}
			m, err = NewINT8(rows, cols, c.g, codes, scales, offs)
		}
		if err != nil {
			panic(err)
		}
		if m, err = WithSuperScales(m, per, d, dmin, sc, mins); err != nil {
			panic(err)
		}
		out[fmt.Sprintf("%v K g%d offsets=%v", c.dt, c.g, c.offsets)] = m
	}
	// MXFP4 (scales 2^-8 … 2^2).
	mx := make([]uint8, rows*cols/2)
	for i := range mx {
		mx[i] = uint8(rng.IntN(256))
	}
	e8 := make([]uint8, rows*cols/32)
	for i := range e8 {
		e8[i] = uint8(119 + rng.IntN(11))
	}
	m4, err := NewMXFP4(rows, cols, mx, e8)
	if err != nil {
		panic(err)
	}
	out["mxfp4"] = m4
	// INT4: nibbles the codes plus 8, signed scales (Q4_0's blocks).
	for _, g := range []int{32, 8} {
		nib := make([]uint8, rows*cols/2)
		for i := range nib {
			nib[i] = uint8(rng.IntN(256))
		}
		scales := make([]float32, rows*cols/g)
		for i := range scales {
			scales[i] = float32((rng.Float64()*2 - 1) * 0.01)
		}
		m, err := NewINT4(rows, cols, g, nib, scales)
		if err != nil {
			panic(err)
		}
		out[fmt.Sprintf("int4 g%d", g)] = m
	}
	// INT8 codes of 5 and 6 bits (GGUF's Q5_0, Q5_1, Q6_K without their
	// factors; Q5_K with them), which PackInt8Dot holds in that many bits.
	for _, c := range []struct {
		name    string
		g, lo   int
		n       int // codes in [lo, lo+n)
		offsets bool
	}{{"q5_0", 32, -16, 32, false}, {"q5_1", 32, 0, 32, true}, {"q6", 16, -32, 64, false}, {"q5_k", 32, 0, 32, true}} {
		n := rows * cols / c.g
		scales, offs := make([]float32, n), []float32(nil)
		for i := range scales {
			scales[i] = float32((rng.Float64()*2 - 1) * 0.01)
		}
		if c.offsets {
			offs = make([]float32, n)
			for i := range offs {
				offs[i] = float32((rng.Float64()*2 - 1) * 0.05)
			}
		}
		codes := make([]int8, rows*cols)
		for i := range codes {
			codes[i] = int8(c.lo + rng.IntN(c.n))
		}
		if c.name == "q5_k" { // scales d·sc and offsets −dmin·m in super-blocks of 8 (or fewer) groups
			per := 1
			for gc := cols / c.g; per < 8 && gc%(2*per) == 0; per *= 2 {
			}
			d, dmin, sc, mins := make([]float32, n/per), make([]float32, n/per), make([]int8, n), make([]int8, n)
			for i := range d {
				d[i], dmin[i] = float32(rng.Float64()*0.001+1e-4), float32(rng.Float64()*0.002+1e-4)
			}
			gc := cols / c.g
			for i := range sc {
				sc[i], mins[i] = int8(rng.IntN(64)), int8(rng.IntN(64))
				sb := i/gc*(gc/per) + i%gc/per
				scales[i], offs[i] = d[sb]*float32(sc[i]), -(dmin[sb] * float32(mins[i]))
			}
			m, err := NewINT8(rows, cols, c.g, codes, scales, offs)
			if err != nil {
				panic(err)
			}
			if out[c.name], err = WithSuperScales(m, per, d, dmin, sc, mins); err != nil {
				panic(err)
			}
			continue
		}
		m, err := NewINT8(rows, cols, c.g, codes, scales, offs)
		if err != nil {
			panic(err)
		}
		out[fmt.Sprintf("%s g%d", c.name, c.g)] = m
	}
	// The types GGUF stores with fp16 scales (Q8_0, Q4_0, Q4_1, Q5_0,
	// Q5_1), their scales and offsets fp16 values: PackInt8Dot holds them
	// as fp16.
	for _, name := range []string{"int8 g32 offsets=false", "int8 g8 offsets=false", "int4 g32", "uint4 g32 offsets=true", "q5_0 g32", "q5_1 g32"} {
		out[name+" f16"] = halfScaled(out[name])
	}
	return out
}

// halfScaled returns m, an INT8, INT4 or UINT4 matrix, with each scale
// and offset rounded to fp16, every fifth scale and seventh offset made a
// subnormal fp16 value instead (signed, k·2^−24).
func halfScaled(m Matrix) Matrix {
	data, scales, offsets, g, ok := m.CodeData()
	if !ok {
		panic(m.DType)
	}
	round := func(v []float32, every int) []float32 {
		if v == nil {
			return nil
		}
		r := make([]float32, len(v))
		for i, f := range v {
			r[i] = half.F16ToF32(half.F32ToF16(f))
			if i%every == 0 {
				r[i] = float32(math.Ldexp(float64(i%1023+1), -24)) * float32(1-2*(i/every%2))
			}
		}
		return r
	}
	scales, offsets = round(scales, 5), round(offsets, 7)
	var err error
	switch m.DType {
	case INT8:
		m, err = NewINT8(m.Rows, m.Cols, g, bytesAsInt8(data), scales, offsets)
	case INT4:
		m, err = NewINT4(m.Rows, m.Cols, g, data, scales)
	default:
		m, err = NewUINT4(m.Rows, m.Cols, g, data, scales, offsets)
	}
	if err != nil {
		panic(err)
	}
	return m
}

// dot8Held is how PackInt8Dot should hold each case of dot8Cases (by its
// name's start): the high bits' planes and the bias; the rest a byte or
// a nibble a code.
var dot8Held = map[string][2]uint8{"q5_0": {1, 16}, "q5_1": {1, 0}, "q5_k": {1, 0}, "q6": {2, 32}, "INT8 K g16 offsets=false": {2, 32}}

// dot8Reference is the int8-dot mode written again from its definition
// (see Numerics): row x against row n of m.
func dot8Reference(x []float32, m Matrix, n int) float32 {
	g := m.q.cols
	var acc float32
	for b := 0; b < len(x); b += 32 {
		amax := 0.0
		for _, v := range x[b : b+32] {
			amax = math.Max(amax, math.Abs(float64(v)))
		}
		d := float32(amax) / 127
		inv := float32(0)
		if d != 0 {
			inv = 1 / d
		}
		for g0 := b; g0 < b+32; g0 += g {
			var I, S int64
			for k := g0; k < g0+g; k++ {
				qv := int64(math.RoundToEven(float64(x[k] * inv)))
				var c int64
				switch m.DType {
				case MXFP4: // twice the e2m1 value
					c = int64(2 * e2m1[m.nibble(n, k)])
				case INT4: // the nibble less 8
					c = int64(m.nibble(n, k)) - 8
				default:
					c = int64(m.code(n, k))
				}
				I += qv * c
				S += qv
			}
			gi := n*m.q.gridCols + g0/g
			s := m.q.grid[gi]
			if m.DType == MXFP4 {
				s /= 2 // the codes' scale
			}
			acc = fma32(float32(I), s*d, acc)
			if m.q.off != nil {
				acc = fma32(m.q.off[gi], d*float32(S), acc)
			}
		}
	}
	return acc
}

// TestInt8Dot: on every implementation, PackInt8Dot keeps the weights'
// values; GateUp and Down in the mode give the reference's bits (the
// mode's definition written again), a row's bits not depending on the
// rows beside it; and the mode's error against float64 arithmetic on the
// weights' values stays within what rounding the activations to int8
// makes: here 1 % of the products' magnitude.
func TestInt8Dot(t *testing.T) {
	for _, impl := range Implementations() {
		t.Run(impl, func(t *testing.T) {
			restore, err := Use(impl)
			require.NoError(t, err)
			defer restore()
			for _, s := range []struct{ M, N, K int }{{1, 37, 256}, {3, 64, 384}, {7, 20, 128}, {5, 16, 2048}, {9, 50, 96}, {2, 100, 256}} {
				rng := rand.New(rand.NewPCG(uint64(s.M), uint64(s.K)))
				cases := dot8Cases(rng, s.N, s.K)
				x := make([]float32, s.M*s.K)
				for i := range x {
					x[i] = float32(rng.Float64()*2 - 1)
				}
				x[3] = 0 // a zero, and below a block of zeros
				clear(x[len(x)-32:])
				idx := make([]int32, s.M)
				for i := range idx {
					idx[i] = int32(i)
				}
				for name, m := range cases {
					d, err := PackInt8Dot(m)
					require.NoError(t, err, name)
					// From the exact mode's packed layout (a loaded layer's): the same bytes.
					dp, err := PackInt8Dot(Pack(m))
					require.NoError(t, err, name)
					require.Equal(t, d.u8, dp.u8, name)
					require.Equal(t, d.q.e8, dp.q.e8, name)
					require.False(t, dp.q.e8Exact, "%s: the int8-dot mode's MXFP4 scales, half the block's", name)
					require.Equal(t, Int8Dot, d.Numerics())
					require.Equal(t, Exact, m.Numerics())
					var held [2]uint8
					for prefix, h := range dot8Held {
						if strings.HasPrefix(name, prefix) {
							held = h
						}
					}
					require.Equal(t, held, [2]uint8{d.planes, d.bias}, "%s: planes and bias", name)
					require.Equal(t, strings.HasSuffix(name, " f16"), d.q.h16 != nil, "%s: fp16 scales", name)
					bits := int64(m.DType.Bits())
					if held[0] > 0 {
						bits = 4 + int64(held[0])
					}
					require.Equal(t, int64(s.N)*int64(s.K)*bits/8, d.Bytes()-int64(d.ScaleBytes()), name)
					// What the packed matrices hold: the codes, and the scales in
					// one layout (the K-quant factors as the int8-dot kernels read
					// them, and only so), no fp32 grid beside them.
					panels := int64((s.N + PanelWidth - 1) / PanelWidth * PanelWidth)
					codes, groups := panels*int64(s.K)*bits/8, int64(s.N*s.K/m.q.cols)
					perGroup := int64(4) // a scale, and with offsets an offset, fp32
					if m.HasOffsets() {
						perGroup = 8
					}
					switch {
					case m.q.super != nil && d.q.kmeta != nil:
						require.Equal(t, codes+int64(len(d.q.kmeta)), d.HeldBytes(), "%s: held", name)
					case strings.HasSuffix(name, " f16"): // fp16 scales (and offsets) in the int8-dot layout
						require.Nil(t, d.q.panel, name)
						require.Nil(t, d.q.offPanel, name)
						require.Equal(t, m.HasOffsets(), d.q.offH16 != nil, name)
						runs := ((s.N+PanelWidth-1)/PanelWidth + dot8Run - 1) / dot8Run
						require.Equal(t, runs*dot8Run*PanelWidth*s.K/m.q.cols, len(d.q.h16), name)
						require.Equal(t, codes+perGroup/2*int64(len(d.q.h16)), d.HeldBytes(), "%s: held", name)
						require.Equal(t, perGroup/2*int64(len(d.q.h16)), int64(d.ScaleBytes()), name)
					case m.DType == MXFP4: // the E8M0 exponents, a byte a block (in runs of dot8Run panels)
						require.Nil(t, d.q.panel, name)
						runs := ((s.N+PanelWidth-1)/PanelWidth + dot8Run - 1) / dot8Run
						require.Equal(t, runs*dot8Run*PanelWidth*s.K/32, len(d.q.e8), name)
						require.Equal(t, codes+int64(len(d.q.e8)), d.HeldBytes(), "%s: held", name)
					default:
						require.Equal(t, codes+perGroup*int64(len(d.q.panel))+m.HeldBytes()-int64(len(m.u8))-perGroup*groups, d.HeldBytes(), "%s: held", name)
					}
					ep := Pack(m)
					require.Nil(t, ep.q.grid, name)
					require.Equal(t, held, [2]uint8{ep.planes, ep.bias}, "%s: planes and bias, packed for the exact mode", name)
					if m.q.super != nil && d.q.kmeta != nil { // the factors only, as for the int8-dot mode
						require.Nil(t, ep.q.panel, name)
						require.Equal(t, d.q.kmeta, ep.q.kmeta, name)
						require.Equal(t, panels*int64(s.K)*bits/8+int64(len(ep.q.kmeta)), ep.HeldBytes(), "%s: held, packed for the exact mode", name)
					} else if m.DType == MXFP4 { // the E8M0 exponents, as for the int8-dot mode (see Pack)
						require.Nil(t, ep.q.panel, name)
						require.True(t, ep.q.e8Exact, name)
						require.Equal(t, d.q.e8, ep.q.e8, name)
						require.Equal(t, panels*int64(s.K)*bits/8+int64(len(ep.q.e8)), ep.HeldBytes(), "%s: held, packed for the exact mode", name)
						require.Equal(t, len(ep.q.e8), ep.ScaleBytes(), name)
					} else {
						// fp16 scales (and offsets) as fp16 (see Pack), others as fp32.
						require.Equal(t, strings.HasSuffix(name, " f16"), ep.q.h16 != nil && ep.q.panel == nil, "%s: fp16 scales, packed for the exact mode", name)
						require.Equal(t, panels*int64(s.K)*bits/8+4*int64(len(ep.q.panel)+len(ep.q.offPanel))+2*int64(len(ep.q.h16)+len(ep.q.offH16))+m.HeldBytes()-int64(len(m.u8))-perGroup*groups,
							ep.HeldBytes(), "%s: held, packed for the exact mode", name)
					}
					// The values as they were given, from what the packed
					// matrices hold.
					_, ws, wo, _, _ := m.CodeData()
					for _, pm := range []Matrix{d, Pack(m)} {
						_, gs, gotO, _, ok := pm.CodeData()
						require.True(t, ok)
						require.Equal(t, ws, gs, name)
						require.Equal(t, wo, gotO, name)
						require.Equal(t, wo, pm.Offsets(), name)
						require.Equal(t, wo != nil, pm.HasOffsets(), name)
					}
					for n := 0; n < s.N; n += 7 {
						for k := 0; k < s.K; k += 5 {
							require.Equal(t, m.At(n, k), d.At(n, k), "%s [%d, %d]", name, n, k)
						}
					}
					o := make([]float32, s.M*s.N)
					Down(o, x, d, nil, 0, s.N)
					h := make([]float32, s.M*s.N)
					GateUp(h, x, idx, d, d, 0, s.N)
					w := make([]float32, s.K)
					for n := 0; n < s.N; n++ {
						m.RowF32(n, w)
						for r := 0; r < s.M; r++ {
							xr := x[r*s.K:][:s.K]
							want := dot8Reference(xr, m, n)
							require.Equal(t, math.Float32bits(want), math.Float32bits(o[r*s.N+n]), "%s M=%d K=%d row %d col %d", name, s.M, s.K, r, n)
							require.Equal(t, math.Float32bits(SwiGLU(want, want)), math.Float32bits(h[r*s.N+n]), "%s gate/up", name)
							var exact, mag float64
							for k, v := range xr {
								exact += float64(v) * float64(w[k])
								mag += math.Abs(float64(v) * float64(w[k]))
							}
							require.InDelta(t, exact, float64(want), 0.01*mag+1e-30, "%s error", name)
						}
					}
					// Through the grouped GEMM (its rows prepared once a call): the same bits.
					g := make([]float32, s.M*s.N)
					require.NoError(t, GroupedGEMM(context.Background(), 2, x, []GEMMGroup{{B: d, Rows: idx, Out: g}}))
					require.Equal(t, o, g, "grouped")
					one := make([]float32, s.N)
					Down(one, x[(s.M-1)*s.K:], d, nil, 0, s.N)
					require.Equal(t, o[(s.M-1)*s.N:], one, "%s: one row alone", name)
					// Columns from inside a run of panels (dot8Run, whose scales
					// lie side by side) to the end, over more than one run: the
					// same bits.
					if s.N > 2*PanelWidth {
						n0 := PanelWidth + 3
						part := make([]float32, s.N)
						Down(part, x[(s.M-1)*s.K:], d, nil, n0, s.N)
						require.Equal(t, o[(s.M-1)*s.N+n0:], part[n0:], "%s: columns from %d", name, n0)
					}
				}
			}
		})
	}
}

// TestQuantizeRow: every implementation's activation records are the Go
// loop's bytes (the mode's definition), for groups of 8, 16 and 32, on
// blocks of zeros, of one value, with ±0 and subnormals, with values
// whose scaled code is a tie (k + ½ exactly, to even), at ±127 and at
// fp32's largest finite magnitudes, with a NaN and an infinity, and
// random ones.
func TestQuantizeRow(t *testing.T) {
	const K = 32 * 12
	x := make([]float32, K)
	rng := rand.New(rand.NewPCG(4, 4))
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	clear(x[32:64])     // zeros
	for i := range 32 { // one value; ±0 and subnormals
		x[64+i] = 3
		x[96+i] = [4]float32{0, float32(math.Copysign(0, -1)), math.SmallestNonzeroFloat32, -1e-40}[i%4]
	}
	for i := range 32 { // amax 127: d = 1, q = x, ties k + ½ to even
		x[128+i] = float32(i) - 15.5
	}
	x[128] = 127
	for i := range 32 {
		x[160+i] = math.MaxFloat32 * float32(1-2*(i%2)) / float32(1+i%3) // near fp32's largest
		x[192+i] = float32(i%5-2) * 1e-30
		x[224+i] = float32(i) - 3
		x[256+i] = float32(i%3-1) * 1e-39 // 1/d past fp32's range: 0·∞ and ±∞
	}
	x[230] = float32(math.NaN())   // a NaN: d NaN, every code 0
	x[300] = float32(math.Inf(-1)) // an infinity alone in its block
	for _, g := range []int{8, 16, 32} {
		want := make([]byte, K/g*(g+16))
		restore, err := Use("generic")
		require.NoError(t, err)
		quantizeRow(want, x, g)
		restore()
		for _, impl := range Implementations() {
			restore, err := Use(impl)
			require.NoError(t, err)
			got := make([]byte, len(want))
			for i := range got {
				got[i] = 0xAA // every byte written
			}
			quantizeRow(got, x, g)
			restore()
			// A NaN's payload aside: its d and d·S NaN in both.
			for r := 0; r < len(got); r += g + 16 {
				for _, at := range []int{r + g, r + g + 4} {
					w, o := math.Float32frombits(binary.LittleEndian.Uint32(want[at:])), math.Float32frombits(binary.LittleEndian.Uint32(got[at:]))
					if w != w && o != o {
						copy(got[at:at+4], want[at:at+4])
					}
				}
			}
			require.Equal(t, want, got, "%s g%d", impl, g)
		}
	}
}

// BenchmarkQuantizeRow times quantizing one DeepSeek-V2-Lite hidden row
// (2048 activations, groups of 32) for the int8-dot mode, on each
// implementation:
//
//	go test -run '^$' -bench QuantizeRow ./kernels
func BenchmarkQuantizeRow(b *testing.B) {
	const K, g = 2048, 32
	rng := rand.New(rand.NewPCG(5, 5))
	x := make([]float32, K)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	out := make([]byte, K/g*(g+16))
	for _, impl := range Implementations() {
		b.Run(impl, func(b *testing.B) {
			restore, err := Use(impl)
			require.NoError(b, err)
			defer restore()
			b.SetBytes(4 * K)
			for b.Loop() {
				quantizeRow(out, x, g)
			}
		})
	}
}

// TestInt8DotRefused: the mode is taken only for the weights it is
// defined on, with an error naming why otherwise.
func TestInt8DotRefused(t *testing.T) {
	f, err := NewF32(2, 32, make([]float32, 64))
	require.NoError(t, err)
	_, err = PackInt8Dot(f)
	require.ErrorContains(t, err, "int8dot numerics need UINT4, INT8, MXFP4 or INT4 weights, have F32")
	i4, err := NewINT4(2, 256, 128, make([]uint8, 256), []float32{1, 1, 1, 1}) // compressed-tensors' groups of 128
	require.NoError(t, err)
	_, err = PackInt8Dot(i4)
	require.ErrorContains(t, err, "need groups of 8, 16 or 32 and whole blocks of 32 columns, have groups of 128 over 256")
	q, err := NewINT8(2, 64, 64, make([]int8, 128), []float32{1, 1}, nil)
	require.NoError(t, err)
	_, err = PackInt8Dot(q)
	require.ErrorContains(t, err, "need groups of 8, 16 or 32 and whole blocks of 32 columns, have groups of 64 over 64")
	u, err := NewUINT4(1, 64, 32, make([]uint8, 32), []float32{0.5, 1}, nil)
	require.NoError(t, err)
	_, err = WithSuperScales(u, 2, []float32{0.5}, nil, []int8{1, 3}, nil)
	require.ErrorContains(t, err, "group 1's scale 1 is not 0.5·3")
	_, err = WithSuperScales(u, 2, []float32{0.5}, []float32{1}, []int8{1, 2}, []int8{0, 0})
	require.ErrorContains(t, err, "offsets false")
	_, err = ParseNumerics("fast")
	require.ErrorContains(t, err, `numerics "fast": want exact, int8dot or bf16dot`)
}

// TestInt8DotExtremes: the largest codes against the largest activations
// (±127 in every step of a group of 32), where the AVX2 kernels' int16
// pair sums are nearest their bounds (UINT4: 15·127 a product, a group's
// 30480 summed in int16, and INT4's the same nibbles less 8·S at the end;
// INT8: −128·−127 = 16256, a pair 32512; 5- and
// 6-bit codes: four products 32004): the reference's bits on every
// implementation, with offsets and without.
func TestInt8DotExtremes(t *testing.T) {
	const rows, cols = 16, 96
	x := make([]float32, 3*cols)
	for k := range cols {
		x[k], x[cols+k] = 1, -1 // q = 127, −127
		x[2*cols+k] = float32(1 - 2*(k%2))
	}
	nib := make([]uint8, rows*cols/2)
	i8 := make([]int8, rows*cols)
	for r := range rows {
		for k := range cols {
			var u uint8 = 15
			var c int8 = -128
			switch r % 4 {
			case 1:
				c = 127
			case 2:
				u, c = uint8(15*(k%2)), int8(-128+255*(k%2))
			case 3:
				u, c = uint8(r%16), int8(r*9-70)
			}
			nib[(r*cols+k)/2] |= u << (4 * ((r*cols + k) % 2))
			i8[r*cols+k] = c
		}
	}
	scales, offs := make([]float32, rows*cols/32), make([]float32, rows*cols/32)
	for i := range scales {
		scales[i], offs[i] = 0.25+float32(i%5)/16, -float32(i%3)/8
	}
	// Every scale and offset above is an fp16 value: the kinds on fp16
	// scales run where there are some; with one scale that is not, the
	// fp32 ones.
	scales32 := slices.Clone(scales)
	scales32[0] += 0x1p-20
	var ms []Matrix
	for _, sc := range [][]float32{scales, scales32} {
		for _, o := range [][]float32{nil, offs} {
			u, err := NewUINT4(rows, cols, 32, nib, sc, o)
			require.NoError(t, err)
			c, err := NewINT8(rows, cols, 32, i8, sc, o)
			require.NoError(t, err)
			ms = append(ms, u, c)
		}
		i4, err := NewINT4(rows, cols, 32, nib, sc) // the nibbles as INT4's: codes −8 and 7, stored plus 8
		require.NoError(t, err)
		ms = append(ms, i4)
	}
	// Codes of 5 and 6 bits (see PackInt8Dot) at their ends: stored as
	// 0 or the largest (31, 63), the AVX2 kernels' four products a lane
	// at most 4·63·127 = 32004 in int16.
	for _, v := range []struct {
		lo, hi  int8
		offsets []float32
		planes  uint8
	}{{-16, 15, nil, 1}, {0, 31, offs, 1}, {-32, 31, nil, 2}} {
		codes := make([]int8, rows*cols)
		for r := range rows {
			for k := range cols {
				c := v.hi
				switch r % 4 {
				case 1:
					c = v.lo
				case 2:
					c = [2]int8{v.lo, v.hi}[k%2]
				case 3:
					c = v.lo + int8((r*7+k)%int(v.hi-v.lo+1))
				}
				codes[r*cols+k] = c
			}
		}
		for _, sc := range [][]float32{scales, scales32} {
			c, err := NewINT8(rows, cols, 32, codes, sc, v.offsets)
			require.NoError(t, err)
			d, err := PackInt8Dot(c)
			require.NoError(t, err)
			require.Equal(t, v.planes, d.planes)
			ms = append(ms, c)
		}
	}
	for _, impl := range Implementations() {
		restore, err := Use(impl)
		require.NoError(t, err)
		for _, m := range ms {
			d, err := PackInt8Dot(m)
			require.NoError(t, err)
			require.Equal(t, m.q.grid[0] == scales[0] && hasHalfKind(d), d.q.h16 != nil, "%v offsets=%v: fp16 scales", m.DType, m.q.off != nil)
			out := make([]float32, 3*rows)
			Down(out, x, d, nil, 0, rows)
			for r := range 3 {
				for n := range rows {
					want := dot8Reference(x[r*cols:][:cols], m, n)
					require.Equal(t, math.Float32bits(want), math.Float32bits(out[r*rows+n]), "%s %v offsets=%v row %d col %d", impl, m.DType, m.q.off != nil, r, n)
				}
			}
		}
		restore()
	}
}

// BenchmarkPackInt8Dot times repacking one DeepSeek-V2-Lite gate matrix
// (packed for the exact mode, as a loaded layer holds it) for the
// int8-dot mode: what Layer.SetNumerics pays per matrix.
func BenchmarkPackInt8Dot(b *testing.B) {
	const rows, cols = 1408, 2048
	rng := rand.New(rand.NewPCG(1, 2))
	v := make([]float32, rows*cols)
	for i := range v {
		v[i] = rng.Float32() - 0.5
	}
	for _, dt := range []DType{UINT4, INT8} {
		q, err := Quantize(dt, v, rows, cols)
		require.NoError(b, err)
		q = Pack(q)
		b.Run(dt.String(), func(b *testing.B) {
			b.SetBytes(int64(rows * cols))
			for b.Loop() {
				if _, err := PackInt8Dot(q); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestInt8DotMXFP4Exponents: the int8-dot mode holds MXFP4's scales as
// their E8M0 bytes and every implementation makes each of them, 0 (the
// subnormal 2^−127) to 254 (2^127), into the value the mode defines:
// the reference's bits, with activations small enough that no product
// overflows.
func TestInt8DotMXFP4Exponents(t *testing.T) {
	const N, blocks = 20, 255
	const K = 32 * blocks
	rng := rand.New(rand.NewPCG(9, 9))
	m := exponentsMXFP4(t, rng, N, blocks)
	d, err := PackInt8Dot(m)
	require.NoError(t, err)
	require.Nil(t, d.q.panel)
	x := make([]float32, 2*K)
	for i := range x {
		x[i] = float32((rng.Float64()*2 - 1) * 0x1p-24)
	}
	for _, impl := range Implementations() {
		restore, err := Use(impl)
		require.NoError(t, err)
		o := make([]float32, 2*N)
		Down(o, x, d, nil, 0, N)
		restore()
		for r := range 2 {
			for n := range N {
				want := dot8Reference(x[r*K:][:K], m, n)
				require.False(t, math.IsInf(float64(want), 0) || math.IsNaN(float64(want)), "%d %d", r, n)
				require.Equal(t, math.Float32bits(want), math.Float32bits(o[r*N+n]), "%s row %d col %d", impl, r, n)
			}
		}
	}
}

// exponentsMXFP4 is an MXFP4 matrix [n, 32·blocks] of random nibbles
// with every E8M0 exponent, 0 to 254, in every row (blocks of them,
// rotated row by row); from 2^126 on, e2m1 values within ±1.5, so that
// every weight is finite (6·2^126 is not).
func exponentsMXFP4(t *testing.T, rng *rand.Rand, n, blocks int) Matrix {
	nib := make([]uint8, n*blocks*16)
	for i := range nib {
		nib[i] = uint8(rng.IntN(256))
	}
	e8 := make([]uint8, n*blocks)
	for i := range e8 {
		e8[i] = uint8((i + i/blocks) % 255)
		if e8[i] >= 253 {
			for j := range 16 {
				nib[i*16+j] &= 0xbb
			}
		}
	}
	m, err := NewMXFP4(n, 32*blocks, nib, e8)
	require.NoError(t, err)
	return m
}

// TestInt8DotMXFP4BadScale: an MXFP4 scale that is not an E8M0 power of
// two (none of the constructors makes one) is an error that names it, not
// a wrong exponent.
func TestInt8DotMXFP4BadScale(t *testing.T) {
	m, err := NewMXFP4(16, 32, make([]uint8, 16*16), make([]uint8, 16))
	require.NoError(t, err)
	m.q.grid[3] = 3
	_, err = PackInt8Dot(m)
	require.ErrorContains(t, err, "mxfp4 scale 3 is not an E8M0 power of two")
	// A real block's zero scale (once taken for a padding row's and
	// encoded as 2^−128): named too.
	m.q.grid[3] = 0
	_, err = PackInt8Dot(m)
	require.ErrorContains(t, err, "mxfp4 scale 0 is not an E8M0 power of two")
}

// TestExactMXFP4Exponents: packed for the exact mode, MXFP4 keeps its
// scales as the file's E8M0 bytes (4.25 bits a weight), and every
// implementation (each SIMD one also with the widening's Go loop instead
// of its kernel, which is checked alone too) makes each exponent, 0 (the
// subnormal 2^−127) to 254 (2^127), into its scale: each of a call's
// scales (kscales, from panels inside and across runs, from blocks past
// the first), and the fp32 kernels' bits on the dequantized weights, in
// registers (2 rows) and widened (40), over k blocks of the machine's
// size, of one block and of a few, from the first column and from inside
// the second panel. A scale that is no E8M0 power of two stays fp32.
func TestExactMXFP4Exponents(t *testing.T) {
	const N, blocks = 150, 255 // 10 panels: three runs of dot8Run, the last short
	const K = 32 * blocks
	rng := rand.New(rand.NewPCG(9, 10))
	m := exponentsMXFP4(t, rng, N, blocks)
	p := Pack(m)
	require.Nil(t, p.q.panel)
	require.True(t, p.q.e8Exact)
	runs := ((N+PanelWidth-1)/PanelWidth + dot8Run - 1) / dot8Run
	require.Equal(t, runs*dot8Run*PanelWidth*blocks, p.ScaleBytes(), "a byte a block")
	w := make([]float32, N*K)
	for n := range N {
		m.RowF32(n, w[n*K:][:K])
		for _, v := range w[n*K:][:K] {
			require.False(t, math.IsInf(float64(v), 0), "row %d", n)
		}
		got := make([]float32, K)
		p.RowF32(n, got)
		require.Equal(t, w[n*K:][:K], got, "row %d through the exponents", n)
	}
	f, err := NewF32(N, K, w)
	require.NoError(t, err)
	pf := Pack(f)
	widenings(t, func(s *simd) bool { return s.e8 != nil }, func(s *simd) { s.e8 = nil }, func(t *testing.T) {
		if active != nil && active.e8 != nil {
			// The kernel alone: every exponent, two runs 272 bytes
			// apart into runs 1152 apart (as a call's groups lie).
			src := make([]uint8, 2*272)
			for i := range src {
				src[i] = uint8((i * 7) % 255)
			}
			dst := make([]float32, 2*288)
			active.e8(&dst[0], &src[0], 2, 256, 272, 4*288)
			for r := range 2 {
				for i := range 256 {
					require.Equal(t, math.Float32bits(e8Scale(src[r*272+i])), math.Float32bits(dst[r*288+i]), "E=%d", src[r*272+i])
				}
				for _, v := range dst[r*288+256 : (r+1)*288] {
					require.Zero(t, v, "written past a run")
				}
			}
		}
		if active != nil {
			// A call's scales, every one: from panels inside and
			// across runs, from blocks past the first.
			var sc outerScratch
			for _, c := range [][4]int{{0, 4, 0, 255}, {1, 4, 7, 30}, {3, 2, 100, 155}, {5, 4, 254, 1}, {8, 2, 64, 64}, {9, 1, 0, 255}} {
				pi, np, b0, groups := c[0], c[1], c[2], c[3]
				ss := 4 * PanelWidth * np
				got, off := active.kscales(&sc, p, pi, np, b0, groups, ss)
				require.Nil(t, off)
				for j := range min(np, p.q.panels-pi) {
					for r := range PanelWidth {
						row := (pi+j)*PanelWidth + r
						if row >= N {
							continue
						}
						for g := range groups {
							want := m.q.scale(row*blocks + b0 + g)
							require.Equal(t, math.Float32bits(want), math.Float32bits(got[g*ss/4+PanelWidth*j+r]), "panel %d row %d block %d", pi+j, r, b0+g)
						}
					}
				}
			}
		}
		for _, M := range []int{2, 40} {
			x := make([]float32, M*K)
			for i := range x {
				x[i] = float32((rng.Float64()*2 - 1) * 0x1p-24)
			}
			got, want := make([]float32, M*N), make([]float32, M*N)
			Down(got, x, p, nil, 0, N)
			Down(want, x, pf, nil, 0, N)
			for i, v := range want {
				require.False(t, math.IsNaN(float64(v)) || math.IsInf(float64(v), 0), "M=%d output %d", M, i)
			}
			require.Equal(t, want, got, "M=%d", M)
			part := make([]float32, M*N)
			Down(part, x, p, nil, 21, N)
			for r := range M {
				require.Equal(t, want[r*N+21:(r+1)*N], part[r*N+21:(r+1)*N], "M=%d from column 21", M)
			}
		}
	})
	m.q.grid[3] = 3
	p = Pack(m)
	require.Nil(t, p.q.e8)
	require.NotNil(t, p.q.panel, "fp32 scales where one is no E8M0 power of two")
	m.q.grid[3] = 0
	p = Pack(m)
	require.Nil(t, p.q.e8)
	require.NotNil(t, p.q.panel, "fp32 scales where one is zero")
}

// widenings runs f in the settings of the exact mode's scale widening:
// over k blocks of the machine's size, of one scale block and of a few
// (120 bytes: 3 groups of 32, 6 of 16, 15 of 8), on every implementation,
// and on each SIMD one that has the widening kernel (has) also with the
// widening's Go loop instead (drop takes the kernel away).
func widenings(t *testing.T, has func(*simd) bool, drop func(*simd), f func(t *testing.T)) {
	for _, kBytes := range []int{outerKBytes, 1, 120} {
		defer func(b int) { outerKBytes = b }(outerKBytes)
		outerKBytes = kBytes
		for _, impl := range Implementations() {
			for _, goLoop := range []bool{false, true} {
				t.Run(fmt.Sprintf("kbytes=%d/%s/goLoop=%v", kBytes, impl, goLoop), func(t *testing.T) {
					restore, err := Use(impl)
					require.NoError(t, err)
					defer restore()
					if goLoop {
						if active == nil || !has(active) {
							t.Skip("no widening kernel")
						}
						s := *active
						drop(&s)
						prev := active
						active = &s
						defer func() { active = prev }()
					}
					f(t)
				})
			}
		}
	}
}

// TestHalfScalesExact: matrices whose scales (and offsets) are fp16 values
// (GGUF's Q8_0, Q4_0, Q4_1, Q5_0, Q5_1; subnormals among them), packed for
// the exact mode, hold them as fp16 (Pack), and their products are the
// fp32 kernels' bits on the dequantized weights, on every implementation
// (and on each SIMD one with the widening's Go loop instead of its
// kernel): in registers (a few rows) and widened (many), over k blocks of
// the machine's size, of one group and of a few, over several panel
// groups, and from a column inside the second panel.
func TestHalfScalesExact(t *testing.T) {
	const N, K = 150, 1024
	rng := rand.New(rand.NewPCG(11, 12))
	cases := dot8Cases(rng, N, K)
	widenings(t, func(s *simd) bool { return s.half != nil }, func(s *simd) { s.half = nil }, func(t *testing.T) {
		for name, m := range cases {
			if !strings.HasSuffix(name, " f16") {
				continue
			}
			p := Pack(m)
			require.NotNil(t, p.q.h16, name)
			require.Nil(t, p.q.panel, name)
			w := make([]float32, N*K)
			for n := range N {
				m.RowF32(n, w[n*K:][:K])
			}
			f, err := NewF32(N, K, w)
			require.NoError(t, err)
			pf := Pack(f)
			for _, M := range []int{5, 40} {
				x := make([]float32, M*K)
				for i := range x {
					x[i] = float32(rng.Float64()*2 - 1)
				}
				got, want := make([]float32, M*N), make([]float32, M*N)
				Down(got, x, p, nil, 0, N)
				Down(want, x, pf, nil, 0, N)
				require.Equal(t, want, got, "%s M=%d", name, M)
				// From inside the second panel: calls whose panels cross
				// runs of dot8Run.
				part := make([]float32, M*N)
				Down(part, x, p, nil, 21, N)
				for r := range M {
					require.Equal(t, want[r*N+21:(r+1)*N], part[r*N+21:(r+1)*N], "%s M=%d from column 21", name, M)
				}
			}
		}
	})
}

// TestInt8DotOnePanel: a decode call over INT8 codes a byte each, whose
// kernels take one panel at a time (dot8OnePanel), gives the bits of the
// same call with the panels side by side, for every matrix of the int8-dot
// tests, 1 to 5 rows (decode and past it) and columns not whole panels.
func TestInt8DotOnePanel(t *testing.T) {
	if active == nil {
		t.Skip("no SIMD kernels: one path")
	}
	rng := rand.New(rand.NewPCG(17, 4))
	const N, K = 83, 128
	cases := dot8Cases(rng, N, K)
	ran := 0
	for name, m := range cases {
		p, err := PackInt8Dot(m)
		require.NoError(t, err, name)
		if p.dot8UnitBytes() == 128 {
			ran++
		}
		for M := 1; M <= 5; M++ {
			a := make([]float32, M*K)
			for i := range a {
				a[i] = 2*rng.Float32() - 1
			}
			rows := make([]int32, M)
			for r := range rows {
				rows[r] = int32(r)
			}
			var out [2][]float32
			for i, one := range []bool{true, false} {
				dot8OnePanel = one
				out[i] = make([]float32, M*N)
				require.NoError(t, GroupedGEMM(context.Background(), 2, a, []GEMMGroup{{B: p, Rows: rows, Out: out[i]}}))
			}
			dot8OnePanel = true
			for j := range out[0] {
				require.Equal(t, math.Float32bits(out[1][j]), math.Float32bits(out[0][j]), "%s, %d rows: output %d", name, M, j)
			}
		}
	}
	require.NotZero(t, ran, "no INT8 matrix a byte a code among the cases")
}
