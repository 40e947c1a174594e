// Package ep will own expert parallelism: expert placement over ranks
// (contiguous, round-robin, load-balanced with redundant experts), the Comm
// collective interface with its in-process implementation, and the
// dispatch/combine of tokens between the ranks that own their experts.
package ep
