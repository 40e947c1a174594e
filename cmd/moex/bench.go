package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/moex-project/moex/attn"
	"github.com/moex-project/moex/ep"
	"github.com/moex-project/moex/internal/half"
	"github.com/moex-project/moex/internal/memlimit"
	"github.com/moex-project/moex/kernels"
	"github.com/moex-project/moex/moe"
)

const benchUsage = `usage:
  moex bench model (--model DIR_OR_GGUF | --preset tiny|deepseek-v2-lite|qwen3-30b-a3b|gpt-oss-20b [--layers N]
                   [--dtype bf16|q4_k_m|q8_0|mxfp4|fp8]) [-p 512] [-n 128] [--threads T] [--kv bf16|f16|f32]
                   [--numerics exact|int8dot] [--rounds 3] [--format table|json]
                   a whole model as llama-bench times it: pp (one prompt from an empty cache), tg (single-token
                   steps after it), tg's weight bytes against the memory's read bandwidth
  moex bench grouped-gemm --experts E --tokens-per-expert M[,M...] --n N --k K [--dtype f32|bf16|f16|fp8|mxfp4|int4[,...]]
                          [--threads T[,...]] [--impl auto|generic|avx2|avx512[,...]] [--format table|json]
  moex bench moe (--model DIR --layer N | --preset deepseek-v2-lite|gpt-oss-20b) --tokens T[,...] [--dtype bf16[,fp8,...]]
                 [--threads T[,...]] [--impl ...] [--format table|json]
  moex bench mla (--model DIR --layer N | --preset deepseek-v2-lite) --tokens T[,...] --context C[,...]
                 [--threads T[,...]] [--impl ...] [--format table|json]   a decode step of the MLA block
  moex bench ep [--ranks 1,2,4,8] [--tokens 16,128,1024]   dispatch+combine of a DeepSeek-V2-Lite-shaped
                 layer over in-process ranks, against a memcpy of the same bytes
  moex bench membw   the memory-bandwidth probe alone
  moex bench serve [--url http://127.0.0.1:30000] [--dataset generated-shared-prefix|random] [--groups 16]
                 [--prompts-per-group 8] [--system-len 1024] [--question-len 64] [--zipf S] [--num-prompts N]
                 [--input-len L] [--output-len 32] [--rate inf|R] [--concurrency N] [--input-ids] [--format table|json]
                 a load generator against a worker or router: throughput, TTFT/TPOT/ITL percentiles, hit rate
`

// benchResult is one case of a benchmark, as printed by --format json.
type benchResult struct {
	Bench      string  `json:"bench"`
	Case       string  `json:"case"`
	Impl       string  `json:"impl"`
	Threads    int     `json:"threads"`
	Dtype      string  `json:"dtype,omitempty"`
	Runs       int     `json:"runs"`
	MedianNS   int64   `json:"median_ns"`
	MinNS      int64   `json:"min_ns"`
	GFLOPS     float64 `json:"gflops"`
	Bytes      int64   `json:"bytes"`
	GBPS       float64 `json:"gbps"`
	ProbeGBPS  float64 `json:"probe_gbps"`
	BWFraction float64 `json:"bw_fraction"`
	// Where a run times several dtypes: the case's speed against the first
	// dtype's on the same case, implementation and threads (its median
	// over this one's), and that dtype.
	Speedup   float64 `json:"speedup,omitempty"`
	SpeedupVs string  `json:"speedup_vs,omitempty"`
	// bf16dot rows: the vdpbf16ps peak measured on the row's threads in
	// the same run (GFLOP/s), and the row's GFLOP/s over it.
	BF16DotPeak float64 `json:"bf16dot_peak_gflops,omitempty"`
	OfBF16Peak  float64 `json:"of_bf16dot_peak,omitempty"`
	// bench ep only: time per token, and a memcpy of the same bytes.
	NsPerToken float64 `json:"ns_per_token,omitempty"`
	MemcpyNS   int64   `json:"memcpy_ns,omitempty"`
	VsMemcpy   float64 `json:"speed_vs_memcpy,omitempty"`
}

type benchOpts struct {
	maxBytes float64 // --max-memory-gib, in bytes
	threads  []int
	impls    []string
	format   string
	minTime  time.Duration
	maxRuns  int
	stderr   io.Writer
	start    time.Time
}

func (o *benchOpts) register(fs *flag.FlagSet) func() error {
	threads := fs.String("threads", strconv.Itoa(runtime.GOMAXPROCS(0)), "goroutines, comma-separated list")
	impls := fs.String("impl", "auto", "kernel implementations, comma-separated: auto, generic, avx2, avx512")
	common := o.registerCommon(fs, "bench")
	return func() error {
		if err := common(); err != nil {
			return err
		}
		var err error
		if o.threads, err = intList(*threads, "--threads"); err != nil {
			return err
		}
		if t := slices.Max(o.threads); t > maxGoroutineRanks {
			return fmt.Errorf("%w: bench: --threads %d is over the %d goroutines a case may use", errUsage, t, maxGoroutineRanks)
		}
		o.impls = strings.Split(*impls, ",")
		return nil
	}
}

// registerCommon adds the flags every benchmark takes (--format,
// --min-time, --max-runs, --max-memory-gib) and returns their check, whose
// errors name the benchmark as name.
func (o *benchOpts) registerCommon(fs *flag.FlagSet, name string) func() error {
	fs.StringVar(&o.format, "format", "table", "table or json (one object per line)")
	fs.DurationVar(&o.minTime, "min-time", time.Second, "time each case at least this long")
	fs.IntVar(&o.maxRuns, "max-runs", 1000, "at most this many timed runs per case")
	maxGiB := fs.Float64("max-memory-gib", float64(memlimit.Machine())/(1<<30), "refuse cases needing more memory than this (default: the machine's)")
	return func() error {
		if !(*maxGiB > 0) || math.IsInf(*maxGiB, 0) {
			return fmt.Errorf("%w: %s: --max-memory-gib %v must be a positive finite number", errUsage, name, *maxGiB)
		}
		if machine := float64(memlimit.Machine()) / (1 << 30); *maxGiB > machine {
			return fmt.Errorf("%w: %s: --max-memory-gib %v is over this machine's %.1f GiB (past it the process dies out of memory rather than failing)", errUsage, name, *maxGiB, machine)
		}
		o.maxBytes = *maxGiB * (1 << 30)
		if o.minTime < 0 {
			return fmt.Errorf("%w: %s: --min-time %v must not be negative", errUsage, name, o.minTime)
		}
		if o.format != "table" && o.format != "json" {
			return fmt.Errorf("%w: %s: --format %q (want table or json)", errUsage, name, o.format)
		}
		if o.maxRuns < 1 {
			return fmt.Errorf("%w: %s: --max-runs must be ≥ 1", errUsage, name)
		}
		return nil
	}
}

// fits refuses, before anything is allocated, a case whose estimated
// memory is over --max-memory-gib.
func (o *benchOpts) fits(bench string, bytes float64) error {
	if bytes > o.maxBytes {
		return fmt.Errorf("%w: bench %s: these sizes need about %.1f GiB, over --max-memory-gib %.1f (default: the machine's memory): %w",
			errUsage, bench, bytes/(1<<30), o.maxBytes/(1<<30), memlimit.ErrTooLarge)
	}
	return nil
}

func intList(s, name string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 0 {
			return nil, fmt.Errorf("%w: %s %q is not a list of non-negative integers", errUsage, name, s)
		}
		out = append(out, v)
	}
	return out, nil
}

func cmdBench(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, benchUsage)
		return fmt.Errorf("%w: bench needs a benchmark: model, grouped-gemm, moe, mla, ep, membw or serve", errUsage)
	}
	opts := &benchOpts{stderr: stderr, start: time.Now()}
	var results []benchResult
	var err error
	switch args[0] {
	case "grouped-gemm":
		results, err = benchGroupedGEMM(args[1:], opts)
	case "moe":
		results, err = benchMoE(args[1:], opts)
	case "mla":
		results, err = benchMLA(args[1:], opts)
	case "ep":
		results, err = benchEP(args[1:], opts)
	case "serve":
		return benchServe(args[1:], stdout, stderr)
	case "model":
		return benchModel(args[1:], stdout, opts)
	case "membw":
		fs := flag.NewFlagSet("bench membw", flag.ContinueOnError)
		if err := parseFlags(fs, args[1:], stderr); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "memory read bandwidth: %.1f GB/s\n", memoryBandwidth())
		return nil
	default:
		fmt.Fprint(stderr, benchUsage)
		return fmt.Errorf("%w: bench: unknown benchmark %q (have model, grouped-gemm, moe, mla, ep, membw, serve)", errUsage, args[0])
	}
	if err != nil {
		return err
	}
	return printResults(stdout, opts.format, results)
}

func printResults(w io.Writer, format string, rs []benchResult) error {
	compareDtypes(rs)
	if format == "json" {
		enc := json.NewEncoder(w)
		for _, r := range rs {
			if err := enc.Encode(r); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	if len(rs) > 0 && rs[0].Bench == "ep" {
		fmt.Fprintln(tw, "case\tmedian\tns/token\tGB/s\tmemcpy same bytes\tspeed vs memcpy\t")
		for _, r := range rs {
			vs := "-" // nothing moved: no ratio
			if r.VsMemcpy > 0 {
				vs = fmt.Sprintf("%.2f×", r.VsMemcpy)
			}
			fmt.Fprintf(tw, "%s\t%v\t%.0f\t%.1f\t%v\t%s\t\n", r.Case, time.Duration(r.MedianNS).Round(time.Microsecond),
				r.NsPerToken, r.GBPS, time.Duration(r.MemcpyNS).Round(time.Microsecond), vs)
		}
		return tw.Flush()
	}
	ratios := len(rs) > 0 && rs[0].SpeedupVs != ""
	peaks := slices.ContainsFunc(rs, func(r benchResult) bool { return r.BF16DotPeak > 0 })
	head := "case\tdtype\timpl\tthreads\tmedian\tGFLOP/s\tGB/s\tof membw\t"
	if ratios {
		head += "vs " + rs[0].SpeedupVs + "\t"
	}
	if peaks {
		head += "of bf16-dot peak\t"
	}
	fmt.Fprintln(tw, head)
	probes := map[float64]bool{}
	for _, r := range rs {
		frac := fmt.Sprintf("%.0f%%", 100*r.BWFraction)
		if r.ProbeGBPS == 0 || r.Bytes == 0 {
			frac = "-"
		} else {
			probes[r.ProbeGBPS] = true
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%v\t%.1f\t%.1f\t%s\t", r.Case, r.Dtype, r.Impl, r.Threads,
			time.Duration(r.MedianNS).Round(time.Microsecond), r.GFLOPS, r.GBPS, frac)
		if ratios {
			fmt.Fprintf(tw, "%.2f×\t", r.Speedup)
		}
		if peaks {
			if r.BF16DotPeak > 0 {
				fmt.Fprintf(tw, "%.0f%% of %.0f\t", 100*r.OfBF16Peak, r.BF16DotPeak)
			} else {
				fmt.Fprint(tw, "-\t")
			}
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(probes) > 0 {
		lo, hi := math.Inf(1), 0.0
		for p := range probes {
			lo, hi = min(lo, p), max(hi, p)
		}
		if lo == hi {
			fmt.Fprintf(w, "memory read-bandwidth probe: %.1f GB/s\n", lo)
		} else {
			fmt.Fprintf(w, "memory read-bandwidth probe: %.1f-%.1f GB/s (each round against the higher of the readings before and after it)\n", lo, hi)
		}
	}
	return nil
}

// compareDtypes sets, where rs holds more than one dtype, each result's
// speed against the first dtype's on the same case (the dtype left out of
// the case's name), implementation and threads.
func compareDtypes(rs []benchResult) {
	if len(rs) == 0 {
		return
	}
	first := rs[0].Dtype
	several := false
	for _, r := range rs {
		several = several || r.Dtype != first
	}
	if !several {
		return
	}
	type key struct {
		bench, kase, impl string
		threads           int
	}
	base := map[key]int64{}
	for _, r := range rs {
		if r.Dtype == first {
			base[key{r.Bench, r.Case, r.Impl, r.Threads}] = r.MedianNS
		}
	}
	for i := range rs {
		if b, ok := base[key{rs[i].Bench, rs[i].Case, rs[i].Impl, rs[i].Threads}]; ok && rs[i].MedianNS > 0 {
			rs[i].Speedup = float64(b) / float64(rs[i].MedianNS)
			rs[i].SpeedupVs = first
		}
	}
}

// forEachSetting runs f under every (impl, threads) pair of the options.
func (o *benchOpts) forEachSetting(f func(impl string, threads int) error) error {
	for _, impl := range o.impls {
		restore, err := kernels.Use(impl)
		if err != nil {
			return err
		}
		name := kernels.Implementation()
		for _, th := range o.threads {
			if th == 0 {
				th = runtime.GOMAXPROCS(0)
			}
			prev := runtime.GOMAXPROCS(th)
			err = f(name, th)
			runtime.GOMAXPROCS(prev)
			if err != nil {
				break
			}
		}
		restore()
		if err != nil {
			return err
		}
	}
	return nil
}

// time runs fn once to warm up, then until minTime has passed (at least
// three runs, at most maxRuns), and returns the sorted run times.
func (o *benchOpts) time(label string, fn func() error) ([]time.Duration, error) {
	if err := fn(); err != nil {
		return nil, err
	}
	var ts []time.Duration
	begin := time.Now()
	for len(ts) < o.maxRuns && (len(ts) < 3 || time.Since(begin) < o.minTime) {
		t0 := time.Now()
		if err := fn(); err != nil {
			return nil, err
		}
		ts = append(ts, time.Since(t0))
	}
	slices.Sort(ts)
	if time.Since(o.start) > 3*time.Second {
		fmt.Fprintf(o.stderr, "bench: %s: %d runs, median %v (%v elapsed)\n", label, len(ts),
			ts[len(ts)/2].Round(time.Microsecond), time.Since(o.start).Round(time.Second))
	}
	return ts, nil
}

func dtypeOf(s string) (kernels.DType, error) {
	switch s {
	case "f32":
		return kernels.F32, nil
	case "bf16":
		return kernels.BF16, nil
	case "f16":
		return kernels.F16, nil
	case "fp8":
		return kernels.F8E4M3, nil
	case "mxfp4":
		return kernels.MXFP4, nil
	case "int4":
		return kernels.INT4, nil
	case "uint4", "q4_k_m", "q4_k", "q4_1": // GGUF's Q4_K and Q4_1 as moex holds them: nibbles with a scale and an offset per 32
		return kernels.UINT4, nil
	case "int8", "q8_0":
		return kernels.INT8, nil
	case "q4_0":
		return kernels.INT4, nil
	}
	return 0, fmt.Errorf("%w: bench: dtype %q (want f32, bf16, f16, fp8, mxfp4, int4, uint4 or int8, or GGUF's names q4_k_m, q4_k, q4_1, q4_0, q8_0)", errUsage, s)
}

// randomMatrix makes a [rows, cols] matrix of dtype, uniform in
// ±1/√cols (as moe.NewRandom's: quantized, its scales are normal fp16
// values, as in GGUF files).
func randomMatrix(rng *rand.Rand, dt kernels.DType, rows, cols int) (kernels.Matrix, error) {
	a := float32(1 / math.Sqrt(float64(max(1, cols))))
	if dt.Quantized() {
		v := make([]float32, rows*cols)
		for i := range v {
			v[i] = (2*rng.Float32() - 1) * a
		}
		return kernels.Quantize(dt, v, rows, cols)
	}
	if dt == kernels.F32 {
		v := make([]float32, rows*cols)
		for i := range v {
			v[i] = (2*rng.Float32() - 1) * a
		}
		return kernels.NewF32(rows, cols, v)
	}
	conv := half.F32ToBF16
	if dt == kernels.F16 {
		conv = half.F32ToF16
	}
	v := make([]uint16, rows*cols)
	for i := range v {
		v[i] = conv((2*rng.Float32() - 1) * a)
	}
	return kernels.NewHalf(dt, rows, cols, v)
}

func benchGroupedGEMM(args []string, o *benchOpts) ([]benchResult, error) {
	fs := flag.NewFlagSet("bench grouped-gemm", flag.ContinueOnError)
	experts := fs.Int("experts", 8, "experts (groups)")
	tokens := fs.String("tokens-per-expert", "16,64,256", "rows per expert, comma-separated list")
	n := fs.Int("n", 2816, "output columns (weight rows)")
	k := fs.Int("k", 2048, "reduction length")
	dtypes := fs.String("dtype", "f32", "weight dtypes, comma-separated: f32, bf16, f16, fp8 (e4m3, 128×128 block scales), mxfp4, int4 (groups of 32, fp16 scales: Q4_0), uint4 (groups of 32 with offsets: GGUF's Q4_1 and Q4_K as moex holds them), int8 (groups of 32: Q8_0)")
	layout := fs.String("layout", "packed", "weight layout: packed (in panels, as layers keep their experts) or rows (row-major, as checkpoints store them)")
	numerics := fs.String("numerics", "exact", "numerics modes, comma-separated: exact, int8dot (uint4, int8, mxfp4 and int4 weights), bf16dot (bf16 weights); a dtype is timed in the modes it has, packed")
	finish := o.register(fs)
	if err := parseFlags(fs, args, o.stderr); err != nil {
		return nil, err
	}
	if err := finish(); err != nil {
		return nil, err
	}
	ms, err := intList(*tokens, "--tokens-per-expert")
	if err != nil {
		return nil, err
	}
	if *experts < 1 || *n < 1 || *k < 1 {
		return nil, fmt.Errorf("%w: bench grouped-gemm: --experts, --n and --k must be positive", errUsage)
	}
	if *layout != "packed" && *layout != "rows" {
		return nil, fmt.Errorf("%w: bench grouped-gemm: --layout %q (want packed or rows)", errUsage, *layout)
	}
	modes, err := numericsList(*numerics, "bench grouped-gemm")
	if err != nil {
		return nil, err
	}
	if *layout != "packed" && slices.ContainsFunc(modes, func(n kernels.Numerics) bool { return n != kernels.Exact }) {
		return nil, fmt.Errorf("%w: bench grouped-gemm: --numerics other than exact pack their weights: --layout packed", errUsage)
	}
	maxM := slices.Max(ms)
	for _, ds := range strings.Split(*dtypes, ",") {
		dt, err := dtypeOf(ds)
		if err != nil {
			return nil, err
		}
		// The weights, their fp32 originals while made, the rows and outputs.
		e, n, k := float64(*experts), float64(*n), float64(*k)
		if err := o.fits("grouped-gemm", e*n*k*(float64(dt.Bits())/8+4)+e*float64(maxM)*(n+k)*4); err != nil {
			return nil, err
		}
	}
	probe := memoryBandwidth()
	rng := rand.New(rand.NewPCG(1, 2))
	var results []benchResult
	for _, ds := range strings.Split(*dtypes, ",") {
		dt, err := dtypeOf(ds)
		if err != nil {
			return nil, err
		}
		raw := make([]kernels.Matrix, *experts)
		for e := range raw {
			if raw[e], err = randomMatrix(rng, dt, *n, *k); err != nil {
				return nil, fmt.Errorf("%w: bench grouped-gemm: --n %d (rows) × --k %d (columns) in %v: %w", errUsage, *n, *k, dt, err)
			}
		}
		for _, mode := range modes {
			if !hasMode(dt, mode) {
				continue
			}
			bs := make([]kernels.Matrix, *experts)
			for e := range bs {
				bs[e] = raw[e]
				if *layout == "packed" {
					if bs[e], err = mode.Pack(raw[e]); err != nil {
						return nil, err
					}
				}
			}
			label := ds
			if mode != kernels.Exact {
				label += "+" + mode.String()
			}
			rs, err := benchGroupedCase(o, rng, bs, ms, *experts, *n, *k, *layout, label, probe, mode)
			if err != nil {
				return nil, err
			}
			results = append(results, rs...)
		}
	}
	return results, nil
}

// benchGroupedCase times the grouped GEMM on the weights bs at each rows
// count of ms; bf16dot rows get the vdpbf16ps peak on their threads.
func benchGroupedCase(o *benchOpts, rng *rand.Rand, bs []kernels.Matrix, ms []int, experts, n, k int, layout, dtype string, probe float64,
	mode kernels.Numerics) ([]benchResult, error) {
	var results []benchResult
	for _, m := range ms {
		a := make([]float32, experts*m*k)
		for i := range a {
			a[i] = 2*rng.Float32() - 1
		}
		groups := make([]kernels.GEMMGroup, experts)
		for e := range groups {
			rows := make([]int32, m)
			for r := range rows {
				rows[r] = int32(e*m + r)
			}
			groups[e] = kernels.GEMMGroup{B: bs[e], Rows: rows, Out: make([]float32, m*n)}
		}
		flops := 2 * float64(experts) * float64(m) * float64(n) * float64(k)
		bytes := int64(experts) * (bs[0].Bytes() + int64(m)*int64(k)*4 + int64(m)*int64(n)*4)
		if m == 0 {
			bytes = 0 // nothing is read: no bandwidth to report
		}
		label := fmt.Sprintf("E=%d M=%d N=%d K=%d %s", experts, m, n, k, layout)
		err := o.forEachSetting(func(impl string, threads int) error {
			ts, err := o.time(label+" "+dtype+" "+impl, func() error {
				return kernels.GroupedGEMM(context.Background(), threads, a, groups)
			})
			if err != nil {
				return err
			}
			results = append(results, withPeak(makeResult("grouped-gemm", label, impl, dtype, threads, ts, flops, bytes, probe), mode))
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return results, nil
}

// withPeak gives a bf16dot result the vdpbf16ps peak measured now on its
// threads, and its GFLOP/s over it.
func withPeak(r benchResult, mode kernels.Numerics) benchResult {
	if mode == kernels.BF16Dot {
		if peak, ok := kernels.BF16DotPeak(r.Threads, 200*time.Millisecond); ok {
			r.BF16DotPeak, r.OfBF16Peak = peak, r.GFLOPS/peak
		}
	}
	return r
}

// numericsList parses a comma-separated --numerics.
func numericsList(list, cmd string) ([]kernels.Numerics, error) {
	var modes []kernels.Numerics
	for _, n := range strings.Split(list, ",") {
		mode, err := kernels.ParseNumerics(n)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", errUsage, cmd, err)
		}
		modes = append(modes, mode)
	}
	return modes, nil
}

func makeResult(bench, label, impl, dtype string, threads int, ts []time.Duration, flops float64, bytes int64, probe float64) benchResult {
	med := max(ts[len(ts)/2], time.Nanosecond) // a clock tick can read zero
	gbps := float64(bytes) / med.Seconds() / 1e9
	return benchResult{
		Bench: bench, Case: label, Impl: impl, Threads: threads, Dtype: dtype, Runs: len(ts),
		MedianNS: med.Nanoseconds(), MinNS: ts[0].Nanoseconds(),
		GFLOPS: flops / med.Seconds() / 1e9, Bytes: bytes, GBPS: gbps,
		ProbeGBPS: probe, BWFraction: gbps / max(probe, 1e-300),
	}
}

// hasMode says whether weights of dtype dt have numerics mode n.
func hasMode(dt kernels.DType, n kernels.Numerics) bool {
	switch n {
	case kernels.Int8Dot:
		return dt == kernels.UINT4 || dt == kernels.INT8 || dt == kernels.MXFP4 || dt == kernels.INT4
	case kernels.BF16Dot:
		return dt == kernels.BF16
	}
	return true
}

// layerDType names a layer's expert dtype, with its numerics mode where
// that is not the exact one (UINT4+int8dot).
func layerDType(l *moe.Layer) string {
	if n := l.Numerics(); n != kernels.Exact {
		return l.WeightDType().String() + "+" + n.String()
	}
	return l.WeightDType().String()
}

func benchMoE(args []string, o *benchOpts) ([]benchResult, error) {
	fs := flag.NewFlagSet("bench moe", flag.ContinueOnError)
	model := fs.String("model", "", "checkpoint folder")
	layerIdx := fs.Int("layer", 1, "MoE layer of --model")
	preset := fs.String("preset", "", "built-in shape with random weights: deepseek-v2-lite, gpt-oss-20b")
	tokens := fs.String("tokens", "1,4,16", "tokens per forward pass, comma-separated list")
	dtype := fs.String("dtype", "bf16", "dtypes of the preset's random weights, comma-separated: f32, bf16, f16, fp8 (experts e4m3 with 128×128 block scales), mxfp4, int4 (experts in groups of 32, fp16 scales: Q4_0), uint4 (groups of 32 with offsets: GGUF's Q4_1 and Q4_K as moex holds them), int8 (groups of 32: Q8_0); the router of a quantized layer stays bf16")
	seed := fs.Uint64("seed", 1, "seed of random weights and inputs")
	backend := fs.String("backend", "cpu", "cpu, or cuda: the layer on the GPU, eager and as a replayed CUDA graph (needs a `make cuda` build)")
	numerics := fs.String("numerics", "exact", "numerics modes, comma-separated: exact, int8dot (llama.cpp's: activations rounded to int8 per 32, integer dot products; uint4, int8, mxfp4 and int4 experts), bf16dot (activations rounded to bf16, vdpbf16ps pairs; bf16 experts); cpu; a dtype is timed in the modes it has")
	finish := o.register(fs)
	if err := parseFlags(fs, args, o.stderr); err != nil {
		return nil, err
	}
	if err := finish(); err != nil {
		return nil, err
	}
	modes, err := numericsList(*numerics, "bench moe")
	if err != nil {
		return nil, err
	}
	if *backend != "cpu" && slices.ContainsFunc(modes, func(n kernels.Numerics) bool { return n != kernels.Exact }) {
		return nil, fmt.Errorf("%w: bench moe: --numerics other than exact run on --backend cpu", errUsage)
	}
	ts, err := intList(*tokens, "--tokens")
	if err != nil {
		return nil, err
	}
	name, err := benchSource("moe", *model, *preset, *layerIdx, "deepseek-v2-lite", "gpt-oss-20b")
	if err != nil {
		return nil, err
	}
	dtypeSet := false
	fs.Visit(func(f *flag.Flag) { dtypeSet = dtypeSet || f.Name == "dtype" })
	if dtypeSet && *model != "" {
		return nil, fmt.Errorf("%w: bench moe: --dtype is for --preset's random weights; a --model runs in its checkpoint's dtypes", errUsage)
	}
	presetConfig, presetName := moe.DeepSeekV2Lite, "DeepSeek-V2-Lite"
	if *preset == "gpt-oss-20b" {
		presetConfig, presetName = moe.GptOss20B, "gpt-oss-20b"
	}
	// A forward pass's rows, outputs and expert activations, twice over
	// for the scratch, and a preset's layers in their dtypes (made from fp32).
	c := presetConfig()
	if *model != "" {
		if c, err = moe.LoadConfig(*model); err != nil {
			return nil, err
		}
	}
	h, top, inter, si := float64(c.Hidden), float64(c.TopK), float64(c.Inter), float64(c.SharedInter)
	need := 2 * float64(slices.Max(ts)) * (2*h + top*(3*inter+h) + 3*si) * 4
	if *model == "" {
		weights := float64(c.NumExperts) * 3 * h * inter
		need += 4 * weights // the fp32 originals of the layer being made
		for _, ds := range strings.Split(*dtype, ",") {
			if dt, err := dtypeOf(ds); err == nil {
				need += weights * float64(dt.Bits()) / 8
			}
		}
	}
	if err := o.fits("moe", need); err != nil {
		return nil, err
	}
	var layers []*moe.Layer
	defer func() {
		for _, l := range layers {
			l.Close()
		}
	}()
	// keep adds a layer just made (or its error) to those timed, in mode.
	keep := func(l *moe.Layer, err error, mode kernels.Numerics) error {
		if err != nil {
			return err
		}
		layers = append(layers, l)
		return l.SetNumerics(mode)
	}
	if *model != "" {
		for _, mode := range modes {
			l, err := moe.Load(*model, *layerIdx)
			if err := keep(l, err, mode); err != nil {
				return nil, err
			}
		}
		return benchMoELayers(layers, name, ts, *backend, o, *seed)
	}
	for _, ds := range strings.Split(*dtype, ",") {
		dt, err := dtypeOf(ds)
		if err != nil {
			return nil, err
		}
		for _, mode := range modes {
			if !hasMode(dt, mode) {
				continue // no such mode for the dtype
			}
			fmt.Fprintf(o.stderr, "bench: making a %s-shaped layer with random %s weights (%v numerics)\n", presetName, ds, mode)
			l, err := moe.NewRandom(presetConfig(), dt, *seed)
			if err := keep(l, err, mode); err != nil {
				return nil, err
			}
		}
	}
	return benchMoELayers(layers, name, ts, *backend, o, *seed)
}

// benchMoELayers times the layers' forward passes of ts tokens on backend.
// On the CPU each token count is a round: the read-bandwidth probe, every
// layer (one per dtype) on the same input, the probe again (the rows are
// against the higher of the two readings), so that the ratios
// between dtypes and against the probe are measured a minute apart at
// most rather than across the whole run.
func benchMoELayers(ls []*moe.Layer, name string, ts []int, backend string, o *benchOpts, seed uint64) ([]benchResult, error) {
	switch backend {
	case "cpu":
	case "cuda":
		var results []benchResult
		for _, l := range ls {
			rs, err := benchMoEOnDevice(l, name, ts, o, seed)
			if err != nil {
				return nil, err
			}
			results = append(results, rs...)
		}
		return results, nil
	default:
		return nil, fmt.Errorf("%w: bench moe: --backend %q (want cpu or cuda)", errUsage, backend)
	}
	c := ls[0].Config
	rng := rand.New(rand.NewPCG(seed, 7))
	var results []benchResult
	for _, T := range ts {
		probe := memoryBandwidth()
		first := len(results) // this round's rows
		x, y, ids := moeCase(rng, c, T)
		// Random token ids, for a layer that routes by them (a hash layer).
		var tokens []int32
		if c.VocabSize > 0 {
			tokens = make([]int32, T)
			for t := range tokens {
				tokens[t] = int32(rng.IntN(c.VocabSize))
			}
		}
		label := fmt.Sprintf("%s T=%d", name, T)
		for _, l := range ls {
			if err := l.ForwardTokens(context.Background(), x, tokens, y, ids, nil); err != nil {
				return nil, err
			}
			bytes := l.WeightBytesRead(ids) + int64(len(x)+len(y))*4
			if T == 0 {
				bytes = 0 // nothing is read: no bandwidth to report
			}
			err := o.forEachSetting(func(impl string, threads int) error {
				l.SetWorkers(threads)
				times, err := o.time(label+" "+layerDType(l)+" "+impl, func() error {
					return l.ForwardTokens(context.Background(), x, tokens, y, nil, nil)
				})
				if err != nil {
					return err
				}
				results = append(results, withPeak(makeResult("moe", label, impl, layerDType(l), threads, times, c.FLOPs(T), bytes, probe), l.Numerics()))
				return nil
			})
			if err != nil {
				return nil, err
			}
		}
		// The probe again after the round: the rows are against the
		// higher reading, so that a neighbour's burst during one probe
		// does not make a row read over 100 %.
		if after := memoryBandwidth(); after > probe {
			for i := first; i < len(results); i++ {
				r := &results[i]
				r.ProbeGBPS, r.BWFraction = after, r.GBPS/after
			}
		}
	}
	return results, nil
}

// benchMLA times a decode step of the MLA block (bf16 latent cache): tokens
// sequences of context cached rows each take one token, projections and
// attention; bytes are the projection weights and the cache rows read.
func benchMLA(args []string, o *benchOpts) ([]benchResult, error) {
	fs := flag.NewFlagSet("bench mla", flag.ContinueOnError)
	model := fs.String("model", "", "checkpoint folder")
	layerIdx := fs.Int("layer", 1, "layer of --model")
	preset := fs.String("preset", "", "built-in shape with random bf16 weights: deepseek-v2-lite")
	tokens := fs.String("tokens", "1,16", "sequences decoding a token each, comma-separated list")
	contexts := fs.String("context", "512,4096", "cached rows per sequence, comma-separated list")
	seed := fs.Uint64("seed", 1, "seed of random weights, cache rows and inputs")
	finish := o.register(fs)
	if err := parseFlags(fs, args, o.stderr); err != nil {
		return nil, err
	}
	if err := finish(); err != nil {
		return nil, err
	}
	ts, err := intList(*tokens, "--tokens")
	if err != nil {
		return nil, err
	}
	cs, err := intList(*contexts, "--context")
	if err != nil {
		return nil, err
	}
	if slices.Min(ts) < 1 || slices.Min(cs) < 0 {
		return nil, fmt.Errorf("%w: bench mla: --tokens must be positive and --context not negative", errUsage)
	}
	name, err := benchSource("mla", *model, *preset, *layerIdx, "deepseek-v2-lite")
	if err != nil {
		return nil, err
	}
	{
		// The largest case's cache (bf16 rows of kv_lora_rank + rope, at
		// most DeepSeek-V3's 576 per row, with room for the timed steps)
		// and its activations, in float64 so that no size overflows.
		T, C := float64(slices.Max(ts)), float64(slices.Max(cs))
		need := T*(C+float64(o.maxRuns)+65)*576*2 + T*7168*4*8
		if err := o.fits("mla", need); err != nil {
			return nil, fmt.Errorf("%w (--tokens %d × --context %d)", err, slices.Max(ts), slices.Max(cs))
		}
	}
	var blk *attn.MLABlock
	if *model != "" {
		if blk, err = attn.LoadMLABlock(*model, *layerIdx); err != nil {
			return nil, err
		}
		defer blk.Close()
	} else if blk, err = attn.NewRandomMLABlock(attn.DeepSeekV2LiteAttention(), kernels.BF16, *seed); err != nil {
		return nil, err
	}
	probe := memoryBandwidth()
	rng := rand.New(rand.NewPCG(*seed, 11))
	const blockRows = 64
	latent := blk.RowDim()
	var results []benchResult
	for _, C := range cs {
		for _, T := range ts {
			x := make([]float32, T*blk.HiddenSize())
			for i := range x {
				x[i] = 2*rng.Float32() - 1
			}
			out := make([]float32, len(x))
			seqs := make([]int, T)
			for i := range seqs {
				seqs[i] = i
			}
			label := fmt.Sprintf("%s T=%d ctx=%d", name, T, C)
			bytes := blk.WeightBytes() + int64(T)*int64(C)*int64(latent)*2
			err := o.forEachSetting(func(impl string, threads int) error {
				// A fresh cache per setting, with room for every timed step
				// (each appends a row to every sequence).
				per := (C + o.maxRuns + 1 + blockRows - 1) / blockRows
				cache, err := attn.NewCache(T*per, blockRows, latent, kernels.BF16)
				if err != nil {
					return err
				}
				rows := make([]float32, C*latent)
				for s := range seqs {
					for i := range rows {
						rows[i] = float32(rng.NormFloat64())
					}
					if err := cache.Append(s, rows); err != nil {
						return err
					}
				}
				times, err := o.time(label+" "+impl, func() error { return blk.Forward(context.Background(), cache, seqs, x, out) })
				if err != nil {
					return err
				}
				results = append(results, makeResult("mla", label, impl, "bf16", threads, times, blk.DecodeFLOPs(T, C), bytes, probe))
				return nil
			})
			if err != nil {
				return nil, err
			}
		}
	}
	return results, nil
}

// benchSource checks a benchmark's --model and --preset and names its
// cases: the model's layer, or the preset.
func benchSource(bench, model, preset string, layer int, presets ...string) (string, error) {
	switch {
	case model != "" && preset != "":
		return "", fmt.Errorf("%w: bench %s: give --model or --preset, not both", errUsage, bench)
	case model != "":
		return fmt.Sprintf("%s:%d", model, layer), nil
	case slices.Contains(presets, preset) && layer != 1:
		return "", fmt.Errorf("%w: bench %s: --layer %d is for --model; a --preset is one layer", errUsage, bench, layer)
	case slices.Contains(presets, preset):
		return preset, nil
	case preset != "":
		return "", fmt.Errorf("%w: bench %s: unknown --preset %q (have %s)", errUsage, bench, preset, strings.Join(presets, ", "))
	}
	return "", fmt.Errorf("%w: bench %s: --model DIR or --preset %s is required", errUsage, bench, strings.Join(presets, "|"))
}

// moeCase is a bench moe input of T random tokens, with its output and
// expert-id buffers.
func moeCase(rng *rand.Rand, c *moe.Config, T int) (x, y []float32, ids []int32) {
	x = make([]float32, T*c.Hidden)
	for i := range x {
		x[i] = 2*rng.Float32() - 1
	}
	return x, make([]float32, len(x)), make([]int32, T*c.TopK)
}

// benchEP times the dispatch and combine all-to-alls of an EP step with
// identity experts (DeepSeek-V2-Lite: hidden 2048, top-6 of 64 experts,
// contiguous placement, random routing), and a memcpy of the same bytes.
func benchEP(args []string, o *benchOpts) ([]benchResult, error) {
	fs := flag.NewFlagSet("bench ep", flag.ContinueOnError)
	ranksFlag := fs.String("ranks", "1,2,4,8", "in-process ranks, comma-separated list")
	tokensFlag := fs.String("tokens", "16,128,1024", "tokens per rank, comma-separated list")
	common := o.registerCommon(fs, "bench ep")
	if err := parseFlags(fs, args, o.stderr); err != nil {
		return nil, err
	}
	if err := common(); err != nil {
		return nil, err
	}
	ranks, err := intList(*ranksFlag, "--ranks")
	if err != nil {
		return nil, err
	}
	tokens, err := intList(*tokensFlag, "--tokens")
	if err != nil {
		return nil, err
	}
	const H, K, E = 2048, 6, 64
	for _, R := range ranks {
		if R < 1 || R > maxGoroutineRanks {
			return nil, fmt.Errorf("%w: bench ep: --ranks %d must be in [1, %d]", errUsage, R, maxGoroutineRanks)
		}
		// Every rank's tokens, their K copies sent and received, the
		// combined output, and the memcpy baseline's two buffers.
		for _, T := range tokens {
			if err := o.fits("ep", float64(R)*float64(T)*H*4*(2+2*K)+2*float64(ep.RoundTripBytes(R*T, H, K))); err != nil {
				return nil, err
			}
		}
	}
	probe := memoryBandwidth()
	var results []benchResult
	for _, R := range ranks {
		if R < 1 {
			return nil, fmt.Errorf("%w: bench ep: --ranks must be positive", errUsage)
		}
		place, err := ep.Contiguous(E, R)
		if err != nil {
			return nil, err
		}
		for _, T := range tokens {
			rng := rand.New(rand.NewPCG(uint64(R), uint64(T)))
			xs := make([][]float32, R)
			ids := make([][]int32, R)
			ws := make([][]float32, R)
			exs := make([]*ep.Exchanger, R)
			for r := range xs {
				xs[r] = make([]float32, T*H)
				for i := range xs[r] {
					xs[r][i] = rng.Float32()
				}
				ids[r] = make([]int32, 0, T*K)
				for t := 0; t < T; t++ {
					pick := rng.Perm(E)[:K]
					slices.Sort(pick)
					for _, e := range pick {
						ids[r] = append(ids[r], int32(e))
					}
				}
				ws[r] = make([]float32, T*K)
				exs[r] = new(ep.Exchanger)
			}
			comms, err := ep.NewLocal(R)
			if err != nil {
				return nil, err
			}
			bytes := ep.RoundTripBytes(R*T, H, K)
			label := fmt.Sprintf("ranks=%d tokens/rank=%d", R, T)
			ts, err := o.time(label, func() error {
				return ep.RoundTrip(context.Background(), comms, exs, place, xs, ids, ws, H, K)
			})
			if err != nil {
				return nil, err
			}
			src, dst := make([]byte, bytes), make([]byte, bytes)
			mc, err := o.time(label+" memcpy", func() error { copy(dst, src); return nil })
			if err != nil {
				return nil, err
			}
			r := makeResult("ep", label, "local", "f32", R, ts, 0, bytes, probe)
			if R*T > 0 {
				r.NsPerToken = float64(r.MedianNS) / float64(R*T)
			}
			r.MemcpyNS = mc[len(mc)/2].Nanoseconds()
			if bytes > 0 {
				r.VsMemcpy = float64(r.MemcpyNS) / float64(r.MedianNS)
			}
			results = append(results, r)
		}
	}
	return results, nil
}
