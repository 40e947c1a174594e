// Package floors states the floors of the house (../shared/DESIGN.md) and
// its test checks that every import of a moex package points down them:
//
//	0 internal/…       helpers every floor may use (but internal/decoderun)
//	1 kernels/…        CPU kernels, CUDA sources, their emulation
//	2 cuda, bindings/… the device runtime; C shims (NCCL by dlopen)
//	3 moe/…            configs, checkpoints, gating, the MoE pipeline (moe/moegpu on a device)
//	3 tokenizer, chat  text ↔ token ids; messages → a prompt through the model's template
//	4 ep/…             placement, collectives and their transports (ep/mpi, ep/ncclcomm, ep/epgpu)
//	5 dpattn/…         DP attention (dpattn/dpattngpu on a device)
//	6 model/…          a whole model
//	7 serve/…, router/… the worker; the router (which imports no engine package)
//	7 loadgen/…        the load generator of moex bench serve (an HTTP client)
//	7 internal/decoderun moex run's decode loop over in-process or MPI ranks
//	8 cmd/…            the CLI
//
// A package may import a lower floor, or its own ancestor on its floor (a
// subpackage its parent: moe/moegpu → moe), never a higher floor, a
// sibling or its own subpackage. The check runs over every build
// configuration (default, cuda, cudaemu, mpi, cuda+mpi, purego) and looks
// at the packages' own imports; tests may import upward for their
// references.
package floors

// Floors maps a package path (relative to the module) or the root of a
// tree of packages to its floor; the longest path that names a package or
// one of its ancestors wins.
var Floors = map[string]int{
	"internal": 0,
	"kernels":  1,
	"cuda":     2,
	"bindings": 2,
	"moe":      3,

	"tokenizer": 3,
	"chat":      3,
	"ep":        4,
	"dpattn":    5,
	"model":     6,
	"sim":       6,
	"serve":     7,
	"router":    7,
	"loadgen":   7,

	"internal/decoderun": 7,
	"cmd":                8,
}
