package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/moex-project/moex/chat"
	"github.com/moex-project/moex/format/gguf"
	"github.com/moex-project/moex/serve"
	"github.com/moex-project/moex/tokenizer"
)

// modelText is a model's tokenizer and chat template.
type modelText struct {
	dir       string // the model folder ("" for a GGUF file)
	tok       *tokenizer.Tokenizer
	tpl       *chat.Template // nil: the model ships none
	reasoning bool           // the vocabulary has </think>: answers may carry reasoning
}

// loadText reads the tokenizer (and chat template) of a model folder or a
// GGUF file; a missing template is an error only when needChat.
func loadText(model string, needChat bool) (*modelText, error) {
	st, err := os.Stat(model)
	if err != nil {
		return nil, fmt.Errorf("--model %s: %w", model, err)
	}
	m := &modelText{}
	if st.IsDir() {
		m.dir = model
		if m.tok, err = tokenizer.Load(model); err != nil {
			return nil, err
		}
		m.tpl, err = chat.Load(model, "")
	} else {
		var src string
		if m.tok, src, err = ggufText(model); err != nil {
			return nil, err
		}
		err = chat.ErrNoTemplate
		if src != "" {
			specials := map[string]any{}
			for k, v := range m.tok.SpecialTokens() {
				specials[k] = v
			}
			if m.tpl, err = chat.Parse(src, specials); err != nil {
				err = fmt.Errorf("%s: tokenizer.chat_template: %w", model, err)
			}
		}
	}
	switch {
	case errors.Is(err, chat.ErrNoTemplate) && !needChat:
		m.tpl = nil
	case errors.Is(err, chat.ErrNoTemplate):
		return nil, fmt.Errorf("%s: %w (for --chat)", model, err)
	case err != nil:
		return nil, err
	}
	_, m.reasoning = m.tok.ID("</think>")
	return m, nil
}

// errNoVocab: a GGUF file without a vocabulary (a model's weights only).
var errNoVocab = errors.New("no vocabulary")

// ggufText reads the tokenizer and the chat template of a GGUF file.
func ggufText(path string) (*tokenizer.Tokenizer, string, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	meta := make(map[string]any, len(f.Metadata))
	for k, v := range f.Metadata {
		if strings.HasPrefix(k, "tokenizer.") {
			meta[k] = ggufGo(v)
		}
	}
	if meta["tokenizer.ggml.tokens"] == nil {
		return nil, "", fmt.Errorf("%s: the GGUF file has no vocabulary (tokenizer.ggml.tokens); for a split file give its first part: %w", path, errNoVocab)
	}
	v, err := tokenizer.ReadGGUFVocab(meta)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", path, err)
	}
	t, err := tokenizer.FromGGUF(v)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", path, err)
	}
	return t, v.ChatTemplate, nil
}

// ggufGo is a GGUF metadata value as a plain Go value.
func ggufGo(v gguf.Value) any {
	switch v.Type {
	case gguf.String:
		return v.Str
	case gguf.Bool:
		return v.Bool
	case gguf.Float32, gguf.Float64:
		return v.Float
	case gguf.Array:
		out := make([]any, len(v.Array))
		for i, e := range v.Array {
			out[i] = ggufGo(e)
		}
		return out
	}
	if i, ok := v.AsInt(); ok {
		return i
	}
	return v.Uint
}

// chatLine renders one moex tokenize --chat line: {"messages",
// "add_generation_prompt", "tools", "chat_template_kwargs"} → {"text", "ids"}.
func (m *modelText) chatLine(line []byte) (any, error) {
	var in struct {
		Messages            []json.RawMessage `json:"messages"`
		AddGenerationPrompt bool              `json:"add_generation_prompt"`
		Tools               json.RawMessage   `json:"tools"`
		Kwargs              map[string]any    `json:"chat_template_kwargs"`
	}
	if err := strictJSON(line, &in); err != nil {
		return nil, err
	}
	if in.Messages == nil {
		return nil, errors.New(`the line has no "messages"`)
	}
	chatIn, err := serve.NewChatInput(in.Messages, in.Tools, in.AddGenerationPrompt, in.Kwargs)
	if err != nil {
		return nil, err
	}
	text, err := m.render(context.Background(), chatIn)
	if err != nil {
		return nil, err
	}
	ids, err := m.tok.Encode(text, false) // the template wrote the special tokens
	if err != nil {
		return nil, err
	}
	return struct {
		Text string  `json:"text"`
		IDs  []int32 `json:"ids"`
	}{text, nonNilIDs(ids)}, nil
}

// chatText renders a chat request's body into its prompt text, for the
// router to match (false: a body it cannot render).
func (m *modelText) chatText(body []byte) ([]byte, bool) {
	var req struct {
		Messages            []json.RawMessage `json:"messages"`
		Tools               json.RawMessage   `json:"tools"`
		AddGenerationPrompt *bool             `json:"add_generation_prompt"`
		Kwargs              map[string]any    `json:"chat_template_kwargs"`
	}
	if json.Unmarshal(body, &req) != nil || len(req.Messages) == 0 {
		return nil, false
	}
	in, err := serve.NewChatInput(req.Messages, req.Tools, req.AddGenerationPrompt == nil || *req.AddGenerationPrompt, req.Kwargs)
	if err != nil {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	text, err := m.render(ctx, in)
	if err != nil {
		return nil, false
	}
	return []byte(text), true
}

// render renders a conversation with the model's template.
func (m *modelText) render(ctx context.Context, in serve.ChatInput) (string, error) {
	if m.tpl == nil {
		return "", chat.ErrNoTemplate
	}
	opt := chat.Options{AddGenerationPrompt: in.AddGenerationPrompt, Kwargs: in.Kwargs}
	if len(in.Tools) > 0 && string(in.Tools) != "null" {
		var tools []json.RawMessage
		if err := json.Unmarshal(in.Tools, &tools); err != nil {
			return "", errors.New("tools must be a list") // NewChatInput checked it
		}
		for _, t := range tools {
			opt.Tools = append(opt.Tools, t)
		}
	}
	return m.tpl.RenderJSON(ctx, in.Messages, opt)
}

// serveText is the model's text as the server's tokenizer, and the ids
// that end a generation.
func (m *modelText) serveText() (serve.Text, []int32, error) {
	t := serve.Text{Tok: m.tok}
	if m.tpl != nil {
		t.Chat = m.render
		t.Reasoning = m.reasoning
	}
	stops, err := tokenizer.StopIDs(m.dir, m.tok)
	return t, stops, err
}
