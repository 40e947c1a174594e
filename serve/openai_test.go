package serve_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/model"
	"github.com/moex-project/moex/serve"
)

// postTo posts body to url+path and returns the status and body.
func postTo(t *testing.T, url, path, body string) (int, []byte) {
	resp, err := http.Post(url+path, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, b
}

// events posts body and reads a stream's data frames, [DONE] included.
func events(t *testing.T, url, path, body string) []string {
	resp, err := http.Post(url+path, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	var frames []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			frames = append(frames, line)
		}
	}
	return frames
}

type openAIChoice struct {
	Text    string `json:"text"`
	Message *struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	} `json:"message"`
	Delta *struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	} `json:"delta"`
	FinishReason *string `json:"finish_reason"`
}

type openAIResponse struct {
	ID      string         `json:"id"`
	Object  string         `json:"object"`
	Model   string         `json:"model"`
	Choices []openAIChoice `json:"choices"`
	Usage   *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	} `json:"usage"`
}

// TestOpenAI: /v1/completions and /v1/chat/completions, whole and
// streamed, give the greedy chain of the prompt (the chat's rendered by the
// plain template); stop strings cut the text before them in every API and
// never leak into a stream; /health_generate generates; bad requests are
// 400s naming the field.
func TestOpenAI(t *testing.T) {
	m, err := model.NewRandom(model.Tiny(), 6)
	require.NoError(t, err)
	s, _, cancel, wg := start(t, m, 32, 16, serve.Options{Budget: 64})
	defer func() { cancel(); wg.Wait() }()
	api := serve.NewServer(s, serve.Byte{}, []int32{serve.EOS}, serve.Info{ModelPath: "tiny", DPSize: 1})
	srv := httptest.NewServer(api.Handler())
	defer srv.Close()
	tok := serve.Byte{}

	prompt := "Once upon a time"
	ids, _ := tok.Encode(prompt)
	want := greedy(t, m, ids, 8)
	status, body := postTo(t, srv.URL, "/v1/completions",
		fmt.Sprintf(`{"model": "tiny", "prompt": %q, "max_tokens": 8, "temperature": 0, "ignore_eos": true}`, prompt))
	require.Equal(t, http.StatusOK, status, string(body))
	var r openAIResponse
	require.NoError(t, json.Unmarshal(body, &r))
	require.Equal(t, "text_completion", r.Object)
	require.True(t, strings.HasPrefix(r.ID, "cmpl-"))
	require.Equal(t, "tiny", r.Model)
	require.Len(t, r.Choices, 1)
	require.Equal(t, tok.Decode(want), r.Choices[0].Text)
	require.Equal(t, "length", *r.Choices[0].FinishReason)
	require.Equal(t, len(ids), r.Usage.PromptTokens)
	require.Equal(t, 8, r.Usage.CompletionTokens)
	require.Equal(t, len(ids)+8, r.Usage.TotalTokens)
	// Token ids as the prompt: the same.
	idsJSON, _ := json.Marshal(ids)
	status, body = postTo(t, srv.URL, "/v1/completions", fmt.Sprintf(`{"prompt": [%s], "max_tokens": 8, "temperature": 0, "ignore_eos": true}`, idsJSON))
	require.Equal(t, http.StatusOK, status, string(body))
	require.NoError(t, json.Unmarshal(body, &r))
	require.Equal(t, tok.Decode(want), r.Choices[0].Text)

	// Streamed: deltas adding up to the text, the reason in the last chunk,
	// then the usage, then [DONE].
	frames := events(t, srv.URL, "/v1/completions", fmt.Sprintf(`{"prompt": %q, "max_tokens": 8, "temperature": 0, "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}}`, prompt))
	require.Equal(t, "[DONE]", frames[len(frames)-1])
	var text strings.Builder
	var reasons []string
	for _, f := range frames[:len(frames)-2] {
		var c openAIResponse
		require.NoError(t, json.Unmarshal([]byte(f), &c), f)
		require.Len(t, c.Choices, 1)
		text.WriteString(c.Choices[0].Text)
		if c.Choices[0].FinishReason != nil {
			reasons = append(reasons, *c.Choices[0].FinishReason)
		}
	}
	require.Equal(t, tok.Decode(want), text.String())
	require.Equal(t, []string{"length"}, reasons)
	var u openAIResponse
	require.NoError(t, json.Unmarshal([]byte(frames[len(frames)-2]), &u))
	require.Empty(t, u.Choices)
	require.Equal(t, 8, u.Usage.CompletionTokens)

	// Chat: the plain template, then the greedy chain.
	chatIDs, _ := tok.Encode(serve.ChatTemplate([]string{"system", "user"}, []string{"Be brief.", "Hi"}))
	require.Equal(t, "system: Be brief.\nuser: Hi\nassistant: ", tok.Decode(chatIDs))
	chatWant := tok.Decode(greedy(t, m, chatIDs, 6))
	chatBody := `{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}], "max_tokens": 6, "temperature": 0, "ignore_eos": true%s}`
	status, body = postTo(t, srv.URL, "/v1/chat/completions", fmt.Sprintf(chatBody, ""))
	require.Equal(t, http.StatusOK, status, string(body))
	require.NoError(t, json.Unmarshal(body, &r))
	require.Equal(t, "chat.completion", r.Object)
	require.True(t, strings.HasPrefix(r.ID, "chatcmpl-"))
	require.Equal(t, "assistant", r.Choices[0].Message.Role)
	require.Equal(t, chatWant, r.Choices[0].Message.Content)
	require.Equal(t, len(chatIDs), r.Usage.PromptTokens)
	frames = events(t, srv.URL, "/v1/chat/completions", fmt.Sprintf(chatBody, `, "stream": true`))
	text.Reset()
	for i, f := range frames[:len(frames)-1] {
		var c openAIResponse
		require.NoError(t, json.Unmarshal([]byte(f), &c), f)
		require.Equal(t, "chat.completion.chunk", c.Object)
		if i == 0 {
			require.Equal(t, "assistant", c.Choices[0].Delta.Role)
		}
		text.WriteString(c.Choices[0].Delta.Content)
	}
	require.Equal(t, chatWant, text.String())

	// Stop strings: a character of some prompt's greedy output, found
	// where it first occurs (the output and text from the chain alone).
	var stopPrompt, stop, cut string
	for i := 0; i < 64 && stop == ""; i++ {
		p := fmt.Sprintf("prompt %d", i)
		pids, _ := tok.Encode(p)
		full := tok.Decode(greedy(t, m, pids, 12))
		for j, r := range full {
			if j > 0 && r >= 'a' && r <= 'z' {
				stopPrompt, stop, cut = p, string(r), full[:strings.Index(full, string(r))]
				break
			}
		}
	}
	require.NotEmpty(t, stop, "no greedy output of 64 prompts holds a lowercase letter after its first character")
	status, body = postTo(t, srv.URL, "/v1/completions", fmt.Sprintf(`{"prompt": %q, "max_tokens": 12, "temperature": 0, "ignore_eos": true, "stop": [%q, "never there"]}`, stopPrompt, stop))
	require.Equal(t, http.StatusOK, status, string(body))
	require.NoError(t, json.Unmarshal(body, &r))
	require.Equal(t, cut, r.Choices[0].Text)
	require.Equal(t, "stop", *r.Choices[0].FinishReason)
	frames = events(t, srv.URL, "/v1/completions", fmt.Sprintf(`{"prompt": %q, "max_tokens": 12, "temperature": 0, "ignore_eos": true, "stop": %q, "stream": true}`, stopPrompt, stop))
	text.Reset()
	for _, f := range frames[:len(frames)-1] {
		var c openAIResponse
		require.NoError(t, json.Unmarshal([]byte(f), &c), f)
		text.WriteString(c.Choices[0].Text)
	}
	require.Equal(t, cut, text.String())
	status, body = postTo(t, srv.URL, "/generate", fmt.Sprintf(`{"text": %q, "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": true, "stop": %q}}`, stopPrompt, stop))
	require.Equal(t, http.StatusOK, status, string(body))
	var g struct {
		Text string `json:"text"`
		Meta struct {
			FinishReason struct {
				Type    string `json:"type"`
				Matched string `json:"matched"`
			} `json:"finish_reason"`
		} `json:"meta_info"`
	}
	require.NoError(t, json.Unmarshal(body, &g))
	require.Equal(t, cut, g.Text)
	require.Equal(t, "stop", g.Meta.FinishReason.Type)
	require.Equal(t, stop, g.Meta.FinishReason.Matched)

	resp, err := http.Get(srv.URL + "/health_generate")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	for _, tt := range []struct{ path, body, want string }{
		{"/v1/completions", `{"prompt": "a", "n": 2}`, "n 2: one choice per request"},
		{"/v1/completions", `{"prompt": ["a", "b"]}`, "prompt lists 2 prompts"},
		{"/v1/completions", `{"prompt": {"a": 1}}`, "prompt must be a string, a list of token ids"},
		{"/v1/completions", `{}`, "prompt is required"},
		{"/v1/completions", `{"prompt": "a", "max_tokens": 0}`, "max_tokens 0 must be positive"},
		{"/v1/completions", `{"prompt": "a", "max_tokens": 100000}`, "the cache holds 512"},
		{"/v1/completions", `{"prompt": "a", "logprobs": 5}`, "logprobs are not supported"},
		{"/v1/completions", `{"prompt": "a", "stop": 5}`, "stop must be a string or a list of strings"},
		{"/v1/completions", `{"prompt": "a", "stop": [""]}`, "stop[0] is empty"},
		{"/v1/completions", `{"prompt": "a", "temperature": -2}`, "temperature -2"},
		{"/v1/completions", `{"prompt": "a", "frequency_penalty": 1}`, "frequency_penalty is not supported"},
		{"/v1/completions", `{"messages": [{"role": "user", "content": "a"}]}`, "chat requests go to /v1/chat/completions"},
		{"/v1/completions", `{"prompt": "a", "best": 1}`, `unknown field \"best\"`},
		{"/v1/completions", `{"prompt": [1, 999]}`, "prompt token 1 is id 999, outside the vocabulary"},
		{"/v1/chat/completions", `{"messages": []}`, "messages is required"},
		{"/v1/chat/completions", `{"messages": [{"role": "bot", "content": "a"}]}`, `messages[0].role \"bot\" is not system`},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": 5}]}`, "messages[0].content must be a string or a list of text parts"},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}`, `messages[0].content[0] is of type \"image_url\"`},
		{"/v1/chat/completions", `{"prompt": "a"}`, "a chat request gives messages, not prompt"},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": "a"}], "max_tokens": 3, "max_completion_tokens": 4}`, "max_tokens and max_completion_tokens differ"},
		{"/generate", `{"text": "a", "sampling_params": {"stop": [1]}}`, "sampling_params.stop must be a string or a list of strings"},
	} {
		status, body := postTo(t, srv.URL, tt.path, tt.body)
		require.Equal(t, http.StatusBadRequest, status, tt.body)
		require.Contains(t, string(body), tt.want, tt.body)
	}

	api.Drain()
	resp, err = http.Get(srv.URL + "/health_generate")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
}

// TestStreamInterval: with a stream interval of 4, a stream of 10 tokens
// sends frames at tokens 4 and 8 and the last, the text whole at the end
// (and the OpenAI deltas adding up to it).
func TestStreamInterval(t *testing.T) {
	m, err := model.NewRandom(model.Tiny(), 6)
	require.NoError(t, err)
	s, _, cancel, wg := start(t, m, 32, 16, serve.Options{Budget: 64})
	defer func() { cancel(); wg.Wait() }()
	srv := httptest.NewServer(serve.NewServer(s, serve.Byte{}, nil, serve.Info{ModelPath: "tiny", StreamInterval: 4}).Handler())
	defer srv.Close()
	ids, _ := serve.Byte{}.Encode("interval")
	want := serve.Byte{}.Decode(greedy(t, m, ids, 10))
	frames := events(t, srv.URL, "/generate", `{"text": "interval", "sampling_params": {"max_new_tokens": 10, "temperature": 0}, "stream": true}`)
	require.Len(t, frames, 2+1+1) // tokens 4 and 8, the final frame, [DONE]
	var last struct {
		Text      string  `json:"text"`
		OutputIDs []int32 `json:"output_ids"`
	}
	require.NoError(t, json.Unmarshal([]byte(frames[0]), &last))
	require.Len(t, last.OutputIDs, 4)
	require.NoError(t, json.Unmarshal([]byte(frames[2]), &last))
	require.Equal(t, want, last.Text)
	frames = events(t, srv.URL, "/v1/completions", `{"prompt": "interval", "max_tokens": 10, "temperature": 0, "stream": true}`)
	var text strings.Builder
	for _, f := range frames[:len(frames)-1] {
		var c openAIResponse
		require.NoError(t, json.Unmarshal([]byte(f), &c), f)
		text.WriteString(c.Choices[0].Text)
	}
	require.Equal(t, want, text.String())
	require.Len(t, frames, 2+1+1)
}
