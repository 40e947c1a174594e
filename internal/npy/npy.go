// Package npy reads and writes the NumPy .npy arrays the CLI exchanges:
// float32 and int32, any number of dimensions, C order.
//
// Reading goes through codeberg.org/sbinet/npyio (header parsing, dtype and
// byte-order handling). Writing uses a small header writer of its own:
// npyio writes Go slices as one-dimensional arrays only, and an output such
// as [0, hidden] must keep its shape.
package npy

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"

	"codeberg.org/sbinet/npyio"
)

// Float32 is a float32 array in C order.
type Float32 struct {
	Shape []int
	Data  []float32
}

// Int32 is an int32 array in C order.
type Int32 struct {
	Shape []int
	Data  []int32
}

// ReadFloat32 reads a float32 .npy file.
func ReadFloat32(path string) (Float32, error) {
	var a Float32
	shape, err := read(path, "<f4", "float32", &a.Data)
	a.Shape = shape
	return a, err
}

// ReadInt32 reads an int32 .npy file.
func ReadInt32(path string) (Int32, error) {
	var a Int32
	shape, err := read(path, "<i4", "int32", &a.Data)
	a.Shape = shape
	return a, err
}

func read[T float32 | int32](path, descr, name string, data *[]T) ([]int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r, err := npyio.NewReader(bufio.NewReader(f))
	if err != nil {
		return nil, fmt.Errorf("%s: not a .npy file: %w", path, err)
	}
	h := r.Header
	if got := strings.Trim(h.Descr.Type, `'"`); got != descr {
		return nil, fmt.Errorf("%s: dtype %s, want %s (%s)", path, got, name, descr)
	}
	shape := append([]int(nil), h.Descr.Shape...)
	n := 1
	for _, d := range shape {
		if d < 0 || (d > 0 && n > math.MaxInt32/d) {
			return nil, fmt.Errorf("%s: shape %v is too large", path, shape)
		}
		n *= d
	}
	out := make([]T, n)
	if n > 0 {
		if err := r.Read(&out); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(out) != n {
			return nil, fmt.Errorf("%s: holds %d values, shape %v needs %d", path, len(out), shape, n)
		}
	}
	if h.Descr.Fortran && len(shape) > 1 {
		out = fortranToC(out, shape)
	}
	*data = out
	return shape, nil
}

// fortranToC reorders column-major data into row-major order.
func fortranToC[T any](src []T, shape []int) []T {
	dst := make([]T, len(src))
	idx := make([]int, len(shape))
	for f := range src {
		// idx is the multi-index of element f in Fortran order; first axis fastest.
		c := 0
		for d := range shape {
			c = c*shape[d] + idx[d]
		}
		dst[c] = src[f]
		for d := range idx {
			idx[d]++
			if idx[d] < shape[d] {
				break
			}
			idx[d] = 0
		}
	}
	return dst
}

// WriteFloat32 writes data with the given shape as a float32 .npy file.
func WriteFloat32(path string, shape []int, data []float32) error {
	return write(path, "<f4", shape, data)
}

// WriteInt32 writes data with the given shape as an int32 .npy file.
func WriteInt32(path string, shape []int, data []int32) error {
	return write(path, "<i4", shape, data)
}

func write[T float32 | int32](path, descr string, shape []int, data []T) error {
	n := 1
	for _, d := range shape {
		n *= d
	}
	if n != len(data) {
		return fmt.Errorf("%s: shape %v needs %d values, have %d", path, shape, n, len(data))
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	err = Encode(w, descr, shape, data)
	if ferr := w.Flush(); err == nil {
		err = ferr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Encode writes a version 1.0 .npy stream: magic, header dict padded with
// spaces to a multiple of 64 bytes and ended by a newline, then the data in
// little-endian C order.
func Encode[T float32 | int32](w io.Writer, descr string, shape []int, data []T) error {
	dims := make([]string, len(shape))
	for i, d := range shape {
		dims[i] = strconv.Itoa(d)
	}
	tuple := "(" + strings.Join(dims, ", ")
	if len(shape) == 1 {
		tuple += ","
	}
	tuple += ")"
	dict := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, tuple)
	const prefix = 10 // magic (6) + version (2) + header length (2)
	total := (prefix + len(dict) + 1 + 63) / 64 * 64
	dict += strings.Repeat(" ", total-prefix-len(dict)-1) + "\n"
	hdr := make([]byte, prefix, total)
	copy(hdr, "\x93NUMPY\x01\x00")
	binary.LittleEndian.PutUint16(hdr[8:], uint16(len(dict)))
	hdr = append(hdr, dict...)
	if _, err := w.Write(hdr); err != nil {
		return err
	}
	return binary.Write(w, binary.LittleEndian, data)
}
