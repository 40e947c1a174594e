package serve

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/moex-project/moex/internal/httpjson"
)

// openAIRequest is the body of OpenAI's /v1/completions (Prompt) and
// /v1/chat/completions (Messages): the fields moex reads, and those
// clients commonly send that it accepts only at their neutral values.
type openAIRequest struct {
	Model               string            `json:"model"`
	Prompt              json.RawMessage   `json:"prompt"`
	Messages            []json.RawMessage `json:"messages"`
	Tools               json.RawMessage   `json:"tools"`
	ChatTemplateKwargs  map[string]any    `json:"chat_template_kwargs"`
	AddGenerationPrompt *bool             `json:"add_generation_prompt"`
	MaxTokens           *int              `json:"max_tokens"`
	MaxCompletionTokens *int              `json:"max_completion_tokens"`
	Temperature         *float64          `json:"temperature"`
	TopP                *float64          `json:"top_p"`
	TopK                *int              `json:"top_k"`
	N                   *int              `json:"n"`
	Stream              bool              `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Stop             json.RawMessage `json:"stop"`
	StopTokenIDs     []int32         `json:"stop_token_ids"`
	Seed             *uint64         `json:"seed"`
	IgnoreEOS        bool            `json:"ignore_eos"`
	User             string          `json:"user"`
	FrequencyPenalty *float64        `json:"frequency_penalty"`
	PresencePenalty  *float64        `json:"presence_penalty"`
	Logprobs         json.RawMessage `json:"logprobs"`
	Echo             bool            `json:"echo"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	Name    string          `json:"name"`
}

// text is a message's content: a string, or a list of text parts.
func (m chatMessage) text(i int) (string, error) {
	var s string
	if err := json.Unmarshal(m.Content, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(m.Content, &parts); err != nil {
		return "", fmt.Errorf("messages[%d].content must be a string or a list of text parts", i)
	}
	var b strings.Builder
	for j, p := range parts {
		if p.Type != "text" {
			return "", fmt.Errorf("messages[%d].content[%d] is of type %q: only text parts are read", i, j, p.Type)
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

// ChatTemplate renders messages as the prompt: each as "role: content" on
// its own line, then "assistant: " to be continued (the plain template of
// the random presets, which have no chat template of their own).
func ChatTemplate(roles, contents []string) string {
	var b strings.Builder
	for i := range roles {
		fmt.Fprintf(&b, "%s: %s\n", roles[i], contents[i])
	}
	b.WriteString("assistant: ")
	return b.String()
}

// DefaultMaxTokens is /v1/completions' max_tokens when not given (OpenAI's).
const DefaultMaxTokens = 16

// openAI parses an OpenAI request; chat says which endpoint.
func (h *Server) openAI(r *http.Request, chat bool) (openAIRequest, Request, []string, error) {
	var o openAIRequest
	what := "/v1/completions"
	if chat {
		what = "/v1/chat/completions"
	}
	if err := decodeStrict(r, &o, what); err != nil {
		return o, Request{}, nil, err
	}
	switch {
	case o.N != nil && *o.N != 1:
		return o, Request{}, nil, fmt.Errorf("n %d: one choice per request is served", *o.N)
	case o.FrequencyPenalty != nil && *o.FrequencyPenalty != 0:
		return o, Request{}, nil, errors.New("frequency_penalty is not supported (give 0 or leave it out)")
	case o.PresencePenalty != nil && *o.PresencePenalty != 0:
		return o, Request{}, nil, errors.New("presence_penalty is not supported (give 0 or leave it out)")
	case len(o.Logprobs) > 0 && string(o.Logprobs) != "null" && string(o.Logprobs) != "false" && string(o.Logprobs) != "0":
		return o, Request{}, nil, errors.New("logprobs are not supported")
	case o.Echo:
		return o, Request{}, nil, errors.New("echo is not supported")
	case chat && o.Prompt != nil:
		return o, Request{}, nil, errors.New("a chat request gives messages, not prompt")
	case !chat && o.Messages != nil:
		return o, Request{}, nil, errors.New("a completion request gives prompt, not messages (chat requests go to /v1/chat/completions)")
	}
	var ids []int32
	var err error
	text, own := h.tok.(Text)
	if chat && own {
		if len(o.Messages) == 0 {
			return o, Request{}, nil, errors.New("messages is required")
		}
		if ids, err = h.renderChat(r.Context(), text, &o); err != nil {
			return o, Request{}, nil, err
		}
	} else if chat {
		if len(o.Messages) == 0 {
			return o, Request{}, nil, errors.New("messages is required")
		}
		if len(o.Tools) > 0 || o.ChatTemplateKwargs != nil || o.AddGenerationPrompt != nil {
			return o, Request{}, nil, errors.New("tools, chat_template_kwargs and add_generation_prompt need the model's own chat template, which this server does not have")
		}
		roles, contents := make([]string, len(o.Messages)), make([]string, len(o.Messages))
		for i, raw := range o.Messages {
			var m chatMessage
			dec := json.NewDecoder(bytes.NewReader(raw))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&m); err != nil {
				return o, Request{}, nil, fmt.Errorf("messages[%d]: %v", i, err)
			}
			switch m.Role {
			case "system", "user", "assistant", "developer", "tool":
			default:
				return o, Request{}, nil, fmt.Errorf("messages[%d].role %q is not system, user, assistant, developer or tool", i, m.Role)
			}
			if contents[i], err = m.text(i); err != nil {
				return o, Request{}, nil, err
			}
			roles[i] = m.Role
		}
		if ids, err = h.tok.Encode(ChatTemplate(roles, contents)); err != nil {
			return o, Request{}, nil, err
		}
	} else if ids, err = h.promptIDs(o.Prompt); err != nil {
		return o, Request{}, nil, err
	}
	maxNew := o.MaxTokens
	if o.MaxCompletionTokens != nil {
		if maxNew != nil && *maxNew != *o.MaxCompletionTokens {
			return o, Request{}, nil, errors.New("max_tokens and max_completion_tokens differ: give one")
		}
		maxNew = o.MaxCompletionTokens
	}
	if maxNew == nil && !chat {
		n := DefaultMaxTokens
		maxNew = &n
	}
	if maxNew != nil && *maxNew < 1 {
		return o, Request{}, nil, fmt.Errorf("max_tokens %d must be positive", *maxNew)
	}
	stops, err := stopStrings(o.Stop, "stop")
	if err != nil {
		return o, Request{}, nil, err
	}
	return o, h.sampling(ids, maxNew, o.Temperature, o.TopP, o.TopK, o.Seed, o.IgnoreEOS, o.StopTokenIDs), stops, nil
}

// promptIDs reads a completion's prompt: text, token ids, or a list of one
// of either.
func (h *Server) promptIDs(raw json.RawMessage) ([]int32, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, errors.New("prompt is required")
	}
	var text string
	if json.Unmarshal(raw, &text) == nil {
		return h.encode(text, true)
	}
	var ids []int32
	if json.Unmarshal(raw, &ids) == nil {
		return ids, nil
	}
	var texts []string
	if json.Unmarshal(raw, &texts) == nil {
		if len(texts) != 1 {
			return nil, fmt.Errorf("prompt lists %d prompts: one per request is served", len(texts))
		}
		return h.encode(texts[0], true)
	}
	var lists [][]int32
	if json.Unmarshal(raw, &lists) == nil {
		if len(lists) != 1 {
			return nil, fmt.Errorf("prompt lists %d prompts: one per request is served", len(lists))
		}
		return lists[0], nil
	}
	return nil, errors.New("prompt must be a string, a list of token ids, or a list of one of either")
}

// finishReason is OpenAI's name of how a completion ended.
func finishReason(c completion) string {
	if c.reason == "stop" {
		return "stop"
	}
	return "length"
}

func (h *Server) completions(w http.ResponseWriter, r *http.Request)     { h.serveOpenAI(w, r, false) }
func (h *Server) chatCompletions(w http.ResponseWriter, r *http.Request) { h.serveOpenAI(w, r, true) }

// serveOpenAI answers /v1/completions (chat false) or /v1/chat/completions.
func (h *Server) serveOpenAI(w http.ResponseWriter, r *http.Request, chat bool) {
	o, req, stops, err := h.openAI(r, chat)
	if err != nil {
		h.bad(w, err)
		return
	}
	id, object := fmt.Sprintf("cmpl-%d", h.nextID.Add(1)), "text_completion"
	if chat {
		id, object = "chatcmpl"+id[4:], "chat.completion"
	}
	run, err := h.start(r.Context(), req, stops)
	if err != nil {
		h.refuse(w, err)
		return
	}
	created := time.Now().Unix()
	usage := func(n int) map[string]any {
		return map[string]any{"prompt_tokens": len(req.IDs), "completion_tokens": n, "total_tokens": len(req.IDs) + n}
	}
	// choice is the one choice: the text (the whole, or a stream's delta)
	// and the finish reason (nil while streaming).
	first := true
	ownText, _ := h.tok.(Text)
	reasoning := chat && ownText.Reasoning
	thinking := reasoning && promptOpensThinking(h.tok, req.IDs)
	// parts splits a chat's text so far into its reasoning and its content.
	parts := func(text string, final bool) (string, string) {
		if !reasoning {
			return "", text
		}
		return splitReasoning(text, thinking, final)
	}
	choice := func(reasoningText, text string, reason any) map[string]any {
		if chat {
			key, msg := "message", map[string]any{"content": text}
			if o.Stream {
				key = "delta"
			}
			if reasoningText != "" {
				msg["reasoning_content"] = reasoningText
			}
			if first || !o.Stream {
				msg["role"] = "assistant"
			}
			first = false
			return map[string]any{"index": 0, key: msg, "finish_reason": reason}
		}
		return map[string]any{"index": 0, "text": text, "logprobs": nil, "finish_reason": reason}
	}
	if !o.Stream {
		c := run.wait(nil)
		if c.err != nil {
			httpjson.Error(w, http.StatusServiceUnavailable, c.err.Error())
			return
		}
		rs, ts := parts(c.text, true)
		httpjson.Write(w, http.StatusOK, map[string]any{"id": id, "object": object, "created": created, "model": h.info.ModelPath,
			"choices": []any{choice(rs, ts, finishReason(c))}, "usage": usage(len(c.ids))})
		return
	}
	if chat {
		object = "chat.completion.chunk"
	}
	sse := startSSE(w)
	run.flush = sse.flush
	chunk := func(choices []any, u any) {
		m := map[string]any{"id": id, "object": object, "created": created, "model": h.info.ModelPath, "choices": choices}
		if u != nil {
			m["usage"] = u
		}
		sse.frame(m)
	}
	sentR, sentC := "", "" // the reasoning and content sent so far
	c := run.wait(func(ids []int32, text string) {
		rs, ts := parts(text, false)
		if len(rs)+len(ts) > len(sentR)+len(sentC) && strings.HasPrefix(rs, sentR) && strings.HasPrefix(ts, sentC) {
			chunk([]any{choice(rs[len(sentR):], ts[len(sentC):], nil)}, nil)
			sentR, sentC = rs, ts
		}
	})
	if c.err != nil {
		sse.frame(map[string]any{"error": map[string]any{"message": c.err.Error()}})
		sse.done()
		return
	}
	rs, ts := parts(c.text, true)
	chunk([]any{choice(rest(rs, sentR), rest(ts, sentC), finishReason(c))}, nil)
	if o.StreamOptions != nil && o.StreamOptions.IncludeUsage {
		chunk([]any{}, usage(len(c.ids)))
	}
	sse.done()
}

// rest is what text adds to the part already sent: what follows sent, or
// (should the text no longer begin with it) what follows their common
// prefix, never the whole again.
func rest(text, sent string) string {
	n := 0
	for n < len(text) && n < len(sent) && text[n] == sent[n] {
		n++
	}
	return text[n:]
}
