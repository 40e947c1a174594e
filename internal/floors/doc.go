// Package floors states the floors of the house (docs/architecture.md) and
// its test checks that every import of a moex package points down them:
//
//	0 internal/…       helpers every floor may use (but internal/decoderun)
//	1 kernels/…        CPU kernels, CUDA sources, their emulation
//	2 cuda, bindings/… the device runtime; C shims (NCCL by dlopen)
//	3 format/…         weight formats: safetensors folders, GGUF files (untrusted input, no families)
//	3 tokenizer, chat  text ↔ token ids; messages → a prompt through the model's template
//	4 arch             the families: config.json and GGUF metadata → a whole model's config, tensor names
//	5 moe/…            gating, the MoE block (moe/moegpu on a device)
//	6 attn             attention: MLA (and its blocks), the paged KV cache
//	6 ep/…             placement, collectives and their transports (ep/mpi, ep/ncclcomm, ep/epgpu)
//	7 dpattn/…         DP attention: the coordinator, gather/scatter, TP (dpattn/dpattngpu on a device)
//	8 model/…, sim     a whole model; the simulator
//	9 serve/…, router/… the worker; the router (which imports no engine package)
//	9 loadgen/…        the load generator of moex bench serve (an HTTP client)
//	9 internal/decoderun moex run's decode loop over in-process or MPI ranks
//	10 cmd/…           the CLI
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
	"arch":     4,
	"moe":      5,

	"tokenizer": 3,
	"chat":      3,
	"attn":      6,
	"ep":        6,
	"dpattn":    7,
	"model":     8,
	"sim":       8,
	"serve":     9,
	"router":    9,
	"loadgen":   9,

	"internal/decoderun": 9,
	"cmd":                10,
}
