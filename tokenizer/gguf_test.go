package tokenizer_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/text/unicode/norm"

	"github.com/moex-project/moex/internal/tokref"
	"github.com/moex-project/moex/tokenizer"
)

// ggufOf is the GGUF vocabulary converted from a reference tokenizer
// (tokref.GGUFMetadata).
func ggufOf(t *testing.T, model string) tokenizer.GGUFVocab {
	t.Helper()
	v, err := tokenizer.ReadGGUFVocab(tokref.GGUFMetadata(t, model))
	require.NoError(t, err)
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
