package npy

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"codeberg.org/sbinet/npyio"
	"github.com/stretchr/testify/require"
)

func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name  string
		shape []int
	}{
		{"matrix", []int{3, 4}},
		{"empty rows keep their width", []int{0, 7}},
		{"vector", []int{5}},
		{"3-d", []int{2, 3, 2}},
		{"scalar", []int{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := 1
			for _, d := range tt.shape {
				n *= d
			}
			f := make([]float32, n)
			i := make([]int32, n)
			for k := range f {
				f[k] = float32(k) * 0.5
				i[k] = int32(k) - 3
			}
			fp := filepath.Join(dir, tt.name+"f.npy")
			ip := filepath.Join(dir, tt.name+"i.npy")
			require.NoError(t, WriteFloat32(fp, tt.shape, f))
			require.NoError(t, WriteInt32(ip, tt.shape, i))
			gf, err := ReadFloat32(fp)
			require.NoError(t, err)
			require.Equal(t, tt.shape, append([]int{}, gf.Shape...))
			require.Equal(t, f, gf.Data)
			gi, err := ReadInt32(ip)
			require.NoError(t, err)
			require.Equal(t, i, gi.Data)

			raw, err := os.ReadFile(fp)
			require.NoError(t, err)
			require.Zero(t, (int(raw[8])|int(raw[9])<<8+10)%64, "header must be padded to 64 bytes")
		})
	}
}

// TestReadsNpyioFiles reads what another writer produced.
func TestReadsNpyioFiles(t *testing.T) {
	p := filepath.Join(t.TempDir(), "a.npy")
	var buf bytes.Buffer
	require.NoError(t, npyio.Write(&buf, []float32{1, 2, 3}))
	require.NoError(t, os.WriteFile(p, buf.Bytes(), 0o644))
	a, err := ReadFloat32(p)
	require.NoError(t, err)
	require.Equal(t, []int{3}, a.Shape)
	require.Equal(t, []float32{1, 2, 3}, a.Data)
}

func TestFortranOrder(t *testing.T) {
	// [[1,2,3],[4,5,6]] stored column by column.
	var buf bytes.Buffer
	require.NoError(t, Encode(&buf, "<f4", []int{2, 3}, []float32{1, 4, 2, 5, 3, 6}))
	raw := buf.Bytes()
	i := bytes.Index(raw, []byte("False, "))
	require.Positive(t, i)
	// numpy's own spelling, same length: shift the rest of the dict left one byte and pad.
	copy(raw[i:], "True, ")
	j := bytes.IndexByte(raw, '\n')
	copy(raw[i+6:j], raw[i+7:j])
	raw[j-1] = ' '
	p := filepath.Join(t.TempDir(), "f.npy")
	require.NoError(t, os.WriteFile(p, raw, 0o644))
	a, err := ReadFloat32(p)
	require.NoError(t, err)
	require.Equal(t, []float32{1, 2, 3, 4, 5, 6}, a.Data)
}

func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	f64 := filepath.Join(dir, "f64.npy")
	var buf bytes.Buffer
	require.NoError(t, npyio.Write(&buf, []float64{1, 2}))
	require.NoError(t, os.WriteFile(f64, buf.Bytes(), 0o644))
	_, err := ReadFloat32(f64)
	require.ErrorContains(t, err, "dtype <f8, want float32")

	junk := filepath.Join(dir, "junk.npy")
	require.NoError(t, os.WriteFile(junk, []byte("hello"), 0o644))
	_, err = ReadFloat32(junk)
	require.ErrorContains(t, err, "not a .npy file")

	_, err = ReadInt32(filepath.Join(dir, "missing.npy"))
	require.Error(t, err)

	require.ErrorContains(t, WriteFloat32(filepath.Join(dir, "x.npy"), []int{2, 2}, []float32{1}), "needs 4 values")
}

// file is a .npy file of version major with the header dict as given
// (padded to 64 bytes with a newline, as numpy writes it) and data bytes.
func file(major byte, dict string, data []byte) []byte {
	prefix := 10
	if major > 1 {
		prefix = 12
	}
	pad := (64 - (prefix+len(dict)+1)%64) % 64
	dict += strings.Repeat(" ", pad) + "\n"
	b := []byte("\x93NUMPY")
	b = append(b, major, 0)
	if major > 1 {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(dict)))
	} else {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(dict)))
	}
	return append(append(b, dict...), data...)
}

func f32bytes(order binary.AppendByteOrder, v ...float32) []byte {
	var b []byte
	for _, x := range v {
		b = order.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

// TestHeaders reads the headers numpy and other writers produce: keys in
// any order, versions 2.0 and 3.0, big-endian data, Python 2 longs, lists.
func TestHeaders(t *testing.T) {
	le, be := binary.LittleEndian, binary.BigEndian
	tests := []struct {
		name  string
		raw   []byte
		shape []int
	}{
		{"keys in another order", file(1, "{'shape': (2,), 'fortran_order': False, 'descr': '<f4'}", f32bytes(le, 1, 2)), []int{2}},
		{"double quotes, no trailing comma", file(1, `{"descr": "<f4", "fortran_order": False, "shape": (1, 2)}`, f32bytes(le, 1, 2)), []int{1, 2}},
		{"version 2.0", file(2, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", f32bytes(le, 1, 2)), []int{2}},
		{"version 3.0", file(3, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", f32bytes(le, 1, 2)), []int{2}},
		{"big-endian", file(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", f32bytes(be, 1, 2)), []int{2}},
		{"descr as a dtype name", file(1, "{'descr': 'float32', 'fortran_order': False, 'shape': (2,), }", f32bytes(binary.NativeEndian, 1, 2)), []int{2}},
		{"descr without byte order", file(1, "{'descr': 'f4', 'fortran_order': False, 'shape': (2,), }", f32bytes(binary.NativeEndian, 1, 2)), []int{2}},
		{"python 2 longs", file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 1L), }", f32bytes(le, 1, 2)), []int{2, 1}},
		{"no newline at the end", append([]byte("\x93NUMPY\x01\x00\x3c\x00"), append([]byte("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }   "), f32bytes(le, 1, 2)...)...), []int{2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "a.npy")
			require.NoError(t, os.WriteFile(p, tt.raw, 0o644))
			a, err := ReadFloat32(p)
			require.NoError(t, err)
			require.Equal(t, tt.shape, a.Shape)
			require.Equal(t, []float32{1, 2}, a.Data)
		})
	}
}

// TestMalformed: each malformed file the npyio reader panicked on (and
// others of their kind) is a named error.
func TestMalformed(t *testing.T) {
	good := file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", f32bytes(binary.LittleEndian, 1, 2, 3, 4, 5, 6))
	hdrEnd := bytes.IndexByte(good, '\n')
	withLen := func(n uint16) []byte {
		b := bytes.Clone(good)
		binary.LittleEndian.PutUint16(b[8:], n)
		return b
	}
	tests := []struct {
		name string
		raw  []byte
		want string
	}{
		{"empty file", nil, "not a .npy file"},
		{"cut in the magic", good[:4], "not a .npy file"},
		{"cut before the length", good[:9], "cut before its length"},
		{"cut in the dict", good[:30], "file ends 20 bytes into it"},
		{"header length 0", withLen(0), "dict is empty"},
		{"header length past the end", withLen(60000), "the header says 60000 bytes"},
		{"no newline, dict cut short", withLen(40), "header"},
		{"unclosed shape", file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3", nil), "unclosed 'shape'"},
		{"negative dimension", file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-1, 3), }", nil), "negative dimension -1"},
		{"shape not integers", file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2.5,), }", nil), "not an integer"},
		{"huge shape", file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (100000, 100000), }", nil), "more than 2147483647 values"},
		{"data cut", good[:hdrEnd+1+10], "holds 2 values, shape [2 3] needs 6"},
		{"no data", good[:hdrEnd+1], "holds 0 values, shape [2 3] needs 6"},
		{"missing key", file(1, "{'descr': '<f4', 'shape': (2,), }", nil), `no "fortran_order" key`},
		{"unknown key", file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", nil), `unknown key "x"`},
		{"key twice", file(1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", nil), `key "descr" twice`},
		{"bad fortran_order", file(1, "{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}", nil), "'fortran_order' is 0, not True or False"},
		{"quoted fortran_order", file(1, "{'descr': '<f4', 'fortran_order': 'no', 'shape': (2,)}", nil), "'fortran_order' is 'no', not True or False"},
		{"structured dtype", file(1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}", nil), "structured dtype"},
		{"int32 asked as float", file(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (2,)}", make([]byte, 8)), "dtype <i4, want float32 (<f4)"},
		{"float64", file(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2,)}", make([]byte, 16)), "x.astype(numpy.float32)"},
		{"version 4", append([]byte("\x93NUMPY\x04\x00"), good[8:]...), "version 4.0"},
		{"v2 header over the limit", append([]byte("\x93NUMPY\x02\x00\xff\xff\xff\x7f"), good[10:]...), "over the 1048576 bytes"},
		{"text after the dict", file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} x", nil), `"x" after the dict`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "a.npy")
			require.NoError(t, os.WriteFile(p, tt.raw, 0o644))
			_, err := ReadFloat32(p)
			require.ErrorContains(t, err, tt.want)
			require.ErrorContains(t, err, p, "the error names the file")
		})
	}
}

func TestNotARegularFile(t *testing.T) {
	dir := t.TempDir()
	_, err := ReadFloat32(dir)
	require.ErrorContains(t, err, "not a regular file")
	fifo := filepath.Join(dir, "fifo.npy")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	_, err = ReadFloat32(fifo) // would block in open(2) if it were opened
	require.ErrorContains(t, err, "not a regular file")
}

// FuzzParseHeader: no header panics, and one that parses writes back (with
// Encode) to a header that parses the same.
func FuzzParseHeader(f *testing.F) {
	f.Add(file(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", nil))
	f.Add(file(2, "{'shape': (), 'descr': '>i4', 'fortran_order': True}", nil))
	f.Add([]byte("\x93NUMPY\x01\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		h, err := ParseHeader(bytes.NewReader(raw))
		if err != nil {
			return
		}
		require.LessOrEqual(t, h.DataOffset, int64(len(raw)))
		for _, d := range h.Shape {
			require.GreaterOrEqual(t, d, 0)
		}
		if h.Descr != "<f4" || h.Fortran {
			return
		}
		var buf bytes.Buffer
		require.NoError(t, Encode(&buf, h.Descr, h.Shape, []float32{}))
		h2, err := ParseHeader(&buf)
		require.NoError(t, err)
		require.Equal(t, h.Shape, h2.Shape)
	})
}
