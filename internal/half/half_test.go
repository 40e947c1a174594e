package half

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// value16 decodes a 16-bit float with the given exponent and mantissa widths
// straight from its definition, in float64: an oracle independent of the
// bit tricks above.
func value16(h uint16, expBits, manBits uint) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	bias := 1<<(expBits-1) - 1
	e := int(h>>manBits) & (1<<expBits - 1)
	m := float64(h & (1<<manBits - 1))
	switch {
	case e == 1<<expBits-1 && m == 0:
		return math.Inf(int(sign))
	case e == 1<<expBits-1:
		return math.NaN()
	case e == 0:
		return sign * math.Ldexp(m, 1-bias-int(manBits))
	}
	return sign * math.Ldexp(1+m/float64(uint(1)<<manBits), e-bias)
}

type format struct {
	name             string
	expBits, manBits uint
	widen            func(uint16) float32
	narrow           func(float32) uint16
}

var formats = []format{
	{"bf16", 8, 7, BF16ToF32, F32ToBF16},
	{"fp16", 5, 10, F16ToF32, F32ToF16},
}

// TestAllValuesBothWays widens every one of the 65,536 bit patterns, checks it
// against the definition, and narrows it back.
func TestAllValuesBothWays(t *testing.T) {
	for _, f := range formats {
		t.Run(f.name, func(t *testing.T) {
			for i := 0; i < 1<<16; i++ {
				h := uint16(i)
				want := value16(h, f.expBits, f.manBits)
				got := f.widen(h)
				if math.IsNaN(want) {
					require.True(t, math.IsNaN(float64(got)), "%#04x widens to %v, want NaN", h, got)
					back := f.narrow(got)
					require.True(t, math.IsNaN(value16(back, f.expBits, f.manBits)), "%#04x NaN narrows to non-NaN %#04x", h, back)
					require.Equal(t, h&0x8000, back&0x8000, "%#04x NaN sign lost", h)
					continue
				}
				require.Equal(t, want, float64(got), "%#04x widens wrongly", h)
				require.Equal(t, math.Signbit(want), math.Signbit(float64(got)), "%#04x sign", h)
				require.Equal(t, h, f.narrow(got), "%#04x does not round-trip", h)
			}
		})
	}
}

// TestRoundsToNearestEven checks narrowing between every pair of adjacent
// finite positive values: the exact midpoint goes to the even pattern, and
// anything just off the midpoint goes to the nearer one.
func TestRoundsToNearestEven(t *testing.T) {
	for _, f := range formats {
		t.Run(f.name, func(t *testing.T) {
			maxExp := uint16(1<<f.expBits-1) << f.manBits // first Inf pattern
			for h := uint16(0); h+1 < maxExp; h++ {       // the last step, to Inf, is in TestOverflowAndSpecials
				lo := value16(h, f.expBits, f.manBits)
				hi := value16(h+1, f.expBits, f.manBits)
				mid := float32((lo + hi) / 2) // exact in float32 for both formats
				require.Equal(t, (lo+hi)/2, float64(mid))
				even := h
				if h&1 == 1 {
					even = h + 1
				}
				require.Equal(t, even, f.narrow(mid), "midpoint of %#04x and %#04x", h, h+1)
				require.Equal(t, h, f.narrow(math.Nextafter32(mid, float32(lo))), "just below midpoint of %#04x", h)
				require.Equal(t, h+1, f.narrow(math.Nextafter32(mid, float32(math.Inf(1)))), "just above midpoint of %#04x", h)
				require.Equal(t, h|0x8000, f.narrow(-math.Nextafter32(mid, float32(lo))), "negative, just below midpoint of %#04x", h)
			}
		})
	}
}

func TestOverflowAndSpecials(t *testing.T) {
	tests := []struct {
		name string
		in   float32
		bf16 uint16
		fp16 uint16
	}{
		{"zero", 0, 0x0000, 0x0000},
		{"negative zero", float32(math.Copysign(0, -1)), 0x8000, 0x8000},
		{"one", 1, 0x3f80, 0x3c00},
		{"inf", float32(math.Inf(1)), 0x7f80, 0x7c00},
		{"-inf", float32(math.Inf(-1)), 0xff80, 0xfc00},
		{"fp16 max", 65504, 0x4780, 0x7bff},
		{"fp16 overflow at 65520", 65520, 0x4780, 0x7c00},
		{"below fp16 overflow", 65519.996, 0x4780, 0x7bff},
		{"float32 max", math.MaxFloat32, 0x7f80, 0x7c00},
		{"smallest fp16 subnormal", 0x1p-24, 0x3380, 0x0001},
		{"half of it ties to zero", 0x1p-25, 0x3300, 0x0000},
		{"tiny", 1e-30, 0x0da2, 0x0000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.bf16, F32ToBF16(tt.in), "bf16")
			require.Equal(t, tt.fp16, F32ToF16(tt.in), "fp16")
		})
	}
}

func TestSliceWidening(t *testing.T) {
	src := []uint16{0x3f80, 0xc000, 0x0000}
	dst := make([]float32, 4)
	dst[3] = 42
	BF16SliceToF32(dst, src)
	require.Equal(t, []float32{1, -2, 0, 42}, dst)
	F16SliceToF32(dst, []uint16{0x3c00, 0xc000})
	require.Equal(t, []float32{1, -2, 0, 42}, dst)
}
