// Package ep is expert parallelism: the experts of a MoE layer are spread
// over ranks by a Placement; every rank routes its own tokens, dispatches
// them to the ranks that own their experts with one all-to-all, runs its
// local experts as one grouped FFN, and combines the results back with a
// second all-to-all, summing each token's experts in ascending expert id
// and then the shared expert, the order of one rank, so the output bits do
// not depend on the rank count or the placement.
//
// Comm is the collective interface the transports implement: NewLocal
// connects ranks inside one process; ep/mpi connects processes, and
// ep/ncclcomm does over NCCL; ep/epgpu has the collectives of device
// buffers.
//
// The contract:
//
//   - Every collective takes a context.Context first: a rank that fails,
//     leaves or never arrives gives the others an error by the deadline,
//     never a hang, and breaks the group (errors.Is(err, ErrAborted) on
//     every rank).
//   - Concurrency: a Comm and a Layer belong to their rank's goroutine;
//     ranks run in parallel, one goroutine each (RunLocal).
//   - Buffers: what AllGather and AllToAllV return belongs to the Comm
//     until the rank's next call; a Layer's inputs and outputs are the
//     caller's.
//   - Layer.Close releases the rank's checkpoint mapping; it is safe to
//     call twice.
package ep
