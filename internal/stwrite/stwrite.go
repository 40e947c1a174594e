// Package stwrite writes safetensors files and Hugging Face checkpoint
// folders (single file or sharded with model.safetensors.index.json), for
// tests, fixtures and generated models.
package stwrite

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"

	"github.com/moex-project/moex/internal/half"
)

// Tensor is one named tensor with its raw little-endian bytes.
type Tensor struct {
	Name  string
	DType string // safetensors dtype: F32, BF16, F16, ...
	Shape []int
	Data  []byte
}

// Encode converts float32 values to the bytes of dtype F32, BF16 or F16
// (rounding to nearest even).
func Encode(dtype string, v []float32) ([]byte, error) {
	switch dtype {
	case "F32":
		b := make([]byte, 4*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
		}
		return b, nil
	case "BF16", "F16":
		conv := half.F32ToBF16
		if dtype == "F16" {
			conv = half.F32ToF16
		}
		b := make([]byte, 2*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint16(b[2*i:], conv(x))
		}
		return b, nil
	}
	return nil, fmt.Errorf("stwrite: cannot encode float32 as %s", dtype)
}

// Decode widens bytes of dtype F32, BF16 or F16 to float64.
func Decode(dtype string, b []byte) ([]float64, error) {
	switch dtype {
	case "F32":
		v := make([]float64, len(b)/4)
		for i := range v {
			v[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
		}
		return v, nil
	case "BF16", "F16":
		conv := half.BF16ToF32
		if dtype == "F16" {
			conv = half.F16ToF32
		}
		v := make([]float64, len(b)/2)
		for i := range v {
			v[i] = float64(conv(binary.LittleEndian.Uint16(b[2*i:])))
		}
		return v, nil
	}
	return nil, fmt.Errorf("stwrite: cannot decode %s", dtype)
}

// WriteFile writes tensors, in the given order, as one safetensors file.
func WriteFile(path string, tensors []Tensor, metadata map[string]string) error {
	header := map[string]any{}
	if metadata != nil {
		header["__metadata__"] = metadata
	}
	var off int64
	for _, t := range tensors {
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		header[t.Name] = map[string]any{
			"dtype":        t.DType,
			"shape":        shape,
			"data_offsets": []int64{off, off + int64(len(t.Data))},
		}
		off += int64(len(t.Data))
	}
	js, err := json.Marshal(header)
	if err != nil {
		return err
	}
	for (8+len(js))%8 != 0 { // align the data section, as the reference writer does
		js = append(js, ' ')
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(js)))
	buf := append(n[:], js...)
	for _, t := range tensors {
		buf = append(buf, t.Data...)
	}
	_, err = f.Write(buf)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// WriteCheckpoint writes config (marshalled as config.json) and tensors into
// dir, as model.safetensors when shards ≤ 1, else as that many shards named
// model-0000i-of-0000n.safetensors plus model.safetensors.index.json.
func WriteCheckpoint(dir string, config any, tensors []Tensor, shards int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	cfg, err := json.MarshalIndent(config, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o644); err != nil {
		return err
	}
	meta := map[string]string{"format": "pt"}
	if shards <= 1 {
		return WriteFile(filepath.Join(dir, "model.safetensors"), tensors, meta)
	}
	sorted := append([]Tensor(nil), tensors...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	weightMap := map[string]string{}
	var total int64
	for s := 0; s < shards; s++ {
		name := fmt.Sprintf("model-%05d-of-%05d.safetensors", s+1, shards)
		lo, hi := s*len(sorted)/shards, (s+1)*len(sorted)/shards
		for _, t := range sorted[lo:hi] {
			weightMap[t.Name] = name
			total += int64(len(t.Data))
		}
		if err := WriteFile(filepath.Join(dir, name), sorted[lo:hi], meta); err != nil {
			return err
		}
	}
	idx, err := json.MarshalIndent(map[string]any{
		"metadata":   map[string]any{"total_size": total},
		"weight_map": weightMap,
	}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "model.safetensors.index.json"), idx, 0o644)
}
