// Package memlimit is the memory bound moex's constructors check sizes
// against before they allocate: the machine's memory (MemTotal) unless a
// caller sets another (moe.SetMemoryLimit), so that sizes no machine could
// hold are refused with an error naming them instead of ending the process
// in "runtime: out of memory".
package memlimit

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// ErrTooLarge is wrapped by the errors of sizes over the limit.
var ErrTooLarge = errors.New("over the memory limit")

var (
	limit      atomic.Uint64 // bytes; 0: the machine's memory
	machine    uint64
	machineOne sync.Once
)

// Machine is the machine's memory in bytes (MemTotal in /proc/meminfo),
// or math.MaxUint64 where that cannot be read.
func Machine() uint64 {
	machineOne.Do(func() {
		machine = math.MaxUint64
		b, err := os.ReadFile("/proc/meminfo")
		if err != nil {
			return
		}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
				if kb, err := strconv.ParseUint(f[1], 10, 64); err == nil && kb > 0 && kb < math.MaxUint64/1024 {
					machine = kb * 1024
				}
			}
		}
	})
	return machine
}

// Limit is the bound in bytes.
func Limit() uint64 {
	if l := limit.Load(); l != 0 {
		return l
	}
	return Machine()
}

// Set makes the bound bytes (0: the machine's memory again) and returns
// the previous setting.
func Set(bytes uint64) uint64 { return limit.Swap(bytes) }

// Check returns an ErrTooLarge error, naming what and its size, when bytes
// (an estimate, in float64 so that products of sizes cannot wrap) is over
// the limit.
func Check(what string, bytes float64) error {
	if l := Limit(); !(bytes <= float64(l)) {
		src := "the machine's memory"
		if limit.Load() != 0 {
			src = "the limit set"
		}
		return fmt.Errorf("%s needs %s, more than the %s of %s: %w", what, Size(bytes), Size(float64(l)), src, ErrTooLarge)
	}
	return nil
}

// Size writes a byte count for a person.
func Size(b float64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.1f GiB", b/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", b/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", b/(1<<10))
	}
	return fmt.Sprintf("%.0f bytes", b)
}
