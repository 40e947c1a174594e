//go:build cudaemu && !cuda

package epgpu

import (
	"context"
	"fmt"
	"unsafe"

	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/ep"
)

// EmuComm is a DeviceComm on the emulation: its collectives read and write
// the emulated device's memory and exchange the bytes over an ep.Comm (the
// ranks of one process share the emulated device). They are steps of the
// stream like NCCL's, so graphs hold them and replay them.
type EmuComm struct {
	e *cuda.Emu
	c ep.Comm
}

// NewEmuComm makes a DeviceComm of c on e; its collectives run under the
// context of their enqueue, or in a graph of its Replay.
func NewEmuComm(e *cuda.Emu, c ep.Comm) *EmuComm {
	return &EmuComm{e: e, c: c}
}

func (m *EmuComm) Rank() int { return m.c.Rank() }
func (m *EmuComm) Size() int { return m.c.Size() }

// bytesOf is n bytes of the emulated memory of b.
func (m *EmuComm) bytesOf(b cuda.Buffer, n int64) []byte { return m.e.Bytes(b, n) }

func (m *EmuComm) AllGather(ctx context.Context, l cuda.Launcher, send, recv cuda.Buffer, bytes int64) error {
	if err := checkAllGather(m, send, recv, bytes); err != nil {
		return err
	}
	return l.Collective(ctx, "all-gather", func(ctx context.Context, _ uintptr) error {
		parts, err := m.c.AllGather(ctx, append([]byte(nil), m.bytesOf(send, bytes)...))
		if err != nil {
			return err
		}
		out := m.bytesOf(recv, int64(len(parts))*bytes)
		for r, p := range parts {
			if int64(len(p)) != bytes {
				return fmt.Errorf("rank %d sent %d bytes, want %d", r, len(p), bytes)
			}
			copy(out[int64(r)*bytes:], p)
		}
		return nil
	})
}

func (m *EmuComm) ReduceScatter(ctx context.Context, l cuda.Launcher, send, recv cuda.Buffer, count int) error {
	if err := checkReduceScatter(m, send, recv, count); err != nil {
		return err
	}
	return l.Collective(ctx, "reduce-scatter", func(ctx context.Context, _ uintptr) error {
		v := append([]float32(nil), unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(m.bytesOf(send, int64(m.Size()*count*4))))), m.Size()*count)...)
		counts := make([]int, m.Size())
		for r := range counts {
			counts[r] = count
		}
		mine, err := m.c.ReduceScatter(ctx, v, counts)
		if err != nil {
			return err
		}
		if len(mine) != count {
			return fmt.Errorf("%d values back, want %d", len(mine), count)
		}
		copy(unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(m.bytesOf(recv, int64(count*4))))), count), mine)
		return nil
	})
}

// Wait: the emulation's collectives finished when they ran.
func (m *EmuComm) Wait(ctx context.Context) error { return nil }

func (m *EmuComm) Agree(ctx context.Context, ok bool) (bool, error) { return agree(ctx, m.c, ok) }
