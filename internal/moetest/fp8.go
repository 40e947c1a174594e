package moetest

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/moex-project/moex/internal/half"
)

// E4M3 is an FP8 e4m3fn byte's value from the format's definition (sign,
// 4 exponent bits of bias 7, 3 mantissa bits, subnormals at exponent 0);
// NaN for 0x7F and 0xFF. It is the reference the kernels' tests use too.
func E4M3(b uint8) float64 {
	sign := 1.0
	if b&0x80 != 0 {
		sign = -1
	}
	exp, man := int(b>>3&15), float64(b&7)
	switch {
	case exp == 15 && man == 7:
		return math.NaN()
	case exp == 0:
		return sign * man / 8 / 64
	}
	return sign * (1 + man/8) * math.Pow(2, float64(exp-7))
}

// nearestE4M3 is the byte whose value is nearest v (v within ±448), by
// search over every finite byte: the lower byte on a tie.
func nearestE4M3(v float64) uint8 {
	best, bestD := uint8(0), math.Inf(1)
	for b := 0; b < 256; b++ {
		if b&0x7F == 0x7F {
			continue
		}
		if d := math.Abs(E4M3(uint8(b)) - v); d < bestD {
			best, bestD = uint8(b), d
		}
	}
	return best
}

// quantizeFP8 quantizes v [rows, cols] as the fine-grained FP8 checkpoints
// are made: per block, scale = max|v|/448 (stored in scaleDType), each
// byte the e4m3 value nearest v/scale. It returns the bytes, the encoded
// scales and the dequantized values byte × stored scale.
func quantizeFP8(v []float64, rows, cols int, block [2]int, scaleDType string) ([]byte, []byte, [][]float64, error) {
	br, bc := block[0], block[1]
	gr, gc := (rows+br-1)/br, (cols+bc-1)/bc
	stored := make([]float64, gr*gc)
	enc := make([]byte, 0, 4*gr*gc)
	for bi := 0; bi < gr; bi++ {
		for bj := 0; bj < gc; bj++ {
			amax := 0.0
			for r := bi * br; r < min((bi+1)*br, rows); r++ {
				for c := bj * bc; c < min((bj+1)*bc, cols); c++ {
					amax = math.Max(amax, math.Abs(v[r*cols+c]))
				}
			}
			s := float32(amax / 448)
			switch scaleDType {
			case "F32":
				enc = binary.LittleEndian.AppendUint32(enc, math.Float32bits(s))
				stored[bi*gc+bj] = float64(s)
			case "BF16":
				h := half.F32ToBF16(s)
				enc = binary.LittleEndian.AppendUint16(enc, h)
				stored[bi*gc+bj] = float64(half.BF16ToF32(h))
			default:
				return nil, nil, nil, fmt.Errorf("moetest: fp8 scales of dtype %s", scaleDType)
			}
		}
	}
	data := make([]byte, rows*cols)
	vals := make([][]float64, rows)
	for r := range vals {
		vals[r] = make([]float64, cols)
		for c := range vals[r] {
			s := stored[r/br*gc+c/bc]
			if s > 0 {
				data[r*cols+c] = nearestE4M3(math.Max(-448, math.Min(448, v[r*cols+c]/s)))
			}
			vals[r][c] = E4M3(data[r*cols+c]) * s
		}
	}
	return data, enc, vals, nil
}

// quantizeINT4 quantizes v [rows, cols] as compressed-tensors' symmetric
// int4 groups along a row: scale = max|v|/7 (stored in scaleDType), each
// field round(v/scale) + 8 in 1…15, packed eight a little-endian int32,
// element j at bits 4·(j mod 8). It returns the packed words, the encoded
// scales and the values (field − 8) × stored scale.
func quantizeINT4(v []float64, rows, cols, group int, scaleDType string) ([]byte, []byte, [][]float64, error) {
	if cols%8 != 0 || cols%group != 0 {
		return nil, nil, nil, fmt.Errorf("moetest: int4 [%d, %d] in groups of %d", rows, cols, group)
	}
	g := cols / group
	stored := make([]float64, rows*g)
	var enc []byte
	for i := range stored {
		amax := 0.0
		for _, x := range v[i*group : (i+1)*group] {
			amax = math.Max(amax, math.Abs(x))
		}
		s := float32(amax / 7)
		switch scaleDType {
		case "F32":
			enc = binary.LittleEndian.AppendUint32(enc, math.Float32bits(s))
			stored[i] = float64(s)
		case "BF16":
			h := half.F32ToBF16(s)
			enc = binary.LittleEndian.AppendUint16(enc, h)
			stored[i] = float64(half.BF16ToF32(h))
		default:
			return nil, nil, nil, fmt.Errorf("moetest: int4 scales of dtype %s", scaleDType)
		}
	}
	words := make([]uint32, rows*cols/8)
	vals := make([][]float64, rows)
	for r := range vals {
		vals[r] = make([]float64, cols)
		for c := range vals[r] {
			s := stored[(r*cols+c)/group]
			q := 0.0
			if s > 0 {
				q = math.Max(-7, math.Min(7, math.RoundToEven(v[r*cols+c]/s)))
			}
			words[(r*cols+c)/8] |= uint32(q+8) << (4 * (c % 8))
			vals[r][c] = q * s
		}
	}
	packed := make([]byte, 0, 4*len(words))
	for _, w := range words {
		packed = binary.LittleEndian.AppendUint32(packed, w)
	}
	return packed, enc, vals, nil
}
