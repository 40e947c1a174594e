// Package floors states the floors of the house (docs/architecture.md) and
// its test checks that every import of a moex package points down them:
//
//	0 internal/…       helpers every floor may use (but internal/decoderun)
//	1 kernels/…        CPU kernels, CUDA sources, their emulation
//	2 cuda, bindings/… the device runtime; C shims (NCCL by dlopen)
//	3 format/…         weight formats: safetensors folders, GGUF files (untrusted input, no families)
//	3 tokenizer, chat  text ↔ token ids; messages → a prompt through the model's template
//	4 moe/…            configs, gating, the MoE pipeline (moe/moegpu on a device)
//	5 ep/…             placement, collectives and their transports (ep/mpi, ep/ncclcomm, ep/epgpu)
//	6 dpattn/…         DP attention (dpattn/dpattngpu on a device)
//	7 model/…, sim     a whole model; the simulator
//	8 serve/…, router/… the worker; the router (which imports no engine package)
//	8 loadgen/…        the load generator of moex bench serve (an HTTP client)
//	8 internal/decoderun moex run's decode loop over in-process or MPI ranks
//	9 cmd/…            the CLI
//
// A package may import a lower floor, or its own ancestor on its floor (a
// subpackage its parent: moe/moegpu → moe, format/gguf → format), never a
// higher floor, a sibling or its own subpackage. The check runs over every
// build configuration (default, cuda, cudaemu, mpi, cuda+mpi, purego) and
// looks at the packages' own imports; tests may import upward for their
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
	"format":   3,
	"moe":      4,

	"tokenizer": 3,
	"chat":      3,
	"ep":        5,
	"dpattn":    6,
	"model":     7,
	"sim":       7,
	"serve":     8,
	"router":    8,
	"loadgen":   8,

	"internal/decoderun": 8,
	"cmd":                9,
}
