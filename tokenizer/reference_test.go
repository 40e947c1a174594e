package tokenizer_test

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/tokref"
	"github.com/moex-project/moex/tokenizer"
)

// refCase is a line of testdata/tokenizer/<model>.jsonl, written by
// scripts/tokref/gen.js from Hugging Face's Rust tokenizers.
type refCase struct {
	Name string `json:"name"`
	Text string `json:"text"`

	IDs          []int32 `json:"ids"`
	IDsNoSpecial []int32 `json:"ids_no_special"`

	Decode          []int32 `json:"decode"`
	TextSkipSpecial *string `json:"text_skip_special"`

	// A chat prompt Jinja2 rendered, and its ids without special tokens
	// added.
	ChatText string  `json:"chat_text"`
	ChatIDs  []int32 `json:"chat_ids"`
}

type refHeader struct {
	Model        string `json:"model"`
	Package      string `json:"package"`
	TokenizerSHA string `json:"tokenizer_json_sha256"`
	ConfigSHA    string `json:"tokenizer_config_sha256"`
}

// loadReference loads model's tokenizer and its reference cases, checking
// the files are the ones the cases were made from.
func loadReference(t testing.TB, model string) (*tokenizer.Tokenizer, []refCase) {
	t.Helper()
	dir := tokref.Dir(t, model)
	f, err := os.Open(tokref.Testdata("tokenizer", model+".jsonl"))
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	require.True(t, sc.Scan(), "the header line")
	var h refHeader
	require.NoError(t, json.Unmarshal(sc.Bytes(), &h))
	require.Equal(t, h.TokenizerSHA, fileSHA(t, filepath.Join(dir, "tokenizer.json")), "tokenizer.json is not the file the cases were made from")
	require.Equal(t, h.ConfigSHA, fileSHA(t, filepath.Join(dir, "tokenizer_config.json")), "tokenizer_config.json is not the file the cases were made from")
	var cases []refCase
	for sc.Scan() {
		var c refCase
		require.NoError(t, json.Unmarshal(sc.Bytes(), &c))
		cases = append(cases, c)
	}
	require.NoError(t, sc.Err())
	require.NotEmpty(t, cases)
	tk, err := tokenizer.Load(dir)
	require.NoError(t, err)
	return tk, cases
}

func fileSHA(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestReference holds encode and decode to Hugging Face's output on the
// corpus for DeepSeek-V3, Qwen3, gpt-oss and Mistral.
func TestReference(t *testing.T) {
	for _, model := range []string{"deepseek_v3", "qwen3", "gptoss", "mistral"} {
		t.Run(model, func(t *testing.T) {
			tk, cases := loadReference(t, model)
			var encodes, decodes int
			for _, c := range cases {
				if c.ChatIDs != nil {
					ids, err := tk.Encode(c.ChatText, false)
					require.NoError(t, err, c.Name)
					require.Equal(t, c.ChatIDs, ids, "encode the chat prompt %s", c.Name)
				}
				if c.IDs != nil {
					encodes++
					ids, err := tk.Encode(c.Text, true)
					require.NoError(t, err, c.Name)
					require.Equal(t, c.IDs, nonNil(ids), "encode %s %q", c.Name, short(c.Text))
					ids, err = tk.Encode(c.Text, false)
					require.NoError(t, err, c.Name)
					require.Equal(t, nonNil(c.IDsNoSpecial), nonNil(ids), "encode without special tokens %s %q", c.Name, short(c.Text))
				}
				if c.Decode != nil {
					decodes++
					text, err := tk.Decode(c.Decode, false)
					require.NoError(t, err, c.Name)
					require.Equal(t, c.Text, text, "decode %s %v", c.Name, c.Decode)
					if c.TextSkipSpecial != nil {
						text, err = tk.Decode(c.Decode, true)
						require.NoError(t, err, c.Name)
						require.Equal(t, *c.TextSkipSpecial, text, "decode skipping special tokens %s %v", c.Name, c.Decode)
					}
					require.Equal(t, c.Text, streamed(t, tk, c.Decode), "incremental decode %s", c.Name)
				}
			}
			require.Positive(t, encodes)
			require.Positive(t, decodes)
		})
	}
}

// streamed decodes ids one at a time through a DecodeStream, checking no
// step hands out an unfinished character.
func streamed(t *testing.T, tk *tokenizer.Tokenizer, ids []int32) string {
	t.Helper()
	s := tk.NewDecodeStream(false)
	var b strings.Builder
	for _, id := range ids {
		piece, err := s.Step(id)
		require.NoError(t, err)
		require.False(t, strings.HasSuffix(piece, "\uFFFD"), "a step ended in U+FFFD")
		b.WriteString(piece)
	}
	rest, err := s.Flush()
	require.NoError(t, err)
	return b.String() + rest
}

func nonNil(ids []int32) []int32 {
	if ids == nil {
		return []int32{}
	}
	return ids
}

func short(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// TestConcurrent encodes the corpus from several goroutines at once (the
// word cache is shared): every result equals the reference.
func TestConcurrent(t *testing.T) {
	tk, cases := loadReference(t, "qwen3")
	errs := make(chan error, 4)
	for g := range 4 {
		go func() {
			for i := range cases {
				c := cases[(i+g*37)%len(cases)]
				if c.IDs == nil {
					continue
				}
				ids, err := tk.Encode(c.Text, true)
				if err == nil && !slices.Equal(ids, c.IDs) {
					err = fmt.Errorf("%s: %v, want %v", c.Name, ids, c.IDs)
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 4 {
		require.NoError(t, <-errs)
	}
}

// TestDecodeStreamRandom: on random id sequences rich in byte tokens (half
// characters, invalid runs) and special tokens, a DecodeStream's pieces
// never end in U+FFFD and add up to Decode of all the ids, skipping the
// special tokens or not.
func TestDecodeStreamRandom(t *testing.T) {
	for _, model := range []string{"deepseek_v3", "qwen3", "gptoss", "mistral"} {
		t.Run(model, func(t *testing.T) {
			tk, cases := loadReference(t, model)
			var pool []int32
			for b := range 256 {
				for _, name := range []string{fmt.Sprintf("<0x%02X>", b), byteLevel(byte(b))} {
					if id, ok := tk.ID(name); ok {
						pool = append(pool, id)
					}
				}
			}
			for _, c := range cases {
				if len(c.IDs) > 0 {
					pool = append(pool, c.IDs...)
				}
			}
			rng := rand.New(rand.NewPCG(1, uint64(len(model))))
			for range 300 {
				ids := make([]int32, 1+rng.IntN(12))
				for i := range ids {
					ids[i] = pool[rng.IntN(len(pool))]
				}
				for _, skip := range []bool{false, true} {
					want, err := tk.Decode(ids, skip)
					require.NoError(t, err)
					s := tk.NewDecodeStream(skip)
					var b strings.Builder
					for _, id := range ids {
						piece, err := s.Step(id)
						require.NoError(t, err, "%v", ids)
						require.False(t, strings.HasSuffix(piece, "\uFFFD"), "%v", ids)
						b.WriteString(piece)
					}
					rest, err := s.Flush()
					require.NoError(t, err)
					require.Equal(t, want, b.String()+rest, "%v skip %v", ids, skip)
				}
			}
		})
	}
}

// byteLevel is GPT-2's character for byte b.
func byteLevel(b byte) string {
	n := 0
	for c := range 256 {
		printable := c >= '!' && c <= '~' || c >= 0xA1 && c <= 0xAC || c >= 0xAE && c <= 0xFF
		if c == int(b) {
			if printable {
				return string(rune(c))
			}
			return string(rune(256 + n))
		}
		if !printable {
			n++
		}
	}
	return ""
}
