package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestGPUReport: with or without a driver, the report says something and
// never fails.
func TestGPUReport(t *testing.T) {
	lines := gpuReport()
	require.NotEmpty(t, lines)
	require.NotEmpty(t, lines[0])
}
