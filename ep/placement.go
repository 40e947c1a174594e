package ep

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
)

// Placement says which ranks hold a copy of each expert. A token routed to
// an expert with several replicas goes to one of them, chosen from the
// token's global index, so the split is deterministic.
type Placement struct {
	Kind         string  `json:"kind"` // contiguous, round-robin or balanced
	NumExperts   int     `json:"num_experts"`
	Ranks        int     `json:"ranks"`
	SlotsPerRank int     `json:"slots_per_rank"` // most experts one rank may hold
	Replicas     [][]int `json:"replicas"`       // [expert]: ranks holding it, ascending
	// PredictedImbalance is max rank load / mean rank load for the load the
	// placement was made from (1 for the static placements, whose load is
	// taken as uniform).
	PredictedImbalance float64 `json:"predicted_imbalance"`
}

// Contiguous gives rank r a block of consecutive experts; the blocks are as
// even as possible (the first experts % ranks ranks hold one more), and
// ranks beyond the expert count hold none.
func Contiguous(experts, ranks int) (*Placement, error) {
	if err := checkSizes(experts, ranks); err != nil {
		return nil, err
	}
	p := newPlacement("contiguous", experts, ranks)
	base, extra := experts/ranks, experts%ranks
	e := 0
	for r := 0; r < ranks; r++ {
		n := base
		if r < extra {
			n++
		}
		for ; n > 0; n-- {
			p.Replicas[e] = []int{r}
			e++
		}
	}
	return p.finish(nil)
}

// RoundRobin gives expert e to rank e % ranks.
func RoundRobin(experts, ranks int) (*Placement, error) {
	if err := checkSizes(experts, ranks); err != nil {
		return nil, err
	}
	p := newPlacement("round-robin", experts, ranks)
	for e := range p.Replicas {
		p.Replicas[e] = []int{e % ranks}
	}
	return p.finish(nil)
}

// Balanced is an EPLB-style placement for the per-expert token counts in
// load: redundant extra slots go, one at a time, to the expert with the
// highest load per replica; then replicas, heaviest first, go to the rank
// with the least load that has a free slot and no copy of that expert yet.
// Each rank has ceil((experts+redundant)/ranks) slots.
func Balanced(load []int64, ranks, redundant int) (*Placement, error) {
	experts := len(load)
	if err := checkSizes(experts, ranks); err != nil {
		return nil, err
	}
	if redundant < 0 {
		return nil, fmt.Errorf("ep: balanced placement: %d redundant slots", redundant)
	}
	for e, l := range load {
		if l < 0 {
			return nil, fmt.Errorf("ep: balanced placement: expert %d has negative load %d", e, l)
		}
	}
	// No expert needs more replicas than there are ranks.
	redundant = min(redundant, experts*(ranks-1))
	p := newPlacement("balanced", experts, ranks)
	p.SlotsPerRank = (experts + redundant + ranks - 1) / ranks
	count := make([]int, experts)
	for e := range count {
		count[e] = 1
	}
	perReplica := func(e int) float64 { return float64(load[e]) / float64(count[e]) }
	for range redundant {
		best := -1
		for e := range count {
			if count[e] < ranks && (best < 0 || perReplica(e) > perReplica(best)) {
				best = e
			}
		}
		count[best]++
	}
	type replica struct {
		expert int
		load   float64
	}
	var reps []replica
	for e, n := range count {
		for range n {
			reps = append(reps, replica{e, perReplica(e)})
		}
	}
	slices.SortStableFunc(reps, func(a, b replica) int {
		if c := cmp.Compare(b.load, a.load); c != 0 {
			return c
		}
		return cmp.Compare(a.expert, b.expert)
	})
	rankLoad := make([]float64, ranks)
	used := make([]int, ranks)
	for _, rp := range reps {
		best := -1
		for r := 0; r < ranks; r++ {
			if used[r] >= p.SlotsPerRank || slices.Contains(p.Replicas[rp.expert], r) {
				continue
			}
			if best < 0 || rankLoad[r] < rankLoad[best] {
				best = r
			}
		}
		if best < 0 {
			return nil, fmt.Errorf("ep: balanced placement: no free slot for a replica of expert %d", rp.expert)
		}
		p.Replicas[rp.expert] = append(p.Replicas[rp.expert], best)
		rankLoad[best] += rp.load
		used[best]++
	}
	for e := range p.Replicas {
		slices.Sort(p.Replicas[e])
	}
	return p.finish(load)
}

func checkSizes(experts, ranks int) error {
	if experts < 1 || ranks < 1 {
		return fmt.Errorf("ep: placement of %d experts over %d ranks", experts, ranks)
	}
	return nil
}

func newPlacement(kind string, experts, ranks int) *Placement {
	return &Placement{Kind: kind, NumExperts: experts, Ranks: ranks,
		SlotsPerRank: (experts + ranks - 1) / ranks, Replicas: make([][]int, experts)}
}

func (p *Placement) finish(load []int64) (*Placement, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if load == nil {
		load = make([]int64, p.NumExperts)
		for e := range load {
			load[e] = 1
		}
	}
	p.PredictedImbalance = p.Imbalance(load)
	return p, nil
}

// Validate checks that every expert has at least one replica, on distinct
// ranks in range, and that no rank holds more than SlotsPerRank experts.
func (p *Placement) Validate() error {
	if p.NumExperts < 1 || p.Ranks < 1 || len(p.Replicas) != p.NumExperts {
		return fmt.Errorf("ep: placement of %d experts over %d ranks lists %d experts", p.NumExperts, p.Ranks, len(p.Replicas))
	}
	if p.Ranks > MaxRanks {
		return fmt.Errorf("ep: placement over %d ranks: at most %d", p.Ranks, MaxRanks)
	}
	if p.SlotsPerRank < 1 || p.SlotsPerRank > p.NumExperts {
		return fmt.Errorf("ep: placement: slots_per_rank %d must be in [1, %d experts]", p.SlotsPerRank, p.NumExperts)
	}
	held := make([]int, p.Ranks)
	for e, rs := range p.Replicas {
		if len(rs) == 0 {
			return fmt.Errorf("ep: placement: expert %d has no owner", e)
		}
		for i, r := range rs {
			if r < 0 || r >= p.Ranks {
				return fmt.Errorf("ep: placement: expert %d is on rank %d, out of range [0, %d)", e, r, p.Ranks)
			}
			if i > 0 && r <= rs[i-1] {
				return fmt.Errorf("ep: placement: ranks of expert %d are not ascending and distinct: %v", e, rs)
			}
			held[r]++
		}
	}
	for r, n := range held {
		if n > p.SlotsPerRank {
			return fmt.Errorf("ep: placement: rank %d holds %d experts, more than its %d slots", r, n, p.SlotsPerRank)
		}
	}
	return nil
}

// MaxRanks bounds a placement's ranks: past any deployment, and what a
// placement file may ask to be allocated.
const MaxRanks = 1 << 16

// Local returns the experts rank r holds, ascending.
func (p *Placement) Local(r int) []int {
	var out []int
	for e, rs := range p.Replicas {
		if slices.Contains(rs, r) {
			out = append(out, e)
		}
	}
	return out
}

// Dest is the rank that computes expert e for the token with global index
// token.
func (p *Placement) Dest(e, token int) int {
	rs := p.Replicas[e]
	return rs[token%len(rs)]
}

// Imbalance is max rank load / mean rank load for per-expert token counts,
// each expert's load split evenly over its replicas.
func (p *Placement) Imbalance(load []int64) float64 {
	rank := make([]float64, p.Ranks)
	var total float64
	for e, rs := range p.Replicas {
		if e >= len(load) {
			break
		}
		for _, r := range rs {
			rank[r] += float64(load[e]) / float64(len(rs))
		}
		total += float64(load[e])
	}
	if total == 0 {
		return 1
	}
	return slices.Max(rank) / (total / float64(p.Ranks))
}

// ParsePlacement reads a placement from JSON and validates it.
func ParsePlacement(data []byte) (*Placement, error) {
	var p Placement
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("ep: placement: %w (want an object with num_experts, ranks, slots_per_rank and replicas, as moex writes it)", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("ep: placement: more after the placement object (one JSON object per file)")
	}
	for _, k := range []struct {
		name string
		set  bool
	}{{"num_experts", p.NumExperts != 0}, {"ranks", p.Ranks != 0}, {"replicas", p.Replicas != nil}} {
		if !k.set {
			return nil, fmt.Errorf("ep: placement: %q is missing or zero (want an object with num_experts, ranks, slots_per_rank and replicas)", k.name)
		}
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &p, nil
}

// Split divides tokens over ranks in contiguous, as-even-as-possible
// slices (the first tokens % ranks ranks take one more): rank r owns tokens
// [offsets[r], offsets[r+1]).
func Split(tokens, ranks int) []int {
	offsets := make([]int, ranks+1)
	for r := 0; r < ranks; r++ {
		n := tokens / ranks
		if r < tokens%ranks {
			n++
		}
		offsets[r+1] = offsets[r] + n
	}
	return offsets
}
