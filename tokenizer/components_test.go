package tokenizer_test

import (
	"bufio"
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/tokref"
	"github.com/moex-project/moex/tokenizer"
)

// TestComponents holds each normalizer, pre-tokenizer, added-token flag,
// post-processor, decoder and BPE option to Hugging Face's Rust tokenizers
// on small hand-written tokenizers (testdata/tokenizer/components.jsonl,
// written by scripts/tokref/gen_components.js).
func TestComponents(t *testing.T) {
	f, err := os.Open(tokref.Testdata("tokenizer", "components.jsonl"))
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	n := 0
	for sc.Scan() {
		var c struct {
			Name      string          `json:"name"`
			Tokenizer json.RawMessage `json:"tokenizer"`
			Encode    []struct {
				Text         string  `json:"text"`
				IDs          []int32 `json:"ids"`
				IDsNoSpecial []int32 `json:"ids_no_special"`
			} `json:"encode"`
			Decode []struct {
				IDs             []int32 `json:"ids"`
				Text            string  `json:"text"`
				TextSkipSpecial string  `json:"text_skip_special"`
			} `json:"decode"`
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &c))
		n++
		t.Run(c.Name, func(t *testing.T) {
			tk, err := tokenizer.FromJSON(c.Tokenizer, nil)
			require.NoError(t, err)
			for _, e := range c.Encode {
				ids, err := tk.Encode(e.Text, true)
				require.NoError(t, err)
				require.Equal(t, nonNil(e.IDs), nonNil(ids), "encode %q", e.Text)
				ids, err = tk.Encode(e.Text, false)
				require.NoError(t, err)
				require.Equal(t, nonNil(e.IDsNoSpecial), nonNil(ids), "encode %q without special tokens", e.Text)
			}
			for _, d := range c.Decode {
				text, err := tk.Decode(d.IDs, false)
				require.NoError(t, err)
				require.Equal(t, d.Text, text, "decode %v", d.IDs)
				text, err = tk.Decode(d.IDs, true)
				require.NoError(t, err)
				require.Equal(t, d.TextSkipSpecial, text, "decode %v skipping special tokens", d.IDs)
			}
		})
	}
	require.NoError(t, sc.Err())
	require.Greater(t, n, 40)
}
