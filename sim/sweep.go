package sim

import (
	"errors"
	"fmt"
	"slices"
)

// Axis is what a sweep varies.
type Axis string

const (
	AxisBatch   Axis = "batch"   // Workload.Batch: requests decoding over all ranks
	AxisRanks   Axis = "ranks"   // Deployment.Ranks
	AxisContext Axis = "context" // Workload.Input: the prompt tokens each request caches
)

// ParseAxis reads a sweep axis's name.
func ParseAxis(s string) (Axis, error) {
	switch a := Axis(s); a {
	case AxisBatch, AxisRanks, AxisContext:
		return a, nil
	}
	return "", fmt.Errorf("sim: unknown sweep axis %q (batch, ranks, context)", s)
}

// Point is one deployment and workload of a sweep: its result, or why
// there is none (Err: the batch does not fit, the weights do not).
type Point struct {
	Layout Layout  `json:"layout"`
	X      int     `json:"x"`
	Result *Result `json:"result,omitempty"`
	Err    string  `json:"error,omitempty"`
}

// Sweep runs base and w for each layout at each value of axis (batch 0:
// the largest that fits, as in Workload). A point
// that does not fit carries its error; a bad deployment or workload (one
// no value could fix) is returned as the error.
func Sweep(base Deployment, w Workload, layouts []Layout, axis Axis, values []int) ([]Point, error) {
	if _, err := ParseAxis(string(axis)); err != nil {
		return nil, err
	}
	if len(values) == 0 {
		return nil, errors.New("sim: a sweep needs at least one value")
	}
	var out []Point
	for _, l := range layouts {
		for _, v := range values {
			d, wl := base, w
			d.Layout = l
			switch axis {
			case AxisBatch:
				wl.Batch = v
			case AxisRanks:
				d.Ranks = v
			case AxisContext:
				wl.Input = v
			}
			if v < 0 || v == 0 && axis == AxisRanks {
				return nil, fmt.Errorf("sim: %s %d", axis, v)
			}
			if err := d.Validate(); err != nil {
				return nil, err
			}
			run := d.Decode
			if wl.Prefill {
				run = d.Prefill
			}
			r, err := run(wl)
			if err != nil {
				out = append(out, Point{Layout: l, X: v, Err: err.Error()})
				continue
			}
			out = append(out, Point{Layout: l, X: v, Result: &r})
		}
	}
	return out, nil
}

// BatchValues are the batches a batch sweep tries by default: the powers
// of two up to the largest batch any of the layouts fits, and each
// layout's largest.
func BatchValues(base Deployment, w Workload, layouts []Layout) []int {
	top := 0
	var vals []int
	for _, l := range layouts {
		d := base
		d.Layout = l
		if m, err := d.MaxBatch(w); err == nil {
			if w.MaxBatch > 0 {
				m = min(m, w.MaxBatch)
			}
			top = max(top, m)
			vals = append(vals, m)
		}
	}
	for b := 1; b <= top; b *= 2 {
		vals = append(vals, b)
	}
	slices.Sort(vals)
	return slices.Compact(vals)
}
