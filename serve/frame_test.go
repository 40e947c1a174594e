package serve

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAppendFrame: the hand-built frame is byte for byte what encoding/json
// writes (HTML escaping off) for the same answer, on strings made of every
// kind of character: quotes, backslashes, control characters, U+2028,
// multi-byte characters, bytes that are not UTF-8.
func TestAppendFrame(t *testing.T) {
	pieces := []string{"a", "Z", " ", `"`, `\`, "\n", "\r", "\t", "\b", "\f", "\x00", "\x1f", "\x7f",
		"<", ">", "&", "é", "猫", "🙂", "\u2028", "\u2029", "\xff", "\xc3", "\xe7\x8c", "\uFFFD", "/"}
	rng := rand.New(rand.NewPCG(1, 2))
	var buf []byte
	for trial := range 2000 {
		var text []byte
		for range rng.IntN(12) {
			text = append(text, pieces[rng.IntN(len(pieces))]...)
		}
		rid := string(pieces[rng.IntN(len(pieces))]) + "id"
		ids := make([]int32, rng.IntN(5))
		for i := range ids {
			ids[i] = rng.Int32N(300) - 10
		}
		prompt := rng.IntN(5000)
		var want bytes.Buffer
		enc := json.NewEncoder(&want)
		enc.SetEscapeHTML(false)
		require.NoError(t, enc.Encode(generated{Text: string(text), OutputIDs: ids,
			Meta: metaInfo{ID: rid, PromptTokens: prompt, CompletionTokens: len(ids)}}))
		buf = appendFrame(buf[:0], string(text), ids, rid, prompt)
		require.Equal(t, "data: "+string(bytes.TrimSuffix(want.Bytes(), []byte("\n")))+"\n\n", string(buf), "trial %d, text %q", trial, text)
	}
}
