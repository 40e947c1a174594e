package tokenizer_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/text/unicode/norm"

	"github.com/moex-project/moex/internal/tokref"
	"github.com/moex-project/moex/tokenizer"
)

// ggufOf writes a Hugging Face tokenizer as a GGUF vocabulary the way
// llama.cpp's converter does: every token by id, the added special tokens
// as control tokens and the others as user-defined, byte-fallback tokens
// as bytes, the merges as "a b", the pre-tokenizer's name, BOS and EOS
// from tokenizer_config.json and its add_bos_token when it has one. A
// SentencePiece vocabulary's scores are rebuilt from tokenizer.json's
// merges, which Hugging Face's converter ordered by the pieces' scores.
func ggufOf(t *testing.T, model string) tokenizer.GGUFVocab {
	t.Helper()
	dir := tokref.Dir(t, model)
	var f struct {
		AddedTokens []struct {
			ID      int32  `json:"id"`
			Content string `json:"content"`
			Special bool   `json:"special"`
		} `json:"added_tokens"`
		Model struct {
			Vocab  map[string]int32 `json:"vocab"`
			Merges []json.RawMessage
		} `json:"model"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &f))
	var cfg map[string]any
	b, err = os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &cfg))

	n := int32(0)
	for _, id := range f.Model.Vocab {
		n = max(n, id+1)
	}
	for _, a := range f.AddedTokens {
		n = max(n, a.ID+1)
	}
	v := tokenizer.GGUFVocab{Tokens: make([]string, n), TokenTypes: make([]int32, n)}
	byteTok := regexp.MustCompile(`^<0x[0-9A-F]{2}>$`)
	for tok, id := range f.Model.Vocab {
		v.Tokens[id], v.TokenTypes[id] = tok, 1
		if byteTok.MatchString(tok) {
			v.TokenTypes[id] = 6
		}
	}
	ids := map[string]int32{}
	for tok, id := range f.Model.Vocab {
		ids[tok] = id
	}
	for _, a := range f.AddedTokens {
		v.Tokens[a.ID], v.TokenTypes[a.ID] = a.Content, 4
		if a.Special {
			v.TokenTypes[a.ID] = 3
		}
		ids[a.Content] = a.ID
	}
	special := func(key string) *int32 {
		var s string
		switch x := cfg[key].(type) {
		case string:
			s = x
		case map[string]any:
			s, _ = x["content"].(string)
		default:
			return nil
		}
		id, ok := ids[s]
		require.True(t, ok, key)
		return &id
	}
	v.BOS, v.EOS = special("bos_token"), special("eos_token")
	if x, ok := cfg["add_bos_token"].(bool); ok {
		v.AddBOS = &x
	}
	switch model {
	case "mistral":
		v.Model = "llama"
		v.UNK = special("unk_token")
		v.TokenTypes[*v.UNK] = 2
		// A piece's score: minus the rank of the first merge that makes it
		// (tokenizer.json's merges are the pieces in score order).
		v.Scores = make([]float32, n)
		for rank, m := range f.Model.Merges {
			var s string
			require.NoError(t, json.Unmarshal(m, &s))
			a, b, _ := strings.Cut(s, " ")
			if id := ids[a+b]; v.Scores[id] == 0 {
				v.Scores[id] = -float32(rank + 1)
			}
		}
	default:
		v.Model = "gpt2"
		v.Pre = map[string]string{"deepseek_v3": "deepseek-v3", "qwen3": "qwen2", "gptoss": "gpt-4o"}[model]
		for _, m := range f.Model.Merges {
			var s string
			if json.Unmarshal(m, &s) != nil {
				var p []string
				require.NoError(t, json.Unmarshal(m, &p))
				s = p[0] + " " + p[1]
			}
			v.Merges = append(v.Merges, s)
		}
	}
	return v
}

// TestGGUFVocab: a GGUF vocabulary converted from each reference
// tokenizer gives Hugging Face's ids on the corpus (llama.cpp runs no
// normalizer, so for Qwen's NFC only the texts NFC leaves alone count).
func TestGGUFVocab(t *testing.T) {
	for _, model := range []string{"deepseek_v3", "qwen3", "gptoss", "mistral"} {
		t.Run(model, func(t *testing.T) {
			_, cases := loadReference(t, model)
			tk, err := tokenizer.FromGGUF(ggufOf(t, model))
			require.NoError(t, err)
			checked := 0
			for _, c := range cases {
				if c.IDs == nil || model == "qwen3" && !norm.NFC.IsNormalString(c.Text) {
					continue
				}
				checked++
				ids, err := tk.Encode(c.Text, true)
				require.NoError(t, err)
				require.Equal(t, c.IDs, nonNil(ids), "encode %s %q", c.Name, short(c.Text))
				ids, err = tk.Encode(c.Text, false)
				require.NoError(t, err)
				require.Equal(t, nonNil(c.IDsNoSpecial), nonNil(ids), "encode without special tokens %s %q", c.Name, short(c.Text))
			}
			require.Greater(t, checked, 150)
			for _, c := range cases {
				if c.Decode != nil {
					text, err := tk.Decode(c.Decode, false)
					require.NoError(t, err)
					require.Equal(t, c.Text, text, "decode %s %v", c.Name, c.Decode)
				}
			}
		})
	}
}

func TestGGUFBadInput(t *testing.T) {
	base := func() tokenizer.GGUFVocab {
		return tokenizer.GGUFVocab{Model: "gpt2", Pre: "qwen2", Tokens: []string{"a", "b", "ab"}, Merges: []string{"a b"}}
	}
	tk, err := tokenizer.FromGGUF(base())
	require.NoError(t, err)
	ids, err := tk.Encode("abab", false)
	require.NoError(t, err)
	require.Equal(t, []int32{2, 2}, ids)
	for _, c := range []struct {
		name  string
		edit  func(*tokenizer.GGUFVocab)
		class error
		words string
	}{
		{"unknown pre-tokenizer", func(v *tokenizer.GGUFVocab) { v.Pre = "deepseek-llm" }, tokenizer.ErrUnsupported, `pre-tokenizer "deepseek-llm"`},
		{"unknown model", func(v *tokenizer.GGUFVocab) { v.Model = "bert" }, tokenizer.ErrUnsupported, `model "bert"`},
		{"no tokens", func(v *tokenizer.GGUFVocab) { v.Tokens = nil }, tokenizer.ErrFormat, "tokenizer.ggml.tokens"},
		{"token types short", func(v *tokenizer.GGUFVocab) { v.TokenTypes = []int32{1} }, tokenizer.ErrFormat, "token_type has 1 entries for 3"},
		{"merge without a space", func(v *tokenizer.GGUFVocab) { v.Merges = []string{"ab"} }, tokenizer.ErrFormat, "merges[0]"},
		{"merge of unknown tokens", func(v *tokenizer.GGUFVocab) { v.Merges = []string{"a c"} }, tokenizer.ErrFormat, `"c" is not in the vocabulary`},
		{"bos out of range", func(v *tokenizer.GGUFVocab) { v.BOS = new(int32(7)) }, tokenizer.ErrFormat, "bos_token_id 7"},
		{"llama without scores", func(v *tokenizer.GGUFVocab) { v.Model = "llama" }, tokenizer.ErrFormat, "scores"},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := base()
			c.edit(&v)
			_, err := tokenizer.FromGGUF(v)
			require.ErrorIs(t, err, c.class)
			require.ErrorContains(t, err, c.words)
		})
	}

	v, err := tokenizer.ReadGGUFVocab(map[string]any{"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2",
		"tokenizer.ggml.tokens": []any{"a", "b"}, "tokenizer.ggml.token_type": []any{int32(1), int32(3)},
		"tokenizer.ggml.bos_token_id": uint32(1), "tokenizer.ggml.add_bos_token": true, "tokenizer.chat_template": "{{ x }}"})
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b"}, v.Tokens)
	require.Equal(t, []int32{1, 3}, v.TokenTypes)
	require.Equal(t, int32(1), *v.BOS)
	require.True(t, *v.AddBOS)
	require.Equal(t, "{{ x }}", v.ChatTemplate)
	for key, val := range map[string]any{"tokenizer.ggml.model": 3, "tokenizer.ggml.tokens": []any{"a", 2},
		"tokenizer.ggml.scores": "x", "tokenizer.ggml.eos_token_id": 1.5, "tokenizer.ggml.add_bos_token": "yes"} {
		_, err := tokenizer.ReadGGUFVocab(map[string]any{key: val})
		require.ErrorIs(t, err, tokenizer.ErrFormat, key)
		require.ErrorContains(t, err, key)
	}
}

func normNFC(s string) string { return norm.NFC.String(s) }
