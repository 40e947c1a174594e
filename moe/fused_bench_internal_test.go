package moe

import (
	"testing"
	"unsafe"

	"github.com/moex-project/moex/format/safetensors"
	"github.com/moex-project/moex/kernels"
)

// BenchmarkXWExpert: one expert's gate and up projections out of an x·W
// slab [H, 2I] (Qwen3-VL-MoE and Llama 4 contiguous, gpt-oss interleaved),
// bf16, at Qwen3-VL-30B-A3B's shapes, as the loader did (a transposed copy,
// then packed) and does where the kernels pack (packed from the slab's rows).
func BenchmarkXWExpert(b *testing.B) {
	H, I := 2048, 768
	src := make([]uint16, H*2*I)
	for i := range src {
		src[i] = uint16(i*2654435761>>7) & 0x3fff
	}
	t := safetensors.Tensor{Name: "gate_up_proj", DType: "BF16", Shape: []int{1, H, 2 * I},
		Data: unsafe.Slice((*byte)(unsafe.Pointer(&src[0])), 2*len(src))}
	for _, c := range []struct {
		name                   string
		gateFirst, upFirst, st int
	}{{"contiguous", 0, I, 1}, {"interleaved", 0, 1, 2}} {
		b.Run(c.name+"/transpose-then-pack", func(b *testing.B) {
			for b.Loop() {
				g, err := transposed(t, 0, I, H, 2*I, c.gateFirst, c.st)
				if err != nil {
					b.Fatal(err)
				}
				u, _ := transposed(t, 0, I, H, 2*I, c.upFirst, c.st)
				_, _ = kernels.Pack(g), kernels.Pack(u)
			}
		})
		b.Run(c.name+"/pack-strided", func(b *testing.B) {
			for b.Loop() {
				w, err := slabMatrix(t, 0, H, 2*I)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := kernels.PackStrided(w, c.gateFirst, c.st, I); err != nil {
					b.Fatal(err)
				}
				_, _ = kernels.PackStrided(w, c.upFirst, c.st, I)
			}
		})
	}
}
