// Package bindings holds thin C shims to native libraries, each in its own
// subpackage: bindings/nccl (NCCL, loaded with dlopen, and the bootstrap of
// its unique id). The transports built on them live with what they serve
// (ep/ncclcomm, ep/mpi).
package bindings
