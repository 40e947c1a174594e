//go:build cuda

package moegpu_test

import (
	"testing"

	"github.com/moex-project/moex/cuda"
	"github.com/moex-project/moex/cuda/cudatest"
)

// testDevice is the device the tests that run on both run on: here the
// GPU.
func testDevice(t *testing.T) cuda.Launcher { return cudatest.Open(t) }
