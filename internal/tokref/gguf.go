package tokref

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// GGUFMetadata is the tokenizer.* metadata of a GGUF file converted from
// model's Hugging Face tokenizer the way llama.cpp's converter writes it:
// every token by id, the added special tokens as control tokens (type 3)
// and the others as user-defined (4), byte-fallback tokens as bytes (6)
// and the unknown token as unknown (2), the merges as "a b", the
// pre-tokenizer's name, BOS and EOS from tokenizer_config.json and its
// add_bos_token when it has one, the chat template when it has one. A
// SentencePiece vocabulary's scores are rebuilt from tokenizer.json's
// merges, which Hugging Face's converter ordered by the pieces' scores.
// Values are []string, []int32, []float32, string, uint32 and bool.
func GGUFMetadata(t testing.TB, model string) map[string]any {
	t.Helper()
	dir := Dir(t, model)
	var f struct {
		AddedTokens []struct {
			ID      int32  `json:"id"`
			Content string `json:"content"`
			Special bool   `json:"special"`
		} `json:"added_tokens"`
		Model struct {
			Vocab  map[string]int32  `json:"vocab"`
			Merges []json.RawMessage `json:"merges"`
		} `json:"model"`
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("tokref: %s: %v", model, err)
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	must(err)
	must(json.Unmarshal(b, &f))
	var cfg map[string]any
	b, err = os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	must(err)
	must(json.Unmarshal(b, &cfg))

	n := int32(0)
	for _, id := range f.Model.Vocab {
		n = max(n, id+1)
	}
	for _, a := range f.AddedTokens {
		n = max(n, a.ID+1)
	}
	tokens, types := make([]string, n), make([]int32, n)
	ids := map[string]int32{}
	byteTok := regexp.MustCompile(`^<0x[0-9A-F]{2}>$`)
	for tok, id := range f.Model.Vocab {
		tokens[id], types[id], ids[tok] = tok, 1, id
		if byteTok.MatchString(tok) {
			types[id] = 6
		}
	}
	for _, a := range f.AddedTokens {
		tokens[a.ID], types[a.ID], ids[a.Content] = a.Content, 4, a.ID
		if a.Special {
			types[a.ID] = 3
		}
	}
	meta := map[string]any{"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types}
	special := func(key, gguf string) (int32, bool) {
		var s string
		switch x := cfg[key].(type) {
		case string:
			s = x
		case map[string]any:
			s, _ = x["content"].(string)
		default:
			return 0, false
		}
		id, ok := ids[s]
		if !ok {
			t.Fatalf("tokref: %s: %s %q is not a token", model, key, s)
		}
		meta[gguf] = uint32(id)
		return id, true
	}
	special("bos_token", "tokenizer.ggml.bos_token_id")
	special("eos_token", "tokenizer.ggml.eos_token_id")
	if x, ok := cfg["add_bos_token"].(bool); ok {
		meta["tokenizer.ggml.add_bos_token"] = x
	}
	if x, ok := cfg["chat_template"].(string); ok {
		meta["tokenizer.chat_template"] = x
	}
	switch model {
	case "mistral":
		meta["tokenizer.ggml.model"] = "llama"
		if unk, ok := special("unk_token", "tokenizer.ggml.unknown_token_id"); ok {
			types[unk] = 2
		}
		scores := make([]float32, n)
		for rank, m := range f.Model.Merges {
			var s string
			must(json.Unmarshal(m, &s))
			a, b, _ := strings.Cut(s, " ")
			if id := ids[a+b]; scores[id] == 0 {
				scores[id] = -float32(rank + 1) // the first merge that makes the piece
			}
		}
		meta["tokenizer.ggml.scores"] = scores
	default:
		meta["tokenizer.ggml.model"] = "gpt2"
		meta["tokenizer.ggml.pre"] = map[string]string{"deepseek_v3": "deepseek-v3", "qwen3": "qwen2", "gptoss": "gpt-4o"}[model]
		merges := make([]string, 0, len(f.Model.Merges))
		for _, m := range f.Model.Merges {
			var s string
			if len(m) > 0 && m[0] == '[' {
				var p []string
				must(json.Unmarshal(m, &p))
				s = p[0] + " " + p[1]
			} else {
				must(json.Unmarshal(m, &s))
			}
			merges = append(merges, s)
		}
		meta["tokenizer.ggml.merges"] = merges
	}
	return meta
}
