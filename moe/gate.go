package moe

import (
	"fmt"
	"math"
	"slices"

	"github.com/moex-project/moex/internal/errkind"
	"github.com/moex-project/moex/kernels"
)

// Router is the gate of a MoE block: router logits, scores, the choice of
// each token's top-k experts and their routing weights.
type Router struct {
	cfg       *Config
	weight    kernels.Matrix // [experts, hidden]
	bias      []float64      // [experts]: the NoAuxTC correction bias, else nil
	logitBias []float64      // [experts]: added to the logits (gpt_oss), else nil
}

// NewRouter makes the gate of cfg from its weight [experts, hidden] and, for
// NoAuxTC, the correction bias [experts] (nil otherwise). A family whose
// router adds a bias to its logits (Config.RouterBias) needs
// NewBiasedRouter.
func NewRouter(cfg *Config, weight kernels.Matrix, bias []float32) (*Router, error) {
	return NewBiasedRouter(cfg, weight, bias, nil)
}

// NewBiasedRouter is NewRouter with the bias [experts] the router adds to
// its logits, which cfg.RouterBias asks for (nil otherwise).
func NewBiasedRouter(cfg *Config, weight kernels.Matrix, bias, logitBias []float32) (*Router, error) {
	if weight.Rows != cfg.NumExperts || weight.Cols != cfg.Hidden {
		return nil, fmt.Errorf("moe: gate weight is [%d, %d], want [%d, %d]", weight.Rows, weight.Cols, cfg.NumExperts, cfg.Hidden)
	}
	r := &Router{cfg: cfg, weight: weight}
	if (logitBias != nil) != cfg.RouterBias || (logitBias != nil && len(logitBias) != cfg.NumExperts) {
		return nil, errkind.Errorf(ErrShape, "moe: %s router logit bias has %d values, want %d", cfg.ModelType, len(logitBias), map[bool]int{true: cfg.NumExperts}[cfg.RouterBias])
	}
	for i, b := range logitBias {
		if math.IsNaN(float64(b)) || math.IsInf(float64(b), 0) {
			return nil, errkind.Errorf(ErrNonFinite, "moe: router logit bias of expert %d is %v", i, b)
		}
		r.logitBias = append(r.logitBias, float64(b))
	}
	if cfg.Method == NoAuxTC {
		if len(bias) != cfg.NumExperts {
			return nil, fmt.Errorf("moe: noaux_tc needs a correction bias of %d values, have %d", cfg.NumExperts, len(bias))
		}
		r.bias = make([]float64, len(bias))
		for i, b := range bias {
			if math.IsNaN(float64(b)) || math.IsInf(float64(b), 0) {
				return nil, fmt.Errorf("moe: correction bias of expert %d is %v", i, b)
			}
			r.bias[i] = float64(b)
		}
	}
	return r, nil
}

// Route chooses the experts of tokens [t0, t1) of x [tokens, hidden]:
// ids[t, :] (ascending) and weights[t, :] in the same order, both
// [tokens, top_k]. The logits, scores and weights are computed in float64
// and the weights rounded once to float32.
func (r *Router) Route(x []float32, ids []int32, weights []float32, t0, t1 int) {
	c := r.cfg
	E, H, K := c.NumExperts, c.Hidden, c.TopK
	logits := make([]float64, (t1-t0)*E)
	kernels.RouterLogits(logits, x[t0*H:t1*H], r.weight)
	s := newRouteScratch(c)
	for t := t0; t < t1; t++ {
		r.routeOne(logits[(t-t0)*E:][:E], ids[t*K:][:K], weights[t*K:][:K], s)
	}
}

// Weight is the gate's weight [experts, hidden].
func (r *Router) Weight() kernels.Matrix { return r.weight }

// Bias is the noaux_tc correction bias [experts] as float32, or nil.
func (r *Router) Bias() []float32 { return float32s(r.bias) }

// float32s rounds v to float32 (nil for nil).
func float32s(v []float64) []float32 {
	if v == nil {
		return nil
	}
	b := make([]float32, len(v))
	for i, x := range v {
		b[i] = float32(x)
	}
	return b
}

// LogitBias is the bias the router adds to its logits [experts] (gpt_oss),
// or nil.
func (r *Router) LogitBias() []float32 { return float32s(r.logitBias) }

// RouteLogits chooses experts from router logits [tokens, experts]
// computed elsewhere (a GPU kernel, a test), without the logit bias, which
// it adds: ids and weights [tokens, top_k], as Route returns them.
func (r *Router) RouteLogits(logits []float64, ids []int32, weights []float32) {
	E, K := r.cfg.NumExperts, r.cfg.TopK
	s := newRouteScratch(r.cfg)
	for t := 0; t < len(logits)/E; t++ {
		r.routeOne(logits[t*E:][:E], ids[t*K:][:K], weights[t*K:][:K], s)
	}
}

type routeScratch struct {
	scores, choice, groupScore []float64
	biased                     []float64
	order, groups              []int
	allowed                    []bool
	pick                       []int
}

func newRouteScratch(c *Config) *routeScratch {
	E := c.NumExperts
	return &routeScratch{
		scores: make([]float64, E), choice: make([]float64, E), biased: make([]float64, E),
		groupScore: make([]float64, max(c.NumGroups, 1)),
		order:      make([]int, E), groups: make([]int, max(c.NumGroups, 1)),
		allowed: make([]bool, E), pick: make([]int, c.TopK),
	}
}

func (r *Router) routeOne(logits []float64, ids []int32, weights []float32, s *routeScratch) {
	c := r.cfg
	E := c.NumExperts
	if r.logitBias != nil {
		for e, l := range logits {
			s.biased[e] = l + r.logitBias[e]
		}
		logits = s.biased // the caller's logits stay as they are
	}
	switch c.Scoring {
	case Softmax:
		m := math.Inf(-1)
		for _, l := range logits {
			m = max(m, l)
		}
		var sum float64
		for e, l := range logits {
			s.scores[e] = math.Exp(l - m)
			sum += s.scores[e]
		}
		for e := range s.scores {
			s.scores[e] /= sum
		}
	case Sigmoid:
		for e, l := range logits {
			s.scores[e] = 1 / (1 + math.Exp(-l))
		}
	}
	// choice: the values the experts are ranked by.
	copy(s.choice, s.scores)
	if c.ChooseOnLogits {
		copy(s.choice, logits)
	}
	if r.bias != nil {
		for e := range s.choice {
			s.choice[e] += r.bias[e]
		}
	}
	for e := range s.allowed {
		s.allowed[e] = true
	}
	if c.Method == GroupLimitedGreedy || c.Method == NoAuxTC {
		per := E / c.NumGroups
		for g := range s.groupScore {
			grp := s.choice[g*per : (g+1)*per]
			if c.Method == GroupLimitedGreedy {
				s.groupScore[g] = slices.Max(grp)
			} else {
				s.groupScore[g] = sumTop2(grp)
			}
		}
		topIndices(s.groupScore, s.groups)
		for e := range s.allowed {
			s.allowed[e] = false
		}
		for _, g := range s.groups[:c.TopKGroups] {
			for e := g * per; e < (g+1)*per; e++ {
				s.allowed[e] = true
			}
		}
	}
	// The k best allowed experts: higher choice value first, lower id on ties.
	n := 0
	for e := 0; e < E; e++ {
		if s.allowed[e] {
			s.order[n] = e
			n++
		}
	}
	order := s.order[:n]
	slices.SortFunc(order, func(a, b int) int { return rankCompare(s.choice, a, b) })
	pick := s.pick
	copy(pick, order[:c.TopK])
	slices.Sort(pick)

	var sum float64
	for _, e := range pick {
		sum += s.scores[e]
	}
	if c.NormTopK {
		sum = max(sum+c.NormEps, c.NormMin)
	} else {
		sum = 1
	}
	for j, e := range pick {
		ids[j] = int32(e)
		weights[j] = float32(s.scores[e] / sum * c.RoutedScaling)
	}
}

// rankCompare orders a before b when v[a] is larger, or equal with a < b.
func rankCompare(v []float64, a, b int) int {
	switch {
	case v[a] > v[b]:
		return -1
	case v[a] < v[b]:
		return 1
	}
	return a - b
}

// topIndices fills idx with the indices of v ranked by rankCompare.
func topIndices(v []float64, idx []int) {
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return rankCompare(v, a, b) })
}

// sumTop2 is the sum of the two largest values (the one value of a group
// of one).
func sumTop2(v []float64) float64 {
	if len(v) == 1 {
		return v[0]
	}
	a, b := math.Inf(-1), math.Inf(-1)
	for _, x := range v {
		if x > a {
			a, b = x, a
		} else if x > b {
			b = x
		}
	}
	return a + b
}
