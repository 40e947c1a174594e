//go:build cuda || cudaemu

package cuda

import (
	"context"
	"errors"
)

// A Graph is a recorded sequence of kernel launches on fixed buffers that
// runs as one unit: a CUDA graph on a GPU, the recorded calls on the
// emulation. Replays read the buffers' contents at the time: new inputs
// copied into the same buffers give new results.
type Graph interface {
	// Replay runs the graph; ctx bounds what it waits for on the host (the
	// emulation's collectives).
	Replay(ctx context.Context) error
	// Close frees the graph once its replays have finished; a second
	// Close does nothing.
	Close() error
}

// errCopyInGraph: copies are not recorded into graphs.
var errCopyInGraph = errors.New("cuda: a copy while capturing a graph: copy inputs before Replay and outputs after")
