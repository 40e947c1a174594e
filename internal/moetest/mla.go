package moetest

import "math"

// MLA is the float64 reference of MLA attention in the absorbed form for
// one query: rows are the attended latent rows, q is [heads, dim]; it
// returns softmax(scale·q·Kᵀ)·V [heads, dv], V being the rows' first dv
// columns, and the natural-log sum-exp of the scaled scores [heads].
func MLA(rows [][]float64, q []float32, heads, dim, dv int, scale float64) (o []float64, lse []float64) {
	o = make([]float64, heads*dv)
	lse = make([]float64, heads)
	for h := 0; h < heads; h++ {
		s := make([]float64, len(rows))
		m := math.Inf(-1)
		for i, k := range rows {
			var d float64
			for x := 0; x < dim; x++ {
				d += float64(q[h*dim+x]) * k[x]
			}
			s[i] = scale * d
			m = math.Max(m, s[i])
		}
		var z float64
		for i := range s {
			s[i] = math.Exp(s[i] - m)
			z += s[i]
		}
		for i, k := range rows {
			for x := 0; x < dv; x++ {
				o[h*dv+x] += s[i] / z * k[x]
			}
		}
		lse[h] = m + math.Log(z)
	}
	return o, lse
}
