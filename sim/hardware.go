package sim

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
)

// Hardware is one rank's machine: what the step-time formulas divide by.
// Rates are achieved ones (a spec figure times an efficiency measured by a
// named public benchmark), never bare spec sheets; Sources says where each
// came from. Bandwidths are bytes per second one way, FLOP rates dense.
type Hardware struct {
	Name string `json:"name"`
	// Mem is the device memory of one rank, bytes; MemFraction the share
	// of it weights and the KV cache may take (SGLang's
	// mem_fraction_static: the rest is activations, graphs, the runtime).
	Mem         float64 `json:"mem_bytes"`
	MemFraction float64 `json:"mem_fraction"`
	// MemBW is the read bandwidth a streaming kernel reaches (weights of
	// a decode GEMM, the latent cache of MLA decode).
	MemBW float64 `json:"mem_bw"`
	// GEMM is the dense matrix-multiply rate at the weights' dtype where
	// compute-bound, per weight dtype ("bf16", "fp8").
	GEMM map[string]float64 `json:"gemm_flops"`
	// MLA is MLA decode's compute-bound rate (FlashMLA's
	// s_q·Σs_k·h_q·(576+512)·2 FLOPs).
	MLA float64 `json:"mla_flops"`
	// Router is the rate of the router's logits, FLOPs a second (moex's
	// CPU router accumulates in float64, without SIMD); 0: the GEMM rate.
	Router float64 `json:"router_flops,omitempty"`
	// MLARow is MLA decode's cost of a cached row before any head uses it
	// (on the CPU: widening a bf16 row to fp32, 576 values), seconds a row;
	// 0 on GPUs, where reading the row is the cost and MemBW bounds it.
	MLARow float64 `json:"mla_row_s,omitempty"`
	// IntraBW and IntraLatency: a collective's bandwidth per rank (one
	// way) and fixed cost between ranks of one node; InterBW and
	// InterLatency between nodes. RanksPerNode ranks share a node.
	IntraBW      float64 `json:"intra_bw"`
	IntraLatency float64 `json:"intra_latency_s"`
	InterBW      float64 `json:"inter_bw"`
	InterLatency float64 `json:"inter_latency_s"`
	RanksPerNode int     `json:"ranks_per_node"`
	// Shared: the ranks are goroutines of one process on one machine (the
	// cpu preset), its rates measured per rank with every rank running at
	// once: they hold only for the ranks they were measured with.
	Shared  bool     `json:"shared,omitempty"`
	Sources []string `json:"sources,omitempty"`
}

// Efficiencies measured by public benchmarks, applied to spec figures.
const (
	// effMem: FlashMLA reached 3000 GB/s memory-bound on H800, whose HBM3
	// gives 3.35 TB/s (ANCHORS.md); a lent H200 copied at ~4.3 of 4.8 TB/s.
	effMem = 3000.0 / 3350
	// effGEMM: a lent H200 measured ~790 of 989 TFLOP/s in a bf16 GEMM
	// (ANCHORS.md).
	effGEMM = 790.0 / 989
	// effMLA: FlashMLA's 660 TFLOP/s compute-bound of H800's 989 dense
	// bf16 (ANCHORS.md).
	effMLA = 660.0 / 989
	// effLink: DeepEP's intranode dispatch reached 153 GB/s over H800's
	// ~160 GB/s NVLink (DeepEP README, ANCHORS.md).
	effLink = 153.0 / 160
	// effRDMA: DeepEP's internode normal kernels reached 43–58 GB/s per
	// GPU over a 400 Gb/s (50 GB/s) CX7 NIC; 43 at EP16 is taken (DeepEP
	// README).
	effRDMA = 43.0 / 50
)

// Collective latencies: a fixed cost per collective, not measured here.
// DeepEP's low-latency dispatch of 128 tokens at EP8 takes 77 µs at 98
// GB/s (DeepEP README), which bounds an intranode collective's fixed cost
// well below that; 10 µs intranode and 20 µs internode are assumptions,
// printed as such, overridable with --intra-latency and --inter-latency.
const (
	assumedIntraLatency = 10e-6
	assumedInterLatency = 20e-6
)

// gpu builds a GPU preset from spec figures.
func gpu(name string, memGB, hbmTBs, bf16TF, fp8TF, nvlinkGBs, nicGBs float64, source string) Hardware {
	h := Hardware{Name: name, Mem: memGB * 1e9, MemFraction: 0.88, MemBW: hbmTBs * 1e12 * effMem,
		GEMM: map[string]float64{"bf16": bf16TF * 1e12 * effGEMM}, MLA: bf16TF * 1e12 * effMLA,
		IntraBW: nvlinkGBs * 1e9 * effLink, IntraLatency: assumedIntraLatency,
		InterBW: nicGBs * 1e9 * effRDMA, InterLatency: assumedInterLatency, RanksPerNode: 8,
		Sources: []string{source,
			"memory bandwidth × 0.90: FlashMLA 3000 GB/s of H800's 3.35 TB/s (ANCHORS.md)",
			"GEMM × 0.80: a lent H200's ~790 of 989 TFLOP/s bf16 (ANCHORS.md)",
			"MLA compute × 0.67: FlashMLA 660 TFLOP/s of 989 (ANCHORS.md)",
			"NVLink × 0.96: DeepEP intranode 153 GB/s of H800's ~160 (DeepEP README)",
			"NIC × 0.86: DeepEP internode 43 GB/s of 50 (DeepEP README)",
			"collective latency 10 µs intranode, 20 µs internode: assumed, not measured",
			"mem_fraction 0.88: SGLang's mem_fraction_static at TP 8"}}
	if fp8TF > 0 {
		h.GEMM["fp8"] = fp8TF * 1e12 * effGEMM
	}
	return h
}

// GPU presets from NVIDIA's data sheets (SXM parts; dense, no sparsity;
// NVLink one way per GPU: half the quoted bidirectional figure; one
// 400 Gb/s NIC per GPU, 200 Gb/s for A100 systems).
var gpuPresets = map[string]Hardware{
	"h100": gpu("h100", 80, 3.35, 989, 1979, 450, 50,
		"H100 SXM data sheet: 80 GB HBM3 at 3.35 TB/s, 989 TFLOP/s bf16, 1979 fp8, NVLink 900 GB/s; ConnectX-7 400 Gb/s"),
	"h200": gpu("h200", 141, 4.8, 989, 1979, 450, 50,
		"H200 SXM data sheet: 141 GB HBM3e at 4.8 TB/s, 989 TFLOP/s bf16, 1979 fp8, NVLink 900 GB/s; ConnectX-7 400 Gb/s"),
	"a100": gpu("a100", 80, 2.039, 312, 0, 300, 25,
		"A100 80GB SXM data sheet: 2.039 TB/s, 312 TFLOP/s bf16, no fp8, NVLink 600 GB/s; ConnectX-6 200 Gb/s"),
	"b200": gpu("b200", 180, 7.7, 2250, 4500, 900, 50,
		"B200 (HGX B200) data sheet: 180 GB HBM3e at 7.7 TB/s, 2.25 PFLOP/s bf16, 4.5 fp8 dense, NVLink 1.8 TB/s; ConnectX-7 400 Gb/s"),
}

// HardwarePresets lists the hardware presets' names (cpu among them:
// measured on this machine by CalibrateCPU).
func HardwarePresets() []string {
	names := []string{"cpu"}
	for n := range gpuPresets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// GPUPreset is the named GPU preset; an unknown name is an error listing
// the presets.
func GPUPreset(name string) (Hardware, error) {
	h, ok := gpuPresets[strings.ToLower(name)]
	if !ok {
		return Hardware{}, fmt.Errorf("sim: unknown hardware preset %q (presets: %s)", name, strings.Join(HardwarePresets(), ", "))
	}
	h.GEMM = maps.Clone(h.GEMM)
	h.Sources = slices.Clone(h.Sources)
	return h, nil
}

// LoadHardware reads a Hardware from a JSON file; fields it leaves out keep
// base's values.
func LoadHardware(path string, base Hardware) (Hardware, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Hardware{}, fmt.Errorf("sim: hardware file: %w", err)
	}
	h := base
	h.GEMM = maps.Clone(base.GEMM)
	if err := json.Unmarshal(data, &h); err != nil {
		return Hardware{}, fmt.Errorf("sim: hardware file %s: %w", path, err)
	}
	h.Sources = append(h.Sources, "overridden by "+path)
	return h, h.Validate()
}

// Validate names the first field that cannot describe a machine.
func (h Hardware) Validate() error {
	for _, f := range []struct {
		name string
		v    float64
	}{{"mem_bytes", h.Mem}, {"mem_bw", h.MemBW}, {"mla_flops", h.MLA}, {"intra_bw", h.IntraBW}, {"inter_bw", h.InterBW}} {
		if !(f.v > 0) {
			return fmt.Errorf("sim: hardware %q: %s is %v, must be positive", h.Name, f.name, f.v)
		}
	}
	if !(h.MemFraction > 0 && h.MemFraction <= 1) {
		return fmt.Errorf("sim: hardware %q: mem_fraction %v must be in (0, 1]", h.Name, h.MemFraction)
	}
	if h.IntraLatency < 0 || h.InterLatency < 0 {
		return fmt.Errorf("sim: hardware %q: negative collective latency", h.Name)
	}
	if h.RanksPerNode < 1 {
		return fmt.Errorf("sim: hardware %q: ranks_per_node %d must be at least 1", h.Name, h.RanksPerNode)
	}
	if len(h.GEMM) == 0 {
		return fmt.Errorf("sim: hardware %q: no gemm_flops", h.Name)
	}
	for k, v := range h.GEMM {
		if !(v > 0) {
			return fmt.Errorf("sim: hardware %q: gemm_flops[%s] is %v, must be positive", h.Name, k, v)
		}
	}
	return nil
}
