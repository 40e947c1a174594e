package moe

import (
	"errors"

	"github.com/moex-project/moex/arch"
	"github.com/moex-project/moex/format"
	"github.com/moex-project/moex/format/gguf"
	"github.com/moex-project/moex/internal/memlimit"
)

// The classes of error a caller branches on (errors.Is); each error's
// message still names the tensor, token, layer or file.
var (
	// ErrShape: an input or output of the wrong size.
	// (format.ErrShape: a reader's tensor of the wrong shape is one too).
	ErrShape = format.ErrShape
	// ErrNonFinite: NaN or ±Inf in an input, a weight or an output.
	ErrNonFinite = errors.New("moe: non-finite input")
	// ErrMissingTensor: a tensor the family needs is missing from the
	// checkpoint, or has the wrong shape (format.ErrMissingTensor).
	ErrMissingTensor = format.ErrMissingTensor
	// ErrDenseLayer: the layer asked for is a dense MLP layer, not MoE.
	ErrDenseLayer = arch.ErrDenseLayer
	// ErrUnsupportedFormat: a weight dtype or format moex cannot run.
	// (format.ErrUnsupported).
	ErrUnsupportedFormat = format.ErrUnsupported
	// ErrUnknownFamily: a model_type moex does not know.
	ErrUnknownFamily = arch.ErrUnknownFamily
	// ErrGGUF: a GGUF file that is not well formed or holds what moex
	// cannot read; the message names the key, tensor or byte.
	// (gguf.ErrMalformed).
	ErrGGUF = gguf.ErrMalformed
	// ErrClosed: a call on a closed checkpoint or layer (format.ErrClosed).
	ErrClosed = format.ErrClosed
	// ErrFileChanged: a checkpoint file was cut short or replaced in place
	// while a layer read it through its mapping (moe.Load keeps the
	// experts as views where the kernels do not pack them).
	// (format.ErrFileChanged).
	ErrFileChanged = format.ErrFileChanged
	// ErrTooLarge: sizes whose memory is over the limit (the machine's
	// memory, or SetMemoryLimit's), refused before anything is allocated;
	// dpattn's cache and moex's benchmarks wrap it too.
	ErrTooLarge = memlimit.ErrTooLarge
)

// SetMemoryLimit sets the bytes the constructors of moe and dpattn check
// their sizes against before allocating (0: the machine's memory, the
// default) and returns the previous setting.
func SetMemoryLimit(bytes uint64) uint64 { return memlimit.Set(bytes) }
