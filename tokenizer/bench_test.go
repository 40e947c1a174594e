package tokenizer_test

import (
	"bufio"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/tokref"
)

// benchText is the corpus's texts, each followed by a newline, repeated
// to at least 1 MiB: the bytes scripts/tokref/bench.js times the Rust
// tokenizers and tiktoken on (its case=1mb).
func benchText(b *testing.B) string {
	b.Helper()
	f, err := os.Open(tokref.Testdata("tokenizer", "corpus.jsonl"))
	require.NoError(b, err)
	defer f.Close()
	var texts []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var c struct {
			Text string `json:"text"`
		}
		require.NoError(b, json.Unmarshal(sc.Bytes(), &c))
		texts = append(texts, c.Text)
	}
	one := strings.Join(texts, "\n") + "\n"
	return strings.Repeat(one, (1<<20+len(one)-1)/len(one))
}

// BenchmarkEncode times Encode (no special tokens added) on benchText, one
// call, one goroutine: MB/s to set beside the Rust tokenizers' and
// tiktoken's (node scripts/tokref/bench.js).
func BenchmarkEncode(b *testing.B) {
	text := benchText(b)
	for _, model := range []string{"deepseek_v3", "qwen3", "gptoss", "mistral"} {
		b.Run(model, func(b *testing.B) {
			tk, _ := loadReference(b, model)
			b.SetBytes(int64(len(text)))
			b.ResetTimer()
			for b.Loop() {
				if _, err := tk.Encode(text, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
