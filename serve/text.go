package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/moex-project/moex/internal/httpjson"
	"github.com/moex-project/moex/tokenizer"
)

// Text is a checkpoint's own tokenizer (tokenizer.json) and chat template
// as the server's Tokenizer: a text prompt gets the special tokens its
// tokenizer's configuration adds (Hugging Face's tokenizer(text)), a chat
// is rendered by the model's template and encoded without adding them
// again, and generated text leaves the special tokens out, as SGLang and
// vLLM return it.
type Text struct {
	Tok *tokenizer.Tokenizer
	// Chat renders a conversation (OpenAI's messages, as sent, with
	// tool-call arguments already decoded) into the prompt text with the
	// model's own template; nil when the model ships none, and chat
	// requests are then refused.
	Chat func(ctx context.Context, c ChatInput) (string, error)
	// Reasoning splits <think>…</think> out of a chat's answer into
	// reasoning_content (the templates of Qwen3 and DeepSeek-R1-style
	// models).
	Reasoning bool
}

// ChatInput is what a chat template renders: the request's JSON as sent
// (so that a mapping keeps its keys' order, as Python keeps a request's).
type ChatInput struct {
	Messages            json.RawMessage // the messages array; each an object with a role
	Tools               json.RawMessage // the tools array; nil when none
	AddGenerationPrompt bool
	Kwargs              map[string]any // chat_template_kwargs, such as enable_thinking
}

// Encode is text's ids with the special tokens the tokenizer adds.
func (t Text) Encode(text string) ([]int32, error) { return t.Tok.Encode(text, true) }

// Decode is the text of ids without the special tokens; ids that are not
// the tokenizer's (rows an embedding is padded with) are left out, as
// Hugging Face's decode does.
func (t Text) Decode(ids []int32) string {
	s, err := t.Tok.Decode(t.known(ids), true)
	if err != nil {
		return ""
	}
	return s
}

// known is ids without those the tokenizer does not have.
func (t Text) known(ids []int32) []int32 {
	for i, id := range ids {
		if _, ok := t.Tok.Token(id); !ok {
			keep := append(make([]int32, 0, len(ids)), ids[:i]...)
			for _, id := range ids[i+1:] {
				if _, ok := t.Tok.Token(id); ok {
					keep = append(keep, id)
				}
			}
			return keep
		}
	}
	return ids
}

// NewTextStream decodes a generation as its ids arrive (special tokens
// left out, unknown ids skipped).
func (t Text) NewTextStream() TextStream { return textStream{t: t, s: t.Tok.NewDecodeStream(true)} }

// TextStream is a generation's text as its ids arrive: Add returns the
// text an id settles (never half a character), Flush what is held back
// at the end.
type TextStream interface {
	Add(id int32) (string, error)
	Flush() (string, error)
}

type textStream struct {
	t Text
	s *tokenizer.DecodeStream
}

func (s textStream) Add(id int32) (string, error) {
	if _, ok := s.t.Tok.Token(id); !ok {
		return "", nil
	}
	return s.s.Step(id)
}

func (s textStream) Flush() (string, error) { return s.s.Flush() }

// encode is a prompt's ids (with the special tokens its tokenizer adds,
// or none). With the model's own tokenizer, a text too long to fit the
// server's tokens whatever its tokens (each at most the vocabulary's
// longest) is refused before the work of encoding it.
func (h *Server) encode(text string, addSpecial bool) ([]int32, error) {
	t, ok := h.tok.(Text)
	if !ok {
		return h.tok.Encode(text)
	}
	if limit := h.s.Capacity() * t.Tok.MaxTokenBytes(); len(text) > limit {
		return nil, fmt.Errorf("the prompt's %d bytes are more than the %d tokens a request may hold can spell (at most %d bytes each)",
			len(text), h.s.Capacity(), t.Tok.MaxTokenBytes())
	}
	return t.Tok.Encode(text, addSpecial)
}

// renderChat turns a chat request's messages into the prompt's ids with
// the model's template.
func (h *Server) renderChat(ctx context.Context, t Text, o *openAIRequest) ([]int32, error) {
	if t.Chat == nil {
		return nil, errors.New("this model ships no chat template (chat_template.jinja, tokenizer_config.json's chat_template or the GGUF's tokenizer.chat_template): send a prompt to /v1/completions")
	}
	in, err := NewChatInput(o.Messages, o.Tools, o.AddGenerationPrompt == nil || *o.AddGenerationPrompt, o.ChatTemplateKwargs)
	if err != nil {
		return nil, err
	}
	prompt, err := t.Chat(ctx, in)
	if err != nil {
		return nil, err
	}
	return h.encode(prompt, false) // the template wrote the special tokens
}

// NewChatInput checks a chat's messages (each an object with a role) and
// tools (a list, or null) as a request sent them, naming the first that is
// not, and makes the template's input of them.
func NewChatInput(messages []json.RawMessage, tools json.RawMessage, addGenerationPrompt bool, kwargs map[string]any) (ChatInput, error) {
	for i, raw := range messages {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil || m == nil {
			return ChatInput{}, fmt.Errorf("messages[%d] is not an object", i)
		}
		var role string
		if err := json.Unmarshal(m["role"], &role); err != nil || role == "" {
			return ChatInput{}, fmt.Errorf("messages[%d] has no role", i)
		}
	}
	in := ChatInput{AddGenerationPrompt: addGenerationPrompt, Kwargs: kwargs}
	var err error
	if in.Messages, err = json.Marshal(messages); err != nil {
		return ChatInput{}, err
	}
	if len(tools) > 0 && string(tools) != "null" {
		var list []json.RawMessage
		if err := json.Unmarshal(tools, &list); err != nil {
			return ChatInput{}, errors.New("tools must be a list")
		}
		in.Tools = tools
	}
	return in, nil
}

// The markers of a reasoning model's thinking.
const (
	thinkStart = "<think>"
	thinkEnd   = "</think>"
)

// splitReasoning splits a chat answer into its reasoning (inside
// <think>…</think>) and its content. thinking says the prompt already
// opened the thinking (a template that ends the generation prompt with
// <think>). While the answer is unfinished (final false) a tail that may
// still become </think> is held back, so that streamed parts only grow.
func splitReasoning(text string, thinking, final bool) (reasoning, content string) {
	body := strings.TrimLeft(text, " \t\r\n")
	if !final && strings.HasPrefix(thinkStart, body) {
		return "", "" // perhaps the start of "<think>"
	}
	if strings.HasPrefix(body, thinkStart) {
		thinking, text = true, body[len(thinkStart):]
	}
	if !thinking {
		return "", text
	}
	if i := strings.Index(text, thinkEnd); i >= 0 {
		return text[:i], text[i+len(thinkEnd):]
	}
	if !final {
		for k := min(len(thinkEnd)-1, len(text)); k > 0; k-- {
			if strings.HasSuffix(text, thinkEnd[:k]) {
				return text[:len(text)-k], ""
			}
		}
	}
	return text, ""
}

// tokenizeRequest is /tokenize's body, as vLLM (prompt or messages) and
// llama-server (content) send it.
type tokenizeRequest struct {
	Model               string            `json:"model"`
	Prompt              *string           `json:"prompt"`
	Content             *string           `json:"content"`
	Messages            []json.RawMessage `json:"messages"`
	AddSpecialTokens    *bool             `json:"add_special_tokens"`
	AddSpecial          *bool             `json:"add_special"`
	AddGenerationPrompt *bool             `json:"add_generation_prompt"`
	ChatTemplateKwargs  map[string]any    `json:"chat_template_kwargs"`
	Tools               json.RawMessage   `json:"tools"`
}

// tokenize answers /tokenize: {"tokens", "count", "max_model_len"} (vLLM's
// answer; llama-server reads "tokens" of it).
func (h *Server) tokenize(w http.ResponseWriter, r *http.Request) {
	t, ok := h.tok.(Text)
	if !ok {
		h.bad(w, errors.New("this server reads no tokenizer of its own to tokenize with"))
		return
	}
	var q tokenizeRequest
	if err := decodeStrict(r, &q, "/tokenize"); err != nil {
		h.bad(w, err)
		return
	}
	var ids []int32
	var err error
	switch {
	case q.Messages != nil && (q.Prompt != nil || q.Content != nil):
		err = errors.New("give prompt or messages, not both")
	case q.Messages != nil:
		o := openAIRequest{Messages: q.Messages, AddGenerationPrompt: q.AddGenerationPrompt, ChatTemplateKwargs: q.ChatTemplateKwargs, Tools: q.Tools}
		ids, err = h.renderChat(r.Context(), t, &o)
	default:
		text := q.Prompt
		if text == nil {
			text = q.Content
		}
		add := q.Prompt != nil // vLLM adds the special tokens by default, llama-server not
		for _, flag := range []*bool{q.AddSpecialTokens, q.AddSpecial} {
			if flag != nil {
				add = *flag
			}
		}
		if text == nil {
			err = errors.New("prompt (or content, or messages) is required")
		} else {
			ids, err = h.encode(*text, add)
		}
	}
	if err != nil {
		h.bad(w, err)
		return
	}
	httpjson.Write(w, http.StatusOK, map[string]any{"tokens": nonNilIDs(ids), "count": len(ids), "max_model_len": h.info.MaxTokens})
}

// detokenize answers /detokenize {"tokens": [...]}: {"prompt"} (vLLM's)
// and {"content"} (llama-server's), the text with its special tokens.
func (h *Server) detokenize(w http.ResponseWriter, r *http.Request) {
	t, ok := h.tok.(Text)
	if !ok {
		h.bad(w, errors.New("this server reads no tokenizer of its own to detokenize with"))
		return
	}
	var q struct {
		Model  string  `json:"model"`
		Tokens []int64 `json:"tokens"`
	}
	if err := decodeStrict(r, &q, "/detokenize"); err != nil {
		h.bad(w, err)
		return
	}
	ids := make([]int32, len(q.Tokens))
	for i, id := range q.Tokens {
		if id < 0 || id >= int64(t.Tok.VocabSize()) {
			h.bad(w, fmt.Errorf("tokens[%d] = %d is outside the vocabulary of %d tokens", i, id, t.Tok.VocabSize()))
			return
		}
		ids[i] = int32(id)
	}
	text, err := t.Tok.Decode(ids, false)
	if err != nil {
		h.bad(w, err)
		return
	}
	httpjson.Write(w, http.StatusOK, map[string]any{"prompt": text, "content": text})
}

func nonNilIDs(ids []int32) []int32 {
	if ids == nil {
		return []int32{}
	}
	return ids
}

// promptOpensThinking reports whether a chat prompt ends inside an opened
// <think> (a template that starts the answer's reasoning itself, as
// DeepSeek-R1's does), so the answer begins as reasoning.
func promptOpensThinking(tok Tokenizer, ids []int32) bool {
	t, ok := tok.(Text)
	if !ok || len(ids) == 0 {
		return false
	}
	tail := ids[max(0, len(ids)-8):]
	s, err := t.Tok.Decode(tail, false)
	if err != nil {
		return false
	}
	s = strings.TrimRight(s, " \t\r\n")
	return strings.HasSuffix(s, thinkStart)
}
