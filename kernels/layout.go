package kernels

import "fmt"

// Layout is the dispatch layout of one step: the (token, slot) pairs that
// chose each expert, sorted by expert and, within an expert, by token. It is
// the layout the GPU kernels use (vLLM's moe_align_block_size): each
// expert's rows start at a multiple of Block, and padding rows hold the
// sentinel Tokens·TopK.
type Layout struct {
	Experts, TopK, Tokens, Block int

	Counts  []int32 // [experts]: rows routed to each expert
	Offsets []int32 // [experts+1]: first row of each expert; Offsets[Experts] is the padded total
	Pairs   []int32 // [Offsets[Experts]]: token·TopK + slot of each row, or the sentinel
	Rows    []int32 // [tokens·TopK]: the row of each (token, slot), the inverse used by combine
}

// NewLayout builds the layout of ids [tokens, topK], whose rows must be
// strictly ascending expert ids in [0, experts). block ≥ 1 pads each
// expert's rows to a multiple of block.
func NewLayout(ids []int32, tokens, topK, experts, block int) (*Layout, error) {
	if tokens < 0 || topK <= 0 || experts <= 0 || block <= 0 {
		return nil, fmt.Errorf("kernels: layout of %d tokens, top-%d of %d experts, block %d", tokens, topK, experts, block)
	}
	if len(ids) != tokens*topK {
		return nil, fmt.Errorf("kernels: layout: %d expert ids for %d tokens × top-%d", len(ids), tokens, topK)
	}
	l := &Layout{
		Experts: experts, TopK: topK, Tokens: tokens, Block: block,
		Counts:  make([]int32, experts),
		Offsets: make([]int32, experts+1),
		Rows:    make([]int32, tokens*topK),
	}
	for t := 0; t < tokens; t++ {
		for j := 0; j < topK; j++ {
			e := ids[t*topK+j]
			if e < 0 || int(e) >= experts {
				return nil, fmt.Errorf("kernels: token %d slot %d: expert id %d out of range [0, %d)", t, j, e, experts)
			}
			if j > 0 && e <= ids[t*topK+j-1] {
				return nil, fmt.Errorf("kernels: token %d: expert ids %v are not strictly ascending", t, ids[t*topK:(t+1)*topK])
			}
			l.Counts[e]++
		}
	}
	for e, n := range l.Counts {
		padded := (int(n) + block - 1) / block * block
		l.Offsets[e+1] = l.Offsets[e] + int32(padded)
	}
	l.Pairs = make([]int32, l.Offsets[experts])
	sentinel := int32(tokens * topK)
	for i := range l.Pairs {
		l.Pairs[i] = sentinel
	}
	next := make([]int32, experts)
	copy(next, l.Offsets[:experts])
	for p, e := range ids { // p = t·topK + j, ascending: tokens stay sorted within an expert
		row := next[e]
		next[e]++
		l.Pairs[row] = int32(p)
		l.Rows[p] = row
	}
	return l, nil
}
