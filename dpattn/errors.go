package dpattn

import "errors"

// ErrCacheExhausted is the class (errors.Is) of a latent cache with too few
// free blocks for a step's rows: a scheduler's cue to preempt or wait. The
// message names the sequence and the blocks it needs.
var ErrCacheExhausted = errors.New("dpattn: latent cache exhausted")
