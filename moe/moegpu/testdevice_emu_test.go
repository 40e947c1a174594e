//go:build cudaemu && !cuda

package moegpu_test

import (
	"testing"

	"github.com/moex-project/moex/cuda"
)

// testDevice is the device the tests that run on both run on: here the
// CPU emulation.
func testDevice(*testing.T) cuda.Launcher { return cuda.NewEmu() }
