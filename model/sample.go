package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
)

// Sampling is how a request picks its next token from the logits, as
// SGLang's sampling_params: Temperature 0 is greedy (the first highest
// logit); otherwise softmax(logits / Temperature) restricted to the
// smallest set of most likely tokens whose probability reaches TopP (1:
// all) and to the TopK most likely (0: all), drawn with the request's own
// random stream (Seed), so that a request's tokens do not depend on the
// others in its batch.
type Sampling struct {
	Temperature float64
	TopP        float64
	TopK        int
	Seed        uint64
}

// Validate names a parameter out of its range.
func (s Sampling) Validate() error {
	switch {
	case math.IsNaN(s.Temperature) || s.Temperature < 0 || math.IsInf(s.Temperature, 0):
		return fmt.Errorf("temperature %v must be a finite number ≥ 0", s.Temperature)
	case math.IsNaN(s.TopP) || s.TopP <= 0 || s.TopP > 1:
		return fmt.Errorf("top_p %v must be in (0, 1]", s.TopP)
	case s.TopK < 0:
		return fmt.Errorf("top_k %d must be ≥ 0 (0: no limit)", s.TopK)
	}
	return nil
}

// Sampler draws a request's tokens: Sampling and its random stream.
type Sampler struct {
	s   Sampling
	rng *rand.Rand
}

// NewSampler checks s and starts its random stream.
func NewSampler(s Sampling) (*Sampler, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &Sampler{s: s, rng: rand.New(rand.NewPCG(s.Seed, 0x73616d70))}, nil
}

// Next picks a token from one position's logits.
func (p *Sampler) Next(logits []float32) int32 {
	best := 0
	for i, v := range logits {
		if v > logits[best] {
			best = i
		}
	}
	if p.s.Temperature == 0 {
		return int32(best)
	}
	// Candidates by probability, descending (ties: lower id first).
	idx := make([]int, len(logits))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return logits[idx[a]] > logits[idx[b]] })
	if p.s.TopK > 0 && p.s.TopK < len(idx) {
		idx = idx[:p.s.TopK]
	}
	probs := make([]float64, len(idx))
	top := float64(logits[idx[0]])
	var sum float64
	for i, id := range idx {
		probs[i] = math.Exp((float64(logits[id]) - top) / p.s.Temperature)
		sum += probs[i]
	}
	// Keep the smallest prefix whose mass reaches top_p.
	keep, mass := len(idx), 0.0
	for i, q := range probs {
		mass += q / sum
		if mass >= p.s.TopP {
			keep = i + 1
			break
		}
	}
	idx, probs = idx[:keep], probs[:keep]
	sum = 0
	for _, q := range probs {
		sum += q
	}
	u := p.rng.Float64() * sum
	for i, q := range probs {
		if u < q {
			return int32(idx[i])
		}
		u -= q
	}
	return int32(idx[len(idx)-1])
}
