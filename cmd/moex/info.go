package main

import (
	"flag"
	"fmt"
	"io"
	"runtime"

	"github.com/klauspost/cpuid/v2"
)

// cmdInfo reports what this machine offers the CPU kernels.
func cmdInfo(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("info", flag.ContinueOnError)
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	c := cpuid.CPU
	fmt.Fprintf(stdout, "cpu        %s (%s/%s)\n", c.BrandName, runtime.GOOS, runtime.GOARCH)
	fmt.Fprintf(stdout, "cores      %d physical, %d logical, GOMAXPROCS %d\n", c.PhysicalCores, c.LogicalCores, runtime.GOMAXPROCS(0))
	fmt.Fprintf(stdout, "caches     L1d %s, L2 %s, L3 %s\n", kib(c.Cache.L1D), kib(c.Cache.L2), kib(c.Cache.L3))
	yes := map[bool]string{true: "yes", false: "no"}
	fmt.Fprintf(stdout, "simd       AVX2 %s, FMA %s, AVX-512F %s, AVX-512BF16 %s, F16C %s\n",
		yes[c.Supports(cpuid.AVX2)], yes[c.Supports(cpuid.FMA3)], yes[c.Supports(cpuid.AVX512F)],
		yes[c.Supports(cpuid.AVX512BF16)], yes[c.Supports(cpuid.F16C)])
	for i, line := range gpuReport() {
		label := "gpu"
		if i > 0 {
			label = ""
		}
		fmt.Fprintf(stdout, "%-10s %s\n", label, line)
	}
	return nil
}

func kib(n int) string {
	if n <= 0 {
		return "unknown"
	}
	return fmt.Sprintf("%d KiB", n/1024)
}
