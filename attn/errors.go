package attn

import "errors"

// ErrCacheExhausted is the class (errors.Is) of a cache with too few
// free blocks for a step's rows: a scheduler's cue to preempt or wait. The
// message names the sequence and the blocks it needs.
var ErrCacheExhausted = errors.New("attn: cache exhausted")

// ErrNonFinite is the class of a NaN or ±Inf: in rows written to the
// cache (refused, the cache unchanged), in a query, or in an attention
// output, whose message then names the cache block and row that hold one
// (or says that finite rows overflowed).
var ErrNonFinite = errors.New("attn: non-finite value")
