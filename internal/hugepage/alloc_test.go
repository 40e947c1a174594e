package hugepage

import (
	"bytes"
	"sync"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBytes: buffers are zeroed, line-aligned, the size asked (their
// capacity too, so that an append cannot run into a neighbour), and do
// not overlap, carved from a slab or not.
func TestBytes(t *testing.T) {
	var bufs [][]byte
	for _, n := range []int{0, 10, carveMin - 1, carveMin, 3 << 20, carveMax, carveMax + 1, 5 << 20, 100 << 10} {
		b := Bytes(n)
		require.Len(t, b, n)
		assert.Equal(t, n, cap(b))
		require.Equal(t, n, bytes.Count(b, []byte{0}), "n=%d: not zeroed", n)
		if n >= carveMin {
			assert.Zero(t, uintptr(unsafe.Pointer(&b[0]))%lineSize, "n=%d", n)
		}
		for i := range b {
			b[i] = byte(len(bufs) + 1)
		}
		bufs = append(bufs, b)
	}
	for i, b := range bufs {
		require.Equal(t, len(b), bytes.Count(b, []byte{byte(i + 1)}), "buffer %d was overwritten", i)
	}
	f := Slice[float32](1 << 16)
	require.Len(t, f, 1<<16)
	f[len(f)-1] = 1
	assert.Equal(t, float32(1), f[len(f)-1])
	assert.Empty(t, Slice[uint16](0))
}

// TestBytesConcurrent: callers on several goroutines get disjoint buffers.
func TestBytesConcurrent(t *testing.T) {
	const workers, each = 8, 24
	out := make([][][]byte, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				b := Bytes(carveMin + (w*each+i)*4096)
				for j := range b {
					b[j] = byte(w*each + i)
				}
				out[w] = append(out[w], b)
			}
		})
	}
	wg.Wait()
	for w := range workers {
		for i, b := range out[w] {
			require.Equal(t, len(b), bytes.Count(b, []byte{byte(w*each + i)}), "buffer %d of %d was overwritten", i, w)
		}
	}
}
