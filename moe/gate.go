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
	// tokenExperts [vocab, top_k]: a hash layer's experts of each token id
	// (deepseek_v4's tid2eid), each row ascending; nil for a layer that
	// chooses by score.
	tokenExperts []int32
	// inScale [hidden]: the router reads RMSNorm(x) ⊙ inScale (gemma4:
	// router.scale × hidden^−½); expertScale [experts] multiplies the
	// final weights (gemma4's per_expert_scale). nil for other families.
	inScale, expertScale []float64
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
	return newRouter(cfg, &Weights{Gate: weight, Bias: bias, RouterBias: logitBias})
}

// newRouter is the gate of cfg from a block's weights: w.Gate, w.Bias,
// w.RouterBias, and gemma4's w.RouterScale and w.ExpertScale, or a hash
// layer's w.TokenExperts.
func newRouter(cfg *Config, w *Weights) (*Router, error) {
	weight, bias, logitBias := w.Gate, w.Bias, w.RouterBias
	if weight.Rows != cfg.NumExperts || weight.Cols != cfg.Hidden {
		return nil, fmt.Errorf("moe: gate weight is [%d, %d], want [%d, %d]", weight.Rows, weight.Cols, cfg.NumExperts, cfg.Hidden)
	}
	r := &Router{cfg: cfg, weight: weight}
	if (logitBias != nil) != cfg.RouterBias || (logitBias != nil && len(logitBias) != cfg.NumExperts) {
		return nil, errkind.Errorf(ErrShape, "moe: %s router logit bias has %d values, want %d", cfg.ModelType, len(logitBias), map[bool]int{true: cfg.NumExperts}[cfg.RouterBias])
	}
	var err error
	if r.logitBias, err = finite64("router logit bias", logitBias); err != nil {
		return nil, err
	}
	if w.TokenExperts != nil {
		if err := r.setTokenExperts(w.TokenExperts); err != nil {
			return nil, err
		}
	} else if cfg.Method == NoAuxTC {
		if len(bias) != cfg.NumExperts {
			return nil, fmt.Errorf("moe: noaux_tc needs a correction bias of %d values, have %d", cfg.NumExperts, len(bias))
		}
		if r.bias, err = finite64("correction bias", bias); err != nil {
			return nil, err
		}
	}
	if (w.RouterScale != nil || w.ExpertScale != nil) != cfg.ResidualInput || cfg.ResidualInput && (len(w.RouterScale) != cfg.Hidden || len(w.ExpertScale) != cfg.NumExperts) {
		return nil, errkind.Errorf(ErrShape, "moe: %s router: input scale of %d values and per-expert scale of %d given, want %d and %d",
			cfg.ModelType, len(w.RouterScale), len(w.ExpertScale), map[bool]int{true: cfg.Hidden}[cfg.ResidualInput], map[bool]int{true: cfg.NumExperts}[cfg.ResidualInput])
	}
	if r.inScale, err = finite64("router input scale", w.RouterScale); err != nil {
		return nil, err
	}
	for i := range r.inScale {
		r.inScale[i] /= math.Sqrt(float64(cfg.Hidden))
	}
	if r.expertScale, err = finite64("router per-expert scale", w.ExpertScale); err != nil {
		return nil, err
	}
	return r, nil
}

// finite64 is v widened to float64 (nil for nil), or an ErrNonFinite error
// naming what and the index of a NaN or infinity in it.
func finite64(what string, v []float32) ([]float64, error) {
	if v == nil {
		return nil, nil
	}
	out := make([]float64, len(v))
	for i, b := range v {
		if math.IsNaN(float64(b)) || math.IsInf(float64(b), 0) {
			return nil, errkind.Errorf(ErrNonFinite, "moe: %s of expert %d is %v", what, i, b)
		}
		out[i] = float64(b)
	}
	return out, nil
}

// setTokenExperts checks a hash layer's table [vocab, top_k] (each entry
// an expert, no expert twice in a row) and keeps it with its rows sorted.
func (r *Router) setTokenExperts(t []int32) error {
	c := r.cfg
	K := c.TopK
	if len(c.HashLayers) == 0 {
		return errkind.Errorf(ErrShape, "moe: a token → experts table given, but %s has no hash layers", c.ModelType)
	}
	if len(t) != c.VocabSize*K {
		return errkind.Errorf(ErrShape, "moe: tid2eid has %d entries, want [vocab_size %d, top_k %d] = %d", len(t), c.VocabSize, K, c.VocabSize*K)
	}
	r.tokenExperts = slices.Clone(t)
	for tok := 0; tok < c.VocabSize; tok++ {
		row := r.tokenExperts[tok*K:][:K]
		slices.Sort(row)
		for j, e := range row {
			if e < 0 || int(e) >= c.NumExperts {
				return errkind.Errorf(ErrShape, "moe: tid2eid row %d names expert %d; the layer has %d experts", tok, e, c.NumExperts)
			}
			if j > 0 && row[j-1] == e {
				return errkind.Errorf(ErrShape, "moe: tid2eid row %d names expert %d twice", tok, e)
			}
		}
	}
	return nil
}

// TokenRouted reports whether the router chooses experts by token id (a
// deepseek_v4 hash layer): Route then needs the batch's token ids.
func (r *Router) TokenRouted() bool { return r.tokenExperts != nil }

// CheckTokens checks a batch's token ids [tokens] for this router: nil for
// one that does not route by token id, otherwise one id in [0, vocab_size)
// per token.
func (r *Router) CheckTokens(tokens []int32, T int) error {
	if r.tokenExperts == nil || T == 0 && len(tokens) == 0 {
		return nil
	}
	if tokens == nil {
		return errkind.Errorf(ErrShape, "moe: %s layer chooses its experts by token id (a hash layer): its forward pass needs the batch's token ids", r.cfg.ModelType)
	}
	if len(tokens) != T {
		return errkind.Errorf(ErrShape, "moe: %d token ids for %d tokens", len(tokens), T)
	}
	for t, id := range tokens {
		if id < 0 || int(id) >= r.cfg.VocabSize {
			return errkind.Errorf(ErrShape, "moe: token %d has id %d, outside the hash layer's tid2eid table of vocab_size %d rows", t, id, r.cfg.VocabSize)
		}
	}
	return nil
}

// Route chooses the experts of tokens [t0, t1) of x [tokens, hidden]:
// ids[t, :] (ascending) and weights[t, :] in the same order, both
// [tokens, top_k]. tokens are the batch's token ids [tokens] for a router
// that routes by token id (TokenRouted; CheckTokens says what is wrong
// with them), else ignored (nil will do). The logits, scores and weights
// are computed in float64 and the weights rounded once to float32.
func (r *Router) Route(x []float32, tokens, ids []int32, weights []float32, t0, t1 int) error {
	if err := r.CheckTokens(tokens, len(x)/r.cfg.Hidden); err != nil {
		return err
	}
	r.route(x, tokens, ids, weights, t0, t1)
	return nil
}

// route is Route on checked tokens.
func (r *Router) route(x []float32, tokens, ids []int32, weights []float32, t0, t1 int) {
	logits := make([]float64, (t1-t0)*r.cfg.NumExperts)
	kernels.RouterLogits(logits, r.input(x, t0, t1), r.weight)
	r.choose(logits, tokens, ids, weights, t0, t1)
}

// input is what the router reads of tokens [t0, t1) of x: those rows, or
// (a router with an input scale) their norms.
func (r *Router) input(x []float32, t0, t1 int) []float32 {
	H := r.cfg.Hidden
	in := x[t0*H : t1*H]
	if r.inScale != nil {
		in = make([]float32, len(in))
		for t := 0; t < t1-t0; t++ {
			rmsNorm(in[t*H:][:H], x[(t0+t)*H:][:H], nil, r.inScale, r.cfg.RMSNormEps)
		}
	}
	return in
}

// choose is route's choice of tokens [t0, t1) from their logits
// [t1−t0, experts].
func (r *Router) choose(logits []float64, tokens, ids []int32, weights []float32, t0, t1 int) {
	c := r.cfg
	E, K := c.NumExperts, c.TopK
	s := newRouteScratch(c)
	for t := t0; t < t1; t++ {
		l, id, w := logits[(t-t0)*E:][:E], ids[t*K:][:K], weights[t*K:][:K]
		if r.tokenExperts != nil {
			r.score(l, s)
			copy(s.pick, r.tokenExperts[int(tokens[t])*K:][:K])
			r.finish(id, w, s)
			continue
		}
		r.routeOne(l, id, w, s)
	}
}

// rmsNorm is dst = src / sqrt(mean(src²) + eps) ⊙ w ⊙ scale (w, scale nil:
// ones), in float64, rounded once to float32.
func rmsNorm(dst, src, w []float32, scale []float64, eps float64) {
	inv := rmsInverse(src, eps)
	if scale == nil {
		scaleRow(dst, src, w, inv)
		return
	}
	for i, v := range src {
		f := float64(v) * inv * scale[i]
		if w != nil {
			f *= float64(w[i])
		}
		dst[i] = float32(f)
	}
}

// rmsInverse is 1 / sqrt(mean(v²) + eps), the sum in float64.
func rmsInverse(v []float32, eps float64) float64 {
	var s0, s1, s2, s3 float64
	i := 0
	for ; i+4 <= len(v); i += 4 {
		a, b, c, d := float64(v[i]), float64(v[i+1]), float64(v[i+2]), float64(v[i+3])
		s0 += a * a
		s1 += b * b
		s2 += c * c
		s3 += d * d
	}
	for ; i < len(v); i++ {
		s0 += float64(v[i]) * float64(v[i])
	}
	return 1 / math.Sqrt((s0+s1+s2+s3)/float64(len(v))+eps)
}

// scaleRow is dst = src · inv ⊙ w (w nil: ones), in float64, rounded once.
func scaleRow(dst, src, w []float32, inv float64) {
	if w == nil {
		for i, v := range src {
			dst[i] = float32(float64(v) * inv)
		}
		return
	}
	w = w[:len(src)]
	dst = dst[:len(src)]
	for i, v := range src {
		dst[i] = float32(float64(v) * inv * float64(w[i]))
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
// it adds: ids and weights [tokens, top_k], as Route returns them, for a
// router that does not route by token id.
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
	pick                       []int32
}

func newRouteScratch(c *Config) *routeScratch {
	E := c.NumExperts
	return &routeScratch{
		scores: make([]float64, E), choice: make([]float64, E), biased: make([]float64, E),
		groupScore: make([]float64, max(c.NumGroups, 1)),
		order:      make([]int, E), groups: make([]int, max(c.NumGroups, 1)),
		allowed: make([]bool, E), pick: make([]int32, c.TopK),
	}
}

// score fills s.scores from a token's logits [experts] (with the logit
// bias added, in s.biased): the scoring function of every expert.
func (r *Router) score(logits []float64, s *routeScratch) []float64 {
	c := r.cfg
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
	case SqrtSoftplus:
		for e, l := range logits {
			// softplus(l) = log(1 + e^l), without overflow for large l.
			s.scores[e] = math.Sqrt(max(l, 0) + math.Log1p(math.Exp(-math.Abs(l))))
		}
	}
	return logits
}

// finish writes the weights of the experts in s.pick (ascending): their
// scores, renormalised where the family does, × routed scaling and the
// per-expert scale.
func (r *Router) finish(ids []int32, weights []float32, s *routeScratch) {
	c := r.cfg
	var sum float64
	for _, e := range s.pick {
		sum += s.scores[e]
	}
	if c.NormTopK {
		sum = max(sum+c.NormEps, c.NormMin)
	} else {
		sum = 1
	}
	for j, e := range s.pick {
		ids[j] = e
		w := s.scores[e] / sum * c.RoutedScaling
		if r.expertScale != nil {
			w *= r.expertScale[e]
		}
		weights[j] = float32(w)
	}
}

func (r *Router) routeOne(logits []float64, ids []int32, weights []float32, s *routeScratch) {
	c := r.cfg
	E := c.NumExperts
	logits = r.score(logits, s)
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
	for j, e := range order[:c.TopK] {
		s.pick[j] = int32(e)
	}
	slices.Sort(s.pick)
	r.finish(ids, weights, s)
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
