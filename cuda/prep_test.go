//go:build cuda || cudaemu

package cuda_test

import (
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/internal/half"
)

// put copies v into a new buffer of l.
func put[T any](t *testing.T, l cuda.Launcher, v []T) cuda.Buffer {
	t.Helper()
	var zero T
	n := int64(len(v)) * int64(unsafe.Sizeof(zero))
	b, err := l.Alloc(max(n, 1))
	require.NoError(t, err)
	if n > 0 {
		require.NoError(t, l.ToDevice(b, unsafe.Pointer(&v[0]), n))
	}
	t.Cleanup(func() { l.Free(b) })
	return b
}

// get reads n values of b.
func get[T any](t *testing.T, l cuda.Launcher, b cuda.Buffer, n int) []T {
	t.Helper()
	v := make([]T, n)
	var zero T
	if n > 0 {
		require.NoError(t, l.ToHost(unsafe.Pointer(&v[0]), b, int64(n)*int64(unsafe.Sizeof(zero))))
	}
	return v
}

func randRows(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64() * 3)
	}
	return v
}

// testPrepKernels: RMSNorm, the rotary embedding and the row copy on a
// device against float64 references written here, on slices of rows (a
// column offset and a stride past the width, as the MLA block uses them).
func testPrepKernels(t *testing.T, l cuda.Launcher) {
	rng := rand.New(rand.NewPCG(7, 7))
	const rows, stride, col, width = 5, 200, 9, 160
	x := randRows(rng, rows*stride)
	w := randRows(rng, width)
	const eps = 1e-6
	xb := put(t, l, x)
	require.NoError(t, l.RMSNorm(xb, rows, stride, col, width, put(t, l, w), eps))
	got := get[float32](t, l, xb, rows*stride)
	for r := 0; r < rows; r++ {
		var s float64
		for j := 0; j < width; j++ {
			v := float64(x[r*stride+col+j])
			s += v * v
		}
		inv := 1 / math.Sqrt(s/width+eps)
		for j := 0; j < stride; j++ {
			want := float64(x[r*stride+j]) // outside the slice: untouched
			if j >= col && j < col+width {
				want = float64(float32(float64(x[r*stride+j])*inv)) * float64(w[j-col])
			}
			require.InDelta(t, want, float64(got[r*stride+j]), 1e-6*math.Abs(want)+1e-30, "row %d value %d", r, j)
		}
	}

	// Rope: 3 tokens × 4 heads, 64 rope dims at column 16 of 96.
	const heads, rd, rstride, rcol = 4, 64, 96, 16
	pos := []int32{0, 17, 4095}
	freq := make([]float64, rd/2+1)
	for i := 0; i < rd/2; i++ {
		freq[i] = 1 / math.Pow(10000, float64(2*i)/rd) * (1 + 0.01*float64(i%3))
	}
	freq[rd/2] = 1.3 // yarn's cos/sin scale
	q := randRows(rng, len(pos)*heads*rstride)
	qb := put(t, l, q)
	require.NoError(t, l.Rope(qb, len(pos)*heads, rstride, rcol, rd, heads, put(t, l, pos), put(t, l, freq)))
	gotQ := get[float32](t, l, qb, len(q))
	for r := 0; r < len(pos)*heads; r++ {
		p := float64(pos[r/heads])
		row := q[r*rstride : (r+1)*rstride]
		for j := 0; j < rstride; j++ {
			want := float64(row[j])
			if j >= rcol && j < rcol+rd {
				i := j - rcol
				k := i % (rd / 2)
				a := p * freq[k]
				cs, sn := math.Cos(a)*freq[rd/2], math.Sin(a)*freq[rd/2]
				x0, x1 := float64(row[rcol+2*k]), float64(row[rcol+2*k+1])
				if i < rd/2 {
					want = x0*cs - x1*sn
				} else {
					want = x1*cs + x0*sn
				}
			}
			require.InDelta(t, want, float64(gotQ[r*rstride+j]), 2e-6*(math.Abs(want)+1), "row %d value %d", r, j)
		}
	}
	require.ErrorContains(t, l.Rope(qb, 1, rstride, 0, 7, 1, put(t, l, pos), put(t, l, freq)), "rope of 7 values")

	// CopyRows: gather rows 4, 0, (skip), 2 of a [5, 12] source, columns
	// 3 … 9, into rows 1, 0, 3 of an [4, 10] destination at column 2, as
	// fp32 and as bf16.
	src := randRows(rng, 5*12)
	srcMap := []int32{4, 0, -1, 2}
	dstMap := []int32{1, 0, 2, 3}
	for _, bf := range []bool{false, true} {
		if bf {
			d := put(t, l, make([]uint16, 4*10))
			require.NoError(t, l.CopyRows(cuda.CopyRowsArgs{Src: put(t, l, src), SrcStride: 12, SrcCol: 3, SrcMap: put(t, l, srcMap), Dst: d, DstBF16: true, DstStride: 10, DstCol: 2, DstMap: put(t, l, dstMap), Rows: 4, Width: 6}))
			out := get[uint16](t, l, d, 4*10)
			for i, si := range srcMap {
				for j := 0; j < 10; j++ {
					want := uint16(0)
					if si >= 0 && j >= 2 && j < 8 {
						want = half.F32ToBF16(src[int(si)*12+3+j-2])
					}
					require.Equal(t, want, out[int(dstMap[i])*10+j], "bf16 row %d value %d", i, j)
				}
			}
			continue
		}
		d := put(t, l, make([]float32, 4*10))
		require.NoError(t, l.CopyRows(cuda.CopyRowsArgs{Src: put(t, l, src), SrcStride: 12, SrcCol: 3, SrcMap: put(t, l, srcMap), Dst: d, DstBF16: false, DstStride: 10, DstCol: 2, DstMap: put(t, l, dstMap), Rows: 4, Width: 6}))
		out := get[float32](t, l, d, 4*10)
		for i, si := range srcMap {
			for j := 0; j < 10; j++ {
				want := float32(0)
				if si >= 0 && j >= 2 && j < 8 {
					want = src[int(si)*12+3+j-2]
				}
				require.Equal(t, want, out[int(dstMap[i])*10+j], "row %d value %d", i, j)
			}
		}
	}
	// Identity maps (zero Buffers): a plain strided copy.
	d := put(t, l, make([]float32, 5*6))
	require.NoError(t, l.CopyRows(cuda.CopyRowsArgs{Src: put(t, l, src), SrcStride: 12, SrcCol: 0, SrcMap: cuda.Buffer{}, Dst: d, DstBF16: false, DstStride: 6, DstCol: 0, DstMap: cuda.Buffer{}, Rows: 5, Width: 6}))
	out := get[float32](t, l, d, 5*6)
	for r := 0; r < 5; r++ {
		require.Equal(t, src[r*12:r*12+6], out[r*6:(r+1)*6])
	}
}
