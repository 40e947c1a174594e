package model

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestNonFinite(t *testing.T) {
	inf := float32(math.Inf(1))
	nan := float32(math.NaN())
	assert.Equal(t, -1, nonFinite(nil))
	assert.Equal(t, -1, nonFinite([]float32{0, float32(math.Copysign(0, -1)), math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32}))
	assert.Equal(t, 2, nonFinite([]float32{1, 2, nan, inf}))
	assert.Equal(t, 1, nonFinite([]float32{1, inf, nan}))
	assert.Equal(t, 0, nonFinite([]float32{-inf}))
}
