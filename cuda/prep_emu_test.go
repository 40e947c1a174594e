//go:build cudaemu && !cuda

package cuda_test

import (
	"testing"

	"github.com/moex-project/moex/cuda"
)

func TestPrepKernelsOnEmulation(t *testing.T) { testPrepKernels(t, cuda.NewEmu()) }
