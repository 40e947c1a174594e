package tokenizer_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/tokenizer"
)

// tinyJSON is a hand-made tokenizer.json: four characters, two merges, a
// special <s> added by a TemplateProcessing, a Replace normalizer and a
// whitespace split; its ids below are worked out by hand from BPE's
// definition.
const tinyJSON = `{
  "added_tokens": [{"id": 6, "content": "<s>", "special": true, "normalized": false},
                   {"id": 7, "content": "[X]", "special": false, "normalized": true}],
  "normalizer": {"type": "Replace", "pattern": {"String": "c"}, "content": "a"},
  "pre_tokenizer": {"type": "WhitespaceSplit"},
  "post_processor": {"type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
    "special_tokens": {"<s>": {"id": "<s>", "ids": [6], "tokens": ["<s>"]}}},
  "decoder": null,
  "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "abab": 3, "x": 4, "aba": 5},
            "merges": ["a b", "ab ab"]}
}`

func tiny(t *testing.T, patch func(string) string) (*tokenizer.Tokenizer, error) {
	t.Helper()
	j := tinyJSON
	if patch != nil {
		j = patch(j)
	}
	return tokenizer.FromJSON([]byte(j), nil)
}

func TestTiny(t *testing.T) {
	tk, err := tiny(t, nil)
	require.NoError(t, err)
	for _, c := range []struct {
		name, text string
		special    bool
		ids        []int32
	}{
		{"merges in rank order", "abab", false, []int32{3}},
		{"an odd tail stays", "ababa", false, []int32{3, 0}},
		{"normalizer first (c becomes a)", "cbab", false, []int32{3}},
		{"the template adds <s>", "ab", true, []int32{6, 2}},
		{"special token in the text", "ab<s>ab", false, []int32{2, 6, 2}},
		{"a normalized added token after the normalizer", "[X] ab", false, []int32{7, 2}},
		{"white space splits words", "ab ab", false, []int32{2, 2}},
		{"a character outside the vocabulary drops (no unk) and its neighbours merge", "azb", false, []int32{2}},
		{"empty text", "", true, []int32{6}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ids, err := tk.Encode(c.text, c.special)
			require.NoError(t, err)
			require.Equal(t, c.ids, ids)
		})
	}
	text, err := tk.Decode([]int32{6, 3, 0}, false)
	require.NoError(t, err)
	require.Equal(t, "<s> abab a", text, "no decoder: tokens joined with spaces, as the Rust library")
	text, err = tk.Decode([]int32{6, 3, 0}, true)
	require.NoError(t, err)
	require.Equal(t, "abab a", text)
}

func TestBadInput(t *testing.T) {
	tk, err := tiny(t, nil)
	require.NoError(t, err)
	_, err = tk.Decode([]int32{0, 99}, false)
	require.ErrorIs(t, err, tokenizer.ErrUnknownID)
	require.ErrorContains(t, err, "id 99 (position 1)")
	_, err = tk.Decode([]int32{-1}, false)
	require.ErrorIs(t, err, tokenizer.ErrUnknownID)
	_, err = tk.Encode("ab\xffab", false)
	require.ErrorIs(t, err, tokenizer.ErrInvalidUTF8)
	require.ErrorContains(t, err, "byte 2")

	replace := func(old, new string) func(string) string {
		return func(s string) string { return strings.Replace(s, old, new, 1) }
	}
	for _, c := range []struct {
		name  string
		patch func(string) string
		class error
		words string
	}{
		{"not JSON", func(string) string { return "{" }, tokenizer.ErrFormat, "tokenizer.json"},
		{"empty", func(string) string { return "" }, tokenizer.ErrFormat, "empty"},
		{"no model", replace(`"model": {`, `"other": {`), tokenizer.ErrFormat, "no model"},
		{"unigram", replace(`"type": "BPE"`, `"type": "Unigram"`), tokenizer.ErrUnsupported, `"Unigram"`},
		{"unknown pre-tokenizer", replace(`"WhitespaceSplit"`, `"Fancy"`), tokenizer.ErrUnsupported, `pre-tokenizer "Fancy"`},
		{"unknown normalizer", replace(`"type": "Replace"`, `"type": "Precompiled"`), tokenizer.ErrUnsupported, `normalizer "Precompiled"`},
		{"bad regex", replace(`{"String": "c"}`, `{"Regex": "(?<"}`), tokenizer.ErrFormat, "regex"},
		{"merge of an unknown token", replace(`"a b"`, `"a q"`), tokenizer.ErrFormat, `"q" is not in the vocabulary`},
		{"merge result missing", replace(`"ab ab"`, `"b a"`), tokenizer.ErrFormat, `merged token "ba"`},
		{"merge not a pair", replace(`"a b"`, `"a b c"`), tokenizer.ErrFormat, "merge 0"},
		{"template's special undefined", replace(`"special_tokens": {"<s>"`, `"special_tokens": {"<t>"`), tokenizer.ErrFormat, `"<s>"`},
		{"template id out of range", replace(`"ids": [6]`, `"ids": [60]`), tokenizer.ErrFormat, "id 60"},
		{"bad behavior", replace(`{"type": "WhitespaceSplit"}`, `{"type": "Split", "pattern": {"String": " "}, "behavior": "Sideways"}`), tokenizer.ErrFormat, `"Sideways"`},
		{"unknown decoder", replace(`"decoder": null`, `"decoder": {"type": "CTC"}`), tokenizer.ErrUnsupported, `decoder "CTC"`},
		{"dropout", replace(`"type": "BPE",`, `"type": "BPE", "dropout": 0.1,`), tokenizer.ErrUnsupported, "dropout"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := tiny(t, c.patch)
			require.ErrorIs(t, err, c.class)
			require.ErrorContains(t, err, c.words)
		})
	}

	_, err = tokenizer.FromJSON([]byte(tinyJSON), []byte(`{"tokenizer_class": "LlamaTokenizerFast"`))
	require.ErrorIs(t, err, tokenizer.ErrFormat)
	require.ErrorContains(t, err, "tokenizer_config.json")
	_, err = tokenizer.FromJSON([]byte(tinyJSON), []byte(`{"tokenizer_class": "LlamaTokenizerFast"}`))
	require.ErrorIs(t, err, tokenizer.ErrFormat)
	require.ErrorContains(t, err, "add_bos_token is set but there is no bos_token")
	_, err = tokenizer.FromJSON([]byte(tinyJSON), []byte(`{"bos_token": "<nope>"}`))
	require.ErrorContains(t, err, `bos_token "<nope>" is not a token`)
	_, err = tokenizer.FromJSON([]byte(tinyJSON), []byte(`{"eos_token": 5}`))
	require.ErrorContains(t, err, "eos_token")

	dir := t.TempDir()
	_, err = tokenizer.Load(dir)
	require.ErrorContains(t, err, "tokenizer.json")
	require.NoError(t, os.Mkdir(filepath.Join(dir, "tokenizer.json"), 0o755))
	_, err = tokenizer.Load(dir)
	require.Error(t, err, "a directory in place of tokenizer.json")
}

func TestLlamaClassBOS(t *testing.T) {
	// transformers rebuilds a Llama tokenizer's post-processor from
	// add_bos_token and add_eos_token, whatever tokenizer.json says.
	cfg := `{"tokenizer_class": "LlamaTokenizerFast", "bos_token": {"content": "<s>", "__type": "AddedToken"}, "eos_token": "aba", "add_bos_token": false, "add_eos_token": true}`
	tk, err := tokenizer.FromJSON([]byte(tinyJSON), []byte(cfg))
	require.NoError(t, err)
	ids, err := tk.Encode("ab", true)
	require.NoError(t, err)
	require.Equal(t, []int32{2, 5}, ids)
	bos, ok := tk.BOS()
	require.True(t, ok)
	require.Equal(t, int32(6), bos)
	require.Equal(t, map[string]string{"bos_token": "<s>", "eos_token": "aba"}, tk.SpecialTokens())
}

func TestStopIDs(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(tinyJSON), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(`{"eos_token": "x"}`), 0o644))
	tk, err := tokenizer.Load(dir)
	require.NoError(t, err)
	ids, err := tokenizer.StopIDs(dir, tk)
	require.NoError(t, err)
	require.Equal(t, []int32{4}, ids, "no generation_config.json: the tokenizer's EOS")
	for _, c := range []struct {
		json string
		ids  []int32
		err  string
	}{
		{`{"eos_token_id": [5, 4, 1]}`, []int32{1, 4, 5}, ""},
		{`{"eos_token_id": 2}`, []int32{2, 4}, ""},
		{`{"eos_token_id": null}`, []int32{4}, ""},
		{`{"eos_token_id": "x"}`, nil, "neither an id nor a list"},
		{`{"eos_token_id": 500}`, nil, "outside the vocabulary"},
		{`[`, nil, "generation_config.json"},
	} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "generation_config.json"), []byte(c.json), 0o644))
		ids, err := tokenizer.StopIDs(dir, tk)
		if c.err != "" {
			require.ErrorContains(t, err, c.err, c.json)
			continue
		}
		require.NoError(t, err, c.json)
		require.Equal(t, c.ids, ids, c.json)
	}
}
