package kernels

import "math"

// RMSNorm writes each row of x ([rows, len(w)]) normalised by its root
// mean square and scaled by w into out: x / sqrt(mean(x²) + eps) · w, the
// sum and the products in float64, each value rounded once to float32.
// out may be x. It is the decoders' norm (input_layernorm,
// post_attention_layernorm, the final norm).
//
// There is no SIMD twin: the row's sum is sequential, so that the bits do
// not depend on the machine, and a norm is O(hidden) a token beside the
// O(hidden²) projections around it.
func RMSNorm(out, x, w []float32, eps float64) {
	H := len(w)
	for r := 0; r+H <= len(x); r += H {
		s := rmsScale(x[r:r+H], eps)
		for i, v := range x[r : r+H] {
			out[r+i] = float32(float64(v) * s * float64(w[i]))
		}
	}
}

// RMSNormThenWeight is RMSNorm in transformers' order on float32
// activations: x · rsqrt(mean(x²) + eps) rounded to float32, then times w
// in float32 (MLA's q_a_layernorm and kv_a_layernorm).
func RMSNormThenWeight(out, x, w []float32, eps float64) {
	H := len(w)
	for r := 0; r+H <= len(x); r += H {
		s := rmsScale(x[r:r+H], eps)
		for i, v := range x[r : r+H] {
			out[r+i] = float32(float64(v)*s) * w[i]
		}
	}
}

// rmsScale is 1 / sqrt(mean(v²) + eps), the sum in float64, in order.
func rmsScale(v []float32, eps float64) float64 {
	var ss float64
	for _, x := range v {
		ss += float64(x) * float64(x)
	}
	return 1 / math.Sqrt(ss/float64(len(v))+eps)
}
