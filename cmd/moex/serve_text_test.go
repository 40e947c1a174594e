package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/moetest"
)

// charVocab is a tokenizer of the tiny whole model's 40 ids: the letters
// (0–25), space 26, ':' 27, newline 28, the digits 0–6 (29–35), then <s>
// 36 and </s> 37 (special) and <think> 38, </think> 39; no merges, so a
// text's ids are its characters'.
const charVocab = "abcdefghijklmnopqrstuvwxyz :\n0123456"

// writeTextModel writes a whole deepseek_v2 model of 40 ids with its
// tokenizer, chat template and generation config.
func writeTextModel(t *testing.T) string {
	t.Helper()
	w, err := moetest.GenerateWhole(smallWhole(40))
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, w.WriteTo(dir))
	ordered := []rune(charVocab)
	vocabJSON := map[string]int{}
	for i, r := range ordered {
		vocabJSON[string(r)] = i
	}
	tj, err := json.Marshal(map[string]any{
		"added_tokens": []map[string]any{
			{"id": 36, "content": "<s>", "special": true}, {"id": 37, "content": "</s>", "special": true},
			{"id": 38, "content": "<think>"}, {"id": 39, "content": "</think>"},
		},
		"decoder": map[string]any{"type": "Fuse"},
		"model":   map[string]any{"type": "BPE", "vocab": vocabJSON, "merges": []string{}},
	})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokenizer.json"), tj, 0o644))
	cfg := map[string]any{
		"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
		"chat_template": "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}" +
			"{% if add_generation_prompt %}assistant:{% endif %}",
	}
	cj, err := json.Marshal(cfg)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), cj, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "generation_config.json"), []byte(`{"eos_token_id": [37, 39]}`), 0o644))
	return dir
}

// charIDs are the ids of text in charVocab.
func charIDs(text string) []int32 {
	var ids []int32
	for _, r := range text {
		ids = append(ids, int32(strings.IndexRune(charVocab, r)))
	}
	return ids
}

// TestServeText: moex serve --model of a whole model with its tokenizer
// answers text and chat requests (the chat rendered by the model's own
// template, its BOS once), and /tokenize and /detokenize round-trip.
func TestServeText(t *testing.T) {
	dir := writeTextModel(t)
	url, stop := startServe(t, "--model", dir, "--kv-blocks", "64")
	defer func() { require.NoError(t, stop()); http.DefaultClient.CloseIdleConnections() }()
	post := func(path, body string) (int, string) {
		resp, err := http.Post(url+path, "application/json", strings.NewReader(body))
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	status, body := post("/tokenize", `{"prompt": "hi there"}`)
	require.Equal(t, http.StatusOK, status, body)
	var tok struct {
		Tokens []int32 `json:"tokens"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &tok))
	require.Equal(t, append([]int32{36}, charIDs("hi there")...), tok.Tokens, "the prompt's characters after <s>")

	rendered := "user: hi\nassistant:"
	status, body = post("/tokenize", `{"messages": [{"role": "user", "content": "hi"}]}`)
	require.Equal(t, http.StatusOK, status, body)
	require.NoError(t, json.Unmarshal([]byte(body), &tok))
	require.Equal(t, append([]int32{36}, charIDs(rendered)...), tok.Tokens, "the template's text with its one <s>")

	status, body = post("/detokenize", `{"tokens": [36, 7, 8, 37]}`)
	require.Equal(t, http.StatusOK, status, body)
	var detok struct{ Prompt, Content string }
	require.NoError(t, json.Unmarshal([]byte(body), &detok))
	require.Equal(t, "<s>hi</s>", detok.Prompt)
	require.Equal(t, "<s>hi</s>", detok.Content)

	status, body = post("/generate", `{"text": "hi", "sampling_params": {"max_new_tokens": 3, "temperature": 0, "ignore_eos": true}}`)
	require.Equal(t, http.StatusOK, status, body)
	var g struct {
		Text string  `json:"text"`
		IDs  []int32 `json:"output_ids"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &g))
	require.Len(t, g.IDs, 3)
	var want strings.Builder
	for _, id := range g.IDs {
		if id < 36 {
			want.WriteRune([]rune(charVocab)[id])
		} else if id >= 38 {
			want.WriteString([]string{"<think>", "</think>"}[id-38])
		}
	}
	require.Equal(t, want.String(), g.Text, "the text of the ids, without the special tokens")

	status, body = post("/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0, "ignore_eos": true}`)
	require.Equal(t, http.StatusOK, status, body)
	var c struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &c))
	require.Equal(t, 1+len(rendered), c.Usage.PromptTokens)

	status, body = post("/v1/chat/completions", `{"messages": [{"role": "user"}, 5]}`)
	require.Equal(t, http.StatusBadRequest, status, body)
	require.Contains(t, body, "messages[1] is not an object")

	// The router in front, matching chats on the template's prompt.
	rurl, stopRouter := startUntil(t, routeUntil, "--worker", url, "--model", dir)
	resp, err := http.Post(rurl+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0, "ignore_eos": true}`))
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
	require.Contains(t, string(b), `"prompt_tokens":20`)
	require.NoError(t, stopRouter())
	err = routeUntil(context.Background(), []string{"--worker", url, "--model", t.TempDir()}, io.Discard, io.Discard)
	require.ErrorContains(t, err, "tokenizer.json")
}

// TestServeTextStops: generation ends at an id of generation_config.json's
// eos_token_id (here the id the model's greedy answer starts with).
func TestServeTextStops(t *testing.T) {
	dir := writeTextModel(t)
	body := `{"text": "hi", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}`
	generate := func() (ids []int32, reason string) {
		url, stop := startServe(t, "--model", dir, "--kv-blocks", "64")
		defer func() { require.NoError(t, stop()); http.DefaultClient.CloseIdleConnections() }()
		resp, err := http.Post(url+"/generate", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		defer resp.Body.Close()
		var g struct {
			IDs  []int32 `json:"output_ids"`
			Meta struct {
				FinishReason struct {
					Type string `json:"type"`
				} `json:"finish_reason"`
			} `json:"meta_info"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&g))
		return g.IDs, g.Meta.FinishReason.Type
	}
	ids, _ := generate()
	require.NotEmpty(t, ids)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "generation_config.json"), []byte(fmt.Sprintf(`{"eos_token_id": [%d]}`, ids[0])), 0o644))
	stopped, reason := generate()
	require.Equal(t, ids[:1], stopped)
	require.Equal(t, "stop", reason)
}
