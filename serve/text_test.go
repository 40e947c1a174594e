package serve_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/model"
	"github.com/moex-project/moex/serve"
	"github.com/moex-project/moex/tokenizer"
)

// byteTokenizer is a byte-level tokenizer.json whose ids are the tiny
// model's: byte b is id b (GPT-2's printable character for it), then the
// added tokens <|bos|> 256 and <|eos|> 257 (special) and <think> 258 and
// </think> 259 (not special). No merges: a text's ids are its bytes.
func byteTokenizer(t *testing.T) *tokenizer.Tokenizer {
	t.Helper()
	vocab := map[string]int{}
	n := 0
	for b := range 256 {
		r := rune(b)
		if !(b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE && b <= 0xFF) {
			r = rune(256 + n)
			n++
		}
		vocab[string(r)] = b
	}
	added := []map[string]any{
		{"id": 256, "content": "<|bos|>", "special": true},
		{"id": 257, "content": "<|eos|>", "special": true},
		{"id": 258, "content": "<think>", "special": false},
		{"id": 259, "content": "</think>", "special": false},
	}
	j, err := json.Marshal(map[string]any{
		"added_tokens":   added,
		"pre_tokenizer":  map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
		"post_processor": map[string]any{"type": "TemplateProcessing", "single": []any{map[string]any{"SpecialToken": map[string]any{"id": "<|bos|>"}}, map[string]any{"Sequence": map[string]any{"id": "A"}}}, "special_tokens": map[string]any{"<|bos|>": map[string]any{"id": "<|bos|>", "ids": []int{256}}}},
		"decoder":        map[string]any{"type": "ByteLevel"},
		"model":          map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{}},
	})
	require.NoError(t, err)
	tk, err := tokenizer.FromJSON(j, []byte(`{"bos_token": "<|bos|>", "eos_token": "<|eos|>"}`))
	require.NoError(t, err)
	return tk
}

// plainChat is a stand-in for a model's template: BOS, then each message
// as "role: content\n", then "assistant:" when asked.
func plainChat(_ context.Context, in serve.ChatInput) (string, error) {
	var msgs []map[string]any
	if err := json.Unmarshal(in.Messages, &msgs); err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("<|bos|>")
	for _, m := range msgs {
		if m["role"] == "bad" {
			return "", fmt.Errorf("the template refuses the role %q", m["role"])
		}
		fmt.Fprintf(&b, "%s: %v\n", m["role"], m["content"])
	}
	if in.AddGenerationPrompt {
		b.WriteString("assistant:")
	}
	return b.String(), nil
}

// TestText: a model's own tokenizer in the server: a text prompt gets its
// BOS once, a chat is rendered by the template and encoded without a
// second BOS, /tokenize and /detokenize round-trip, a model without a
// template refuses chat, and bad requests are 400s.
func TestText(t *testing.T) {
	m, err := model.NewRandom(model.Tiny(), 6)
	require.NoError(t, err)
	s, _, cancel, wg := start(t, m, 32, 16, serve.Options{Budget: 64})
	defer func() { cancel(); wg.Wait() }()
	tk := byteTokenizer(t)
	text := serve.Text{Tok: tk, Chat: plainChat}
	srv := httptest.NewServer(serve.NewServer(s, text, nil, serve.Info{ModelPath: "tiny", DPSize: 1}).Handler())
	defer srv.Close()

	prompt := "Hi there"
	ids := append([]int32{256}, []int32{'H', 'i', ' ', 't', 'h', 'e', 'r', 'e'}...)
	want := greedy(t, m, ids, 5)
	status, body := postTo(t, srv.URL, "/v1/completions", fmt.Sprintf(`{"prompt": %q, "max_tokens": 5, "temperature": 0, "ignore_eos": true}`, prompt))
	require.Equal(t, http.StatusOK, status, string(body))
	var r openAIResponse
	require.NoError(t, json.Unmarshal(body, &r))
	require.Equal(t, len(ids), r.Usage.PromptTokens, "the text and its BOS")
	wantText, err := tk.Decode(want, true)
	require.NoError(t, err)
	require.Equal(t, wantText, r.Choices[0].Text)

	// Chat: rendered "<|bos|>user: Hi\nassistant:", one BOS.
	rendered := "user: Hi\nassistant:"
	chatIDs := []int32{256}
	for i := 0; i < len(rendered); i++ {
		chatIDs = append(chatIDs, int32(rendered[i]))
	}
	want = greedy(t, m, chatIDs, 4)
	status, body = postTo(t, srv.URL, "/v1/chat/completions", `{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0, "ignore_eos": true}`)
	require.Equal(t, http.StatusOK, status, string(body))
	r = openAIResponse{}
	require.NoError(t, json.Unmarshal(body, &r))
	require.Equal(t, len(chatIDs), r.Usage.PromptTokens, "the template's BOS and no second one")
	wantText, err = tk.Decode(want, true)
	require.NoError(t, err)
	require.Equal(t, wantText, r.Choices[0].Message.Content)

	// /tokenize and /detokenize.
	status, body = postTo(t, srv.URL, "/tokenize", `{"prompt": "Hi"}`)
	require.Equal(t, http.StatusOK, status, string(body))
	require.JSONEq(t, `{"tokens": [256, 72, 105], "count": 3, "max_model_len": `+fmt.Sprint(s.Capacity())+`}`, string(body))
	status, body = postTo(t, srv.URL, "/tokenize", `{"content": "Hi"}`)
	require.Equal(t, http.StatusOK, status, string(body))
	require.Contains(t, string(body), `"tokens":[72,105]`, "llama-server's content adds no special tokens")
	status, body = postTo(t, srv.URL, "/tokenize", `{"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": false}`)
	require.Equal(t, http.StatusOK, status, string(body))
	require.Contains(t, string(body), `"count":10`, "<|bos|> and user: Hi\\n")
	status, body = postTo(t, srv.URL, "/detokenize", `{"tokens": [256, 72, 105, 258]}`)
	require.Equal(t, http.StatusOK, status, string(body))
	require.JSONEq(t, `{"prompt": "<|bos|>Hi<think>", "content": "<|bos|>Hi<think>"}`, string(body))

	for _, c := range []struct{ path, body, words string }{
		{"/tokenize", `{"prompt": "a", "messages": []}`, "not both"},
		{"/tokenize", `{}`, "required"},
		{"/tokenize", `{"prompt": "a", "junk": 1}`, `unknown field \"junk\"`},
		{"/detokenize", `{"tokens": [1, 300]}`, "tokens[1] = 300 is outside the vocabulary"},
		{"/detokenize", `{"tokens": [-1]}`, "outside the vocabulary"},
		{"/v1/chat/completions", `{"messages": [{"role": "bad", "content": "x"}]}`, "refuses the role"},
		{"/v1/chat/completions", `{"messages": [{"content": "x"}]}`, "messages[0] has no role"},
		{"/v1/chat/completions", `{"messages": [7]}`, "messages[0] is not an object"},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": "x"}], "tools": 5}`, "tools must be a list"},
		{"/tokenize", `{"prompt": "` + strings.Repeat("a", 8*s.Capacity()+1) + `"}`, "more than the"},
		{"/v1/completions", `{"prompt": "` + strings.Repeat("a", 8*s.Capacity()+1) + `"}`, "more than the"},
	} {
		status, body := postTo(t, srv.URL, c.path, c.body)
		require.Equal(t, http.StatusBadRequest, status, "%s %s: %s", c.path, c.body, body)
		require.Contains(t, string(body), c.words, "%s %s", c.path, c.body)
	}

	// A model without a template refuses chat, and the byte presets' server
	// has no /tokenize.
	bare := httptest.NewServer(serve.NewServer(s, serve.Text{Tok: tk}, nil, serve.Info{ModelPath: "tiny"}).Handler())
	defer bare.Close()
	status, body = postTo(t, bare.URL, "/v1/chat/completions", `{"messages": [{"role": "user", "content": "Hi"}]}`)
	require.Equal(t, http.StatusBadRequest, status)
	require.Contains(t, string(body), "no chat template")
	plain := httptest.NewServer(serve.NewServer(s, serve.Byte{}, nil, serve.Info{ModelPath: "tiny"}).Handler())
	defer plain.Close()
	status, body = postTo(t, plain.URL, "/tokenize", `{"prompt": "Hi"}`)
	require.Equal(t, http.StatusBadRequest, status)
	require.Contains(t, string(body), "no tokenizer")
}

// scriptEngine answers every request with the same tokens.
type scriptEngine struct{ tokens []int32 }

func (e scriptEngine) Submit(ctx context.Context, r serve.Request) (<-chan serve.Event, error) {
	ch := make(chan serve.Event, len(e.tokens)+1)
	for _, id := range e.tokens {
		ch <- serve.Event{Token: id}
	}
	ch <- serve.Event{Done: true, Reason: "length"}
	close(ch)
	return ch, nil
}
func (scriptEngine) Load() (int, int)            { return 0, 0 }
func (scriptEngine) RankLoads() []serve.RankLoad { return nil }
func (scriptEngine) Stats() serve.Stats          { return serve.Stats{} }
func (scriptEngine) FlushCache() error           { return nil }
func (scriptEngine) Capacity() int               { return 1 << 20 }
func (scriptEngine) Blocks() (int, int)          { return 0, 0 }
func (scriptEngine) Stopped() error              { return nil }
func (scriptEngine) Ranks() int                  { return 1 }

// TestReasoning: a chat answer's <think>…</think> comes back as
// reasoning_content, whole and streamed (deltas of each that add up, a
// character split over two tokens never shown half).
func TestReasoning(t *testing.T) {
	answer := []int32{258, 'w', 0xC3, 0xA9, 'i', 'g', 'h', 259, '\n', 'Y', 0xC3, 0xA9, 's'} // <think>wéigh</think>\nYés
	tk := byteTokenizer(t)
	srv := httptest.NewServer(serve.NewServer(scriptEngine{answer}, serve.Text{Tok: tk, Chat: plainChat, Reasoning: true}, nil, serve.Info{ModelPath: "m"}).Handler())
	defer srv.Close()
	req := `{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 20%s}`
	status, body := postTo(t, srv.URL, "/v1/chat/completions", fmt.Sprintf(req, ""))
	require.Equal(t, http.StatusOK, status, body)
	var whole struct {
		Choices []struct {
			Message struct {
				Content          string `json:"content"`
				ReasoningContent string `json:"reasoning_content"`
			} `json:"message"`
		} `json:"choices"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &whole))
	require.Equal(t, "wéigh", whole.Choices[0].Message.ReasoningContent)
	require.Equal(t, "\nYés", whole.Choices[0].Message.Content)

	var reasoning, content strings.Builder
	for _, f := range events(t, srv.URL, "/v1/chat/completions", fmt.Sprintf(req, `, "stream": true`)) {
		if f == "[DONE]" {
			continue
		}
		var c struct {
			Choices []struct {
				Delta struct {
					Content          string `json:"content"`
					ReasoningContent string `json:"reasoning_content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		require.NoError(t, json.Unmarshal([]byte(f), &c))
		for _, ch := range c.Choices {
			require.NotContains(t, ch.Delta.Content+ch.Delta.ReasoningContent, "\uFFFD")
			require.NotContains(t, ch.Delta.Content+ch.Delta.ReasoningContent, "<")
			reasoning.WriteString(ch.Delta.ReasoningContent)
			content.WriteString(ch.Delta.Content)
		}
	}
	require.Equal(t, "wéigh", reasoning.String())
	require.Equal(t, "\nYés", content.String())
}
