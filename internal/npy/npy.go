// Package npy reads and writes the NumPy .npy arrays the CLI exchanges:
// float32 and int32, any number of dimensions, C or Fortran order, either
// byte order.
//
// The reader is its own, not codeberg.org/sbinet/npyio's: npyio v0.14's
// header parser slices without bounds checks (a file cut in its header, a
// header length of 0 or past the end, an unclosed shape all panic) and
// expects the dict's keys in numpy's order, while the format allows any.
// The header here is parsed as the format defines it (a Python literal dict
// of 'descr', 'fortran_order' and 'shape', versions 1.0, 2.0 and 3.0) with
// every length checked against the file before anything is allocated.
// Writing uses a small header writer of its own too: npyio writes Go slices
// as one-dimensional arrays only, and an output such as [0, hidden] must
// keep its shape.
package npy

import (
	"github.com/moex-project/moex/internal/regfile"

	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
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
	shape, err := read(path, 'f', "float32", &a.Data)
	a.Shape = shape
	return a, err
}

// ReadInt32 reads an int32 .npy file.
func ReadInt32(path string) (Int32, error) {
	var a Int32
	shape, err := read(path, 'i', "int32", &a.Data)
	a.Shape = shape
	return a, err
}

// maxHeader bounds the header dict's length (numpy's own reader refuses
// more than 10 000 bytes by default).
const maxHeader = 1 << 20

// maxValues bounds the element count of an array (its int32 indices).
const maxValues = math.MaxInt32

// Header is a parsed .npy header.
type Header struct {
	Descr   string // e.g. "<f4"
	Fortran bool
	Shape   []int
	// DataOffset is where the data starts: the magic, version, length and
	// dict before it.
	DataOffset int64
}

// ParseHeader reads and checks the header at the start of r. It never
// panics and allocates at most the header's length (bounded).
func ParseHeader(r io.Reader) (Header, error) {
	var pre [10]byte
	if n, err := io.ReadFull(r, pre[:8]); err != nil {
		if n < 6 || string(pre[:6]) != "\x93NUMPY" {
			return Header{}, errors.New("not a .npy file (no \\x93NUMPY magic)")
		}
		return Header{}, errors.New("the header is cut before its length")
	}
	if string(pre[:6]) != "\x93NUMPY" {
		return Header{}, errors.New("not a .npy file (no \\x93NUMPY magic)")
	}
	major := pre[6]
	var hlen, off int
	switch major {
	case 1:
		if _, err := io.ReadFull(r, pre[8:10]); err != nil {
			return Header{}, errors.New("the header is cut before its length")
		}
		hlen, off = int(binary.LittleEndian.Uint16(pre[8:10])), 10
	case 2, 3:
		var l [4]byte
		if _, err := io.ReadFull(r, l[:]); err != nil {
			return Header{}, errors.New("the header is cut before its length")
		}
		v := binary.LittleEndian.Uint32(l[:])
		if v > maxHeader {
			return Header{}, fmt.Errorf("header length %d is over the %d bytes this reader accepts", v, maxHeader)
		}
		hlen, off = int(v), 12
	default:
		return Header{}, fmt.Errorf("format version %d.%d is not one of 1.0, 2.0, 3.0", pre[6], pre[7])
	}
	if hlen == 0 {
		return Header{}, errors.New("the header dict is empty (length 0)")
	}
	dict := make([]byte, hlen)
	if n, err := io.ReadFull(r, dict); err != nil {
		return Header{}, fmt.Errorf("the header says %d bytes but the file ends %d bytes into it", hlen, n)
	}
	h, err := parseDict(string(dict))
	if err != nil {
		return Header{}, fmt.Errorf("header %q: %w", strings.TrimSpace(string(dict)), err)
	}
	h.DataOffset = int64(off + hlen)
	return h, nil
}

// dictParser reads the header's Python literal: a dict of string keys to
// strings, booleans and tuples of non-negative integers.
type dictParser struct {
	s string
	i int
}

func (p *dictParser) space() {
	for p.i < len(p.s) && strings.IndexByte(" \t\r\n", p.s[p.i]) >= 0 {
		p.i++
	}
}

// eat skips spaces and then c, reporting whether c was there.
func (p *dictParser) eat(c byte) bool {
	p.space()
	if p.i < len(p.s) && p.s[p.i] == c {
		p.i++
		return true
	}
	return false
}

func (p *dictParser) str() (string, error) {
	p.space()
	if p.i >= len(p.s) || (p.s[p.i] != '\'' && p.s[p.i] != '"') {
		return "", errors.New("expected a quoted string")
	}
	q := p.s[p.i]
	end := strings.IndexByte(p.s[p.i+1:], q)
	if end < 0 {
		return "", errors.New("unclosed string")
	}
	v := p.s[p.i+1 : p.i+1+end]
	p.i += end + 2
	return v, nil
}

func (p *dictParser) word() string {
	p.space()
	j := p.i
	for j < len(p.s) && (p.s[j] >= 'a' && p.s[j] <= 'z' || p.s[j] >= 'A' && p.s[j] <= 'Z' || p.s[j] >= '0' && p.s[j] <= '9' || strings.IndexByte("-+._", p.s[j]) >= 0) {
		j++
	}
	w := p.s[p.i:j]
	p.i = j
	return w
}

func (p *dictParser) shape() ([]int, error) {
	open := byte('(')
	if !p.eat('(') {
		if !p.eat('[') {
			return nil, errors.New("'shape' is not a tuple")
		}
		open = '['
	}
	closer := map[byte]byte{'(': ')', '[': ']'}[open]
	var dims []int
	for {
		if p.eat(closer) {
			return dims, nil
		}
		w := strings.TrimSuffix(p.word(), "L") // Python 2 longs
		if w == "" {
			if p.i >= len(p.s) {
				return nil, errors.New("unclosed 'shape'")
			}
			return nil, fmt.Errorf("'shape' holds %q, not an integer", p.s[p.i:p.i+1])
		}
		d, err := strconv.ParseInt(w, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("'shape' holds %q, not an integer", w)
		}
		if d < 0 {
			return nil, fmt.Errorf("'shape' has the negative dimension %d", d)
		}
		if d > maxValues {
			return nil, fmt.Errorf("'shape' has the dimension %d, over %d", d, maxValues)
		}
		dims = append(dims, int(d))
		if !p.eat(',') {
			if p.eat(closer) {
				return dims, nil
			}
			return nil, errors.New("unclosed 'shape'")
		}
	}
}

func parseDict(s string) (Header, error) {
	p := &dictParser{s: s}
	var h Header
	if !p.eat('{') {
		return h, errors.New("not a dict")
	}
	seen := map[string]bool{}
	for {
		if p.eat('}') {
			break
		}
		key, err := p.str()
		if err != nil {
			return h, fmt.Errorf("a key: %w", err)
		}
		if seen[key] {
			return h, fmt.Errorf("key %q twice", key)
		}
		seen[key] = true
		if !p.eat(':') {
			return h, fmt.Errorf("no ':' after %q", key)
		}
		switch key {
		case "descr":
			p.space()
			if p.i < len(p.s) && p.s[p.i] == '[' {
				return h, errors.New("a structured dtype (a 'descr' list) is not supported")
			}
			if h.Descr, err = p.str(); err != nil {
				return h, fmt.Errorf("'descr': %w", err)
			}
		case "fortran_order":
			switch w := p.word(); w {
			case "True":
				h.Fortran = true
			case "False":
			default:
				if w == "" { // not a bare word ('no', "1"): quote the value as written
					v := p.s[p.i:]
					if k := strings.IndexAny(v, ",}"); k >= 0 {
						v = v[:k]
					}
					w = strings.TrimSpace(v[:min(len(v), 40)])
				}
				return h, fmt.Errorf("'fortran_order' is %s, not True or False", w)
			}
		case "shape":
			if h.Shape, err = p.shape(); err != nil {
				return h, err
			}
		default:
			return h, fmt.Errorf("unknown key %q (a .npy header holds 'descr', 'fortran_order' and 'shape')", key)
		}
		if !p.eat(',') {
			if p.eat('}') {
				break
			}
			return h, errors.New("unclosed dict")
		}
	}
	for _, k := range []string{"descr", "fortran_order", "shape"} {
		if !seen[k] {
			return h, fmt.Errorf("no %q key", k)
		}
	}
	if p.space(); p.i != len(p.s) {
		return h, fmt.Errorf("%q after the dict", strings.TrimSpace(p.s[p.i:]))
	}
	if h.Shape == nil {
		h.Shape = []int{}
	}
	return h, nil
}

// byteOrder is the order of a descr of a 4-byte kind ('f' or 'i'), or an
// error naming what the file holds and what was wanted.
func byteOrder(descr string, kind byte, name string) (binary.ByteOrder, error) {
	if len(descr) == 3 && descr[1] == kind && descr[2] == '4' {
		switch descr[0] {
		case '<', '=', '|':
			return binary.LittleEndian, nil
		case '>':
			return binary.BigEndian, nil
		}
	}
	if descr == name || descr == string(kind)+"4" { // numpy's names of the native-order dtype
		return binary.NativeEndian, nil
	}
	hint := ""
	if kind == 'f' && len(descr) == 3 && descr[1:] == "f8" {
		hint = " (numpy's default float64: save x.astype(numpy.float32))"
	}
	return nil, fmt.Errorf("dtype %s, want %s (<%c4)%s", descr, name, kind, hint)
}

func read[T float32 | int32](path string, kind byte, name string, data *[]T) ([]int, error) {
	f, err := regfile.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	br := bufio.NewReader(f)
	h, err := ParseHeader(br)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	order, err := byteOrder(h.Descr, kind, name)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	n := 1
	for _, d := range h.Shape {
		if d > 0 && n > maxValues/d {
			return nil, fmt.Errorf("%s: shape %v holds more than %d values", path, h.Shape, maxValues)
		}
		n *= d
	}
	if have := (st.Size() - h.DataOffset) / 4; have < int64(n) {
		return nil, fmt.Errorf("%s: holds %d values, shape %v needs %d", path, max(have, 0), h.Shape, n)
	}
	raw := make([]byte, 4*n)
	if got, err := io.ReadFull(br, raw); err != nil {
		return nil, fmt.Errorf("%s: holds %d values, shape %v needs %d (%v)", path, got/4, h.Shape, n, err)
	}
	out := make([]T, n)
	if _, err := binary.Decode(raw, order, out); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if h.Fortran && len(h.Shape) > 1 {
		out = fortranToC(out, h.Shape)
	}
	*data = out
	return h.Shape, nil
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
