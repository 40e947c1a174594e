package chat

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The expected values are Python 3's.

func TestPyFloat(t *testing.T) {
	for f, want := range map[float64]string{
		0: "0.0", 1: "1.0", 0.1: "0.1", 1e16: "1e+16", 1e15: "1000000000000000.0",
		123456789012345678: "1.2345678901234568e+17", 1.5e-5: "1.5e-05", 0.0001: "0.0001",
		0.00012345: "0.00012345", 2.5: "2.5", 1.0 / 3: "0.3333333333333333", -1e-7: "-1e-07",
		1e300: "1e+300", 5e-324: "5e-324", math.Inf(1): "inf", 100: "100.0", 9007199254740993: "9007199254740992.0",
	} {
		assert.Equal(t, want, pyFloat(f), "%v", f)
	}
	assert.Equal(t, "-0.0", pyFloat(math.Copysign(0, -1)))
	assert.Equal(t, "nan", pyFloat(math.NaN()))
}

func TestStrftimeWeeks(t *testing.T) {
	const format = "%U %W %V %G %g %j %u %w %a %I %p %l"
	for _, tc := range []struct {
		at   time.Time
		want string
	}{
		{time.Date(2021, 1, 3, 0, 5, 0, 0, time.UTC), "01 00 53 2020 20 003 7 0 Sun 12 AM 12"},
		{time.Date(2020, 12, 31, 12, 0, 0, 0, time.UTC), "52 52 53 2020 20 366 4 4 Thu 12 PM 12"},
		{time.Date(2024, 12, 30, 23, 59, 59, 0, time.UTC), "52 53 01 2025 25 365 1 1 Mon 11 PM 11"},
	} {
		assert.Equal(t, tc.want, strftime(tc.at, format), "%v", tc.at)
	}
}

func TestPySplitUnicode(t *testing.T) {
	got, err := pySplit("  a\u3000b\u00a0c\x1fd ", nil, -1, false)
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b", "c", "d"}, got)
	got, err = pySplit(" a\u3000b  c ", nil, 1, true)
	require.NoError(t, err)
	assert.Equal(t, []string{" a\u3000b", "c"}, got)
	got, err = pySplit("x\u3000", nil, 0, true)
	require.NoError(t, err)
	assert.Equal(t, []string{"x"}, got)
	got, err = pySplit("", nil, -1, false)
	require.NoError(t, err)
	assert.Equal(t, []string{}, got)
}

func TestPyCase(t *testing.T) {
	assert.Equal(t, "ǅemo ǅx", pyTitle("ǆemo ǅx"))
	assert.Equal(t, "1St 2Nd It'S", pyTitle("1st 2nd it's"))
	assert.Equal(t, "FIX", pyUpper("ﬁx"))
	assert.Equal(t, "i̇x", pyLower("İx"))
	assert.Equal(t, "σ ας", pyLower("Σ ΑΣ"))
}

func TestPyReprString(t *testing.T) {
	for s, want := range map[string]string{
		"a":                        `'a'`,
		"it's":                     `"it's"`,
		`"it's"`:                   `'"it\'s"'`,
		"é\u2028\x00\x7f\u00a0😀\\": `'é\u2028\x00\x7f\xa0😀\\'`,
	} {
		assert.Equal(t, want, pyReprString(s), "%q", s)
	}
}
