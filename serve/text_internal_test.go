package serve

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSplitReasoning(t *testing.T) {
	for _, c := range []struct {
		name              string
		text              string
		thinking, final   bool
		reasoning, answer string
	}{
		{"no thinking", "Hello", false, true, "", "Hello"},
		{"think block", "<think>\nweigh it\n</think>\n\nYes.", false, true, "\nweigh it\n", "\n\nYes."},
		{"leading space before <think>", "\n<think>a</think>b", false, true, "a", "b"},
		{"prompt opened the thinking", "weigh it</think>Yes.", true, true, "weigh it", "Yes."},
		{"still thinking", "<think>weigh", false, false, "weigh", ""},
		{"a partial </think> is held back", "<think>weigh</thi", false, false, "weigh", ""},
		{"a finished answer keeps a partial marker", "<think>weigh</thi", false, true, "weigh</thi", ""},
		{"the start of <think> itself", "<thi", false, false, "", ""},
		{"a </think> without thinking stays content", "a</think>b", false, true, "", "a</think>b"},
		{"a <think> again after the prompt opened one", "\n<thi", true, false, "", ""},
		{"…and once whole", "\n<think>weigh</think>Yes", true, true, "weigh", "Yes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, a := splitReasoning(c.text, c.thinking, c.final)
			require.Equal(t, c.reasoning, r)
			require.Equal(t, c.answer, a)
		})
	}
}
