package kernels

import (
	"fmt"
	"math"
)

// RoPEStyle is where a rotated pair's two values sit in a head.
type RoPEStyle uint8

// RoPE styles.
const (
	// RoPEHalves rotates value i with value i + d/2 (GPT-NeoX's
	// rotate_half: Llama, Qwen, Mixtral, gpt-oss, GLM-4.5).
	RoPEHalves RoPEStyle = iota + 1
	// RoPEPairs rotates values 2i and 2i + 1 in place (GPT-J's
	// interleaved pairs: dense GLM-4, llama.cpp's Mixtral files).
	RoPEPairs
	// RoPEPairsToHalves reads pairs (2i, 2i + 1) and writes the rotated
	// pair to i and i + d/2 (DeepSeek-V2/V3: their checkpoints store q_pe
	// and k_pe interleaved, and the model de-interleaves them).
	RoPEPairsToHalves
)

// RoPE is a rotary position embedding over the first 2·len(Freqs) values
// of a head.
type RoPE struct {
	// Freqs are the pairs' inverse frequencies: pair i turns by pos·Freqs[i].
	Freqs []float64
	// Scale multiplies cos and sin (yarn's attention factor on the rotated
	// part; 1 otherwise).
	Scale float64
	Style RoPEStyle
}

// RoPEScaling is how the frequencies are stretched for long contexts
// (config.json's rope_scaling); the zero value, or Type "" or "default",
// stretches nothing.
type RoPEScaling struct {
	// Type is "linear", "yarn" or "llama3".
	Type   string
	Factor float64
	// OrigMaxPos is original_max_position_embeddings (yarn, llama3).
	OrigMaxPos float64
	// BetaFast, BetaSlow: yarn's ramp (defaults 32 and 1 when zero);
	// MScale, MScaleAllDim: DeepSeek's yarn attention factors.
	BetaFast, BetaSlow, MScale, MScaleAllDim float64
	// AttentionFactor, when positive, is yarn's factor on cos and sin as
	// the config gives it (attention_factor); 0: computed from the
	// mscales, as transformers does.
	AttentionFactor float64
	// NoTruncate keeps yarn's ramp bounds unrounded (truncate: false,
	// gpt-oss).
	NoTruncate bool
	// LowFreqFactor, HighFreqFactor: llama3's bands.
	LowFreqFactor, HighFreqFactor float64
}

// NewRoPE is the rotary embedding of dim rotated values (dim even: a
// head's width times its partial_rotary_factor) at base theta, with s's
// stretching, and the factor yarn puts on the softmax scale (mscale², 1
// without yarn's mscale_all_dim: DeepSeek's yarn) for the caller to apply.
func NewRoPE(dim int, theta float64, s RoPEScaling, style RoPEStyle) (RoPE, float64, error) {
	if dim <= 0 || dim%2 != 0 {
		return RoPE{}, 0, fmt.Errorf("kernels: rope over %d values: want a positive even number", dim)
	}
	if !(theta > 1) || math.IsInf(theta, 0) {
		return RoPE{}, 0, fmt.Errorf("kernels: rope_theta %v: want a finite value above 1", theta)
	}
	r := RoPE{Freqs: make([]float64, dim/2), Scale: 1, Style: style}
	for i := range r.Freqs {
		r.Freqs[i] = 1 / math.Pow(theta, float64(2*i)/float64(dim))
	}
	softmax := 1.0
	switch s.Type {
	case "", "default":
	case "linear":
		if !(s.Factor > 0) {
			return RoPE{}, 0, fmt.Errorf("kernels: linear rope_scaling factor %v: want a positive value", s.Factor)
		}
		for i := range r.Freqs {
			r.Freqs[i] /= s.Factor
		}
	case "yarn":
		if s.Factor <= 1 {
			break
		}
		if !(s.OrigMaxPos > 0) {
			return RoPE{}, 0, fmt.Errorf("kernels: yarn rope_scaling without original_max_position_embeddings")
		}
		fast, slow := s.BetaFast, s.BetaSlow
		if fast == 0 {
			fast = 32
		}
		if slow == 0 {
			slow = 1
		}
		corr := func(rot float64) float64 {
			return float64(dim) * math.Log(s.OrigMaxPos/(rot*2*math.Pi)) / (2 * math.Log(theta))
		}
		low, high := corr(fast), corr(slow)
		if !s.NoTruncate {
			low, high = math.Floor(low), math.Ceil(high)
		}
		low, high = math.Max(low, 0), math.Min(high, float64(dim-1))
		if low == high {
			high += 0.001
		}
		for i := range r.Freqs {
			extra := r.Freqs[i]
			inter := extra / s.Factor
			ramp := math.Min(math.Max((float64(i)-low)/(high-low), 0), 1)
			mask := 1 - ramp
			r.Freqs[i] = inter*(1-mask) + extra*mask
		}
		ms := func(m float64) float64 { return 0.1*m*math.Log(s.Factor) + 1 }
		switch {
		case s.AttentionFactor > 0:
			r.Scale = s.AttentionFactor
		case s.MScale != 0 && s.MScaleAllDim != 0:
			r.Scale = ms(s.MScale) / ms(s.MScaleAllDim)
		default:
			r.Scale = ms(1)
		}
		if s.MScaleAllDim != 0 { // DeepSeek's attention: mscale² on the softmax
			m := ms(s.MScaleAllDim)
			softmax = m * m
		}
	case "llama3":
		if !(s.Factor > 0) || !(s.OrigMaxPos > 0) || !(s.HighFreqFactor > s.LowFreqFactor) || !(s.LowFreqFactor > 0) {
			return RoPE{}, 0, fmt.Errorf("kernels: llama3 rope_scaling %+v: want positive factors, high_freq_factor above low_freq_factor", s)
		}
		lowWave, highWave := s.OrigMaxPos/s.LowFreqFactor, s.OrigMaxPos/s.HighFreqFactor
		for i, f := range r.Freqs {
			wave := 2 * math.Pi / f
			switch {
			case wave < highWave:
			case wave > lowWave:
				r.Freqs[i] = f / s.Factor
			default:
				smooth := (s.OrigMaxPos/wave - s.LowFreqFactor) / (s.HighFreqFactor - s.LowFreqFactor)
				r.Freqs[i] = (1-smooth)*f/s.Factor + smooth*f
			}
		}
	default:
		return RoPE{}, 0, fmt.Errorf("kernels: rope_scaling type %q is not supported (supported: linear, yarn, llama3)", s.Type)
	}
	return r, softmax, nil
}

// Dim is the number of rotated values.
func (r RoPE) Dim() int { return 2 * len(r.Freqs) }

// Apply rotates the first Dim() values of v for position pos, in float64
// (cos and sin of pos·Freqs[i], times Scale), rounding each value once.
func (r RoPE) Apply(v []float32, pos int) { r.ApplyHeads(v, 1, 0, pos) }

// ApplyHeads is Apply on each of heads runs of v, stride values apart (a
// token's query or key heads): cos and sin computed once for them all,
// each head's bits those Apply gives it.
func (r RoPE) ApplyHeads(v []float32, heads, stride, pos int) {
	h := len(r.Freqs)
	var buf [256]float64
	cs := buf[:0]
	if 2*h > len(buf) {
		cs = make([]float64, 2*h)
	} else {
		cs = buf[:2*h]
	}
	for i, f := range r.Freqs {
		a := float64(pos) * f
		cs[2*i], cs[2*i+1] = math.Cos(a)*r.Scale, math.Sin(a)*r.Scale
	}
	var tbuf [256]float32 // RoPEPairsToHalves writes where it has yet to read
	tmp := tbuf[:0]
	toHalves := r.Style != RoPEHalves && r.Style != RoPEPairs
	if toHalves {
		if 2*h > len(tbuf) {
			tmp = make([]float32, 2*h)
		} else {
			tmp = tbuf[:2*h]
		}
	}
	for n := range heads {
		x := v[n*stride:][:2*h]
		for i := 0; i < h; i++ {
			c, s := cs[2*i], cs[2*i+1]
			switch r.Style {
			case RoPEHalves:
				x0, x1 := float64(x[i]), float64(x[i+h])
				x[i], x[i+h] = float32(x0*c-x1*s), float32(x1*c+x0*s)
			case RoPEPairs:
				x0, x1 := float64(x[2*i]), float64(x[2*i+1])
				x[2*i], x[2*i+1] = float32(x0*c-x1*s), float32(x1*c+x0*s)
			default:
				x0, x1 := float64(x[2*i]), float64(x[2*i+1])
				tmp[i], tmp[i+h] = float32(x0*c-x1*s), float32(x1*c+x0*s)
			}
		}
		if toHalves {
			copy(x, tmp)
		}
	}
}
