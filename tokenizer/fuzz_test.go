package tokenizer_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/moex-project/moex/tokenizer"
)

// FuzzFromJSON: any bytes as tokenizer.json and tokenizer_config.json give
// a tokenizer or an error, never a panic; a tokenizer encodes and decodes
// any text.
func FuzzFromJSON(f *testing.F) {
	f.Add([]byte(tinyJSON), []byte(`{"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<s>"}`), "ab <s> [X] c")
	f.Add([]byte(`{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "added_tokens": [{"id": 5, "content": ""}]}`), []byte(nil), "aaa")
	f.Add([]byte(`{"model": {"vocab": {}, "merges": [["a", "b"]]}}`), []byte(`{"bos_token": {}}`), "")
	f.Fuzz(func(t *testing.T, tj, cj []byte, text string) {
		tk, err := tokenizer.FromJSON(tj, cj)
		if err != nil {
			return
		}
		ids, err := tk.Encode(text, true)
		if err != nil {
			if utf8.ValidString(text) {
				t.Fatalf("Encode(%q): %v", text, err)
			}
			return
		}
		if _, err := tk.Decode(ids, false); err != nil {
			t.Fatalf("Decode of Encode's ids: %v", err)
		}
	})
}

// FuzzEncodeDecode: the reference Qwen3 tokenizer encodes any valid text
// and decodes its ids back to the text (NFC-normalized).
func FuzzEncodeDecode(f *testing.F) {
	tk, _ := loadReference(f, "qwen3")
	for _, s := range []string{"Hello, world!", "  \n\t x", "日本語のテキスト", "👨‍👩‍👧", "e\u0301", "<|im_start|>user"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		if !utf8.ValidString(text) {
			return
		}
		ids, err := tk.Encode(text, false)
		if err != nil {
			t.Fatal(err)
		}
		back, err := tk.Decode(ids, false)
		if err != nil {
			t.Fatal(err)
		}
		if want := normNFC(text); back != want {
			t.Fatalf("Decode(Encode(%q)) = %q, want %q", text, back, want)
		}
	})
}

// FuzzFromGGUF: any GGUF vocabulary (repeated and empty tokens, any types,
// merges and special ids) gives a tokenizer or an error, never a panic; a
// tokenizer encodes and decodes any text.
func FuzzFromGGUF(f *testing.F) {
	f.Add("a\x00b\x00a\x00ab", []byte{1, 3, 1, 4}, "a b\x00b a", int32(2), int32(0), false, "abab a<")
	f.Add("\x00<s>\x00x", []byte{2, 3, 1}, "", int32(1), int32(9), true, " x x")
	f.Fuzz(func(t *testing.T, tokens string, types []byte, merges string, bos, eos int32, llama bool, text string) {
		v := tokenizer.GGUFVocab{Model: "gpt2", Pre: "qwen2", Tokens: strings.Split(tokens, "\x00"), BOS: &bos, EOS: &eos}
		if merges != "" {
			v.Merges = strings.Split(merges, "\x00")
		}
		if len(types) == len(v.Tokens) {
			for _, b := range types {
				v.TokenTypes = append(v.TokenTypes, int32(b%8))
			}
		}
		if llama {
			v.Model = "llama"
			for i := range v.Tokens {
				v.Scores = append(v.Scores, float32(-i))
			}
		}
		tk, err := tokenizer.FromGGUF(v)
		if err != nil {
			return
		}
		if !utf8.ValidString(text) {
			return
		}
		ids, err := tk.Encode(text, true)
		if err != nil {
			t.Fatalf("Encode(%q): %v", text, err)
		}
		if _, err := tk.Decode(ids, false); err != nil {
			t.Fatalf("Decode of Encode's ids: %v", err)
		}
	})
}
