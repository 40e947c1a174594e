package safetensors

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"slices"
)

// maxHeaderSize bounds the JSON header of a safetensors file, as the
// reference implementation does.
const maxHeaderSize = 100 << 20

// dtypeSizes are the element sizes of the safetensors dtypes. Any of them
// may appear in a file; F32, BF16, F16 and F8_E4M3 (with its scales) can be
// loaded as weights.
var dtypeSizes = map[string]int{
	"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "F4": 1,
	"I16": 2, "U16": 2, "F16": 2, "BF16": 2,
	"I32": 4, "U32": 4, "F32": 4,
	"I64": 8, "U64": 8, "F64": 8,
}

// tensorInfo is one entry of a safetensors header.
type tensorInfo struct {
	DType      string
	Shape      []int
	Begin, End int64 // byte offsets into the data section
}

// Header is a parsed, validated safetensors header.
type Header struct {
	Tensors  map[string]tensorInfo
	Metadata map[string]string
	DataBase int64 // offset of the data section in the file: 8 + header length
}

// ParseHeader parses and validates the header of the safetensors file whose
// first bytes are prefix and whose total size is fileSize. Every entry is
// checked: known dtype, non-negative shape whose byte count matches its
// offsets, offsets inside the data section, no two tensors overlapping, no
// duplicate names. The header is untrusted input; bad input gives an error
// naming the tensor, never a panic.
func ParseHeader(prefix []byte, fileSize int64) (*Header, error) {
	if fileSize < 8 || len(prefix) < 8 {
		return nil, fmt.Errorf("file of %d bytes is too short for a safetensors header", fileSize)
	}
	n := binary.LittleEndian.Uint64(prefix)
	if n > maxHeaderSize {
		return nil, fmt.Errorf("header length %d exceeds the %d-byte limit", n, maxHeaderSize)
	}
	if int64(n) > fileSize-8 {
		return nil, fmt.Errorf("header length %d runs past the end of the %d-byte file", n, fileSize)
	}
	if uint64(len(prefix)-8) < n {
		return nil, fmt.Errorf("header length %d, but only %d bytes given", n, len(prefix)-8)
	}
	h := &Header{Tensors: map[string]tensorInfo{}, DataBase: 8 + int64(n)}
	dataLen := fileSize - h.DataBase
	dec := json.NewDecoder(bytes.NewReader(prefix[8 : 8+n]))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("header is not a JSON object")
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("header: %w", err)
		}
		name, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("header: bad key %v", tok)
		}
		if _, dup := h.Tensors[name]; dup || (name == "__metadata__" && h.Metadata != nil) {
			return nil, fmt.Errorf("header names %q twice", name)
		}
		if name == "__metadata__" {
			h.Metadata = map[string]string{}
			if err := dec.Decode(&h.Metadata); err != nil {
				return nil, fmt.Errorf("header: __metadata__ is not a string map: %w", err)
			}
			continue
		}
		var e struct {
			DType   *string  `json:"dtype"`
			Shape   *[]int64 `json:"shape"`
			Offsets *[]int64 `json:"data_offsets"`
		}
		if err := dec.Decode(&e); err != nil {
			return nil, fmt.Errorf("tensor %q: bad entry: %w", name, err)
		}
		ti, err := checkEntry(e.DType, e.Shape, e.Offsets, dataLen)
		if err != nil {
			return nil, fmt.Errorf("tensor %q: %w", name, err)
		}
		h.Tensors[name] = ti
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("header: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("header has data after its JSON object")
	}
	return h, checkOverlap(h.Tensors)
}

func checkEntry(dtype *string, shape, offsets *[]int64, dataLen int64) (tensorInfo, error) {
	var ti tensorInfo
	if dtype == nil || shape == nil || offsets == nil {
		return ti, errors.New("entry needs dtype, shape and data_offsets")
	}
	size, ok := dtypeSizes[*dtype]
	if !ok {
		return ti, fmt.Errorf("unknown dtype %q", *dtype)
	}
	ti.DType = *dtype
	if len(*offsets) != 2 {
		return ti, fmt.Errorf("data_offsets has %d values, want 2", len(*offsets))
	}
	ti.Begin, ti.End = (*offsets)[0], (*offsets)[1]
	if ti.Begin < 0 || ti.End < ti.Begin || ti.End > dataLen {
		return ti, fmt.Errorf("data_offsets [%d, %d] out of bounds of the %d-byte data section", ti.Begin, ti.End, dataLen)
	}
	count := uint64(size)
	for _, d := range *shape {
		if d < 0 {
			return ti, fmt.Errorf("negative dimension in shape %v", *shape)
		}
		hi, lo := bits.Mul64(count, uint64(d))
		if hi != 0 || lo > math.MaxInt64 {
			return ti, fmt.Errorf("shape %v is too large", *shape)
		}
		count = lo
		ti.Shape = append(ti.Shape, int(d))
	}
	if ti.Shape == nil {
		ti.Shape = []int{}
	}
	if count != uint64(ti.End-ti.Begin) {
		return ti, fmt.Errorf("shape %v of %s needs %d bytes, data_offsets [%d, %d] hold %d",
			*shape, *dtype, count, ti.Begin, ti.End, ti.End-ti.Begin)
	}
	return ti, nil
}

func checkOverlap(tensors map[string]tensorInfo) error {
	type span struct {
		name       string
		begin, end int64
	}
	var spans []span
	for name, t := range tensors {
		if t.End > t.Begin {
			spans = append(spans, span{name, t.Begin, t.End})
		}
	}
	slices.SortFunc(spans, func(a, b span) int {
		if c := cmp.Compare(a.begin, b.begin); c != 0 {
			return c
		}
		return cmp.Compare(a.name, b.name)
	})
	for i := 1; i < len(spans); i++ {
		if spans[i].begin < spans[i-1].end {
			return fmt.Errorf("tensors %q and %q overlap", spans[i-1].name, spans[i].name)
		}
	}
	return nil
}
