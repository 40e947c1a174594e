package router

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// routeText is the text of a request body that the tree matches: for
// /generate its text (or its input_ids as decimal numbers joined by
// spaces), for /v1/completions its prompt, for /v1/chat/completions every
// message's text in order, joined by spaces. A body it cannot read gives
// no text (the request then goes as a miss; the worker answers its error).
func routeText(path string, body []byte) []byte {
	switch path {
	case "/generate":
		var g struct {
			Text     json.RawMessage `json:"text"`
			InputIDs json.RawMessage `json:"input_ids"`
		}
		if json.Unmarshal(body, &g) != nil {
			return nil
		}
		if t := promptText(g.Text); t != nil {
			return t
		}
		return promptText(g.InputIDs)
	case "/v1/completions":
		var c struct {
			Prompt json.RawMessage `json:"prompt"`
		}
		if json.Unmarshal(body, &c) != nil {
			return nil
		}
		return promptText(c.Prompt)
	case "/v1/chat/completions":
		var c struct {
			Messages []struct {
				Content json.RawMessage `json:"content"`
			} `json:"messages"`
		}
		if json.Unmarshal(body, &c) != nil {
			return nil
		}
		var out []byte
		for i, m := range c.Messages {
			if i > 0 {
				out = append(out, ' ')
			}
			var s string
			if json.Unmarshal(m.Content, &s) == nil {
				out = append(out, s...)
				continue
			}
			var parts []struct {
				Text string `json:"text"`
			}
			if json.Unmarshal(m.Content, &parts) == nil {
				for j, p := range parts {
					if j > 0 {
						out = append(out, ' ')
					}
					out = append(out, p.Text...)
				}
			}
		}
		return out
	}
	return nil
}

// promptText reads a prompt field: a string, token ids, or a list of
// either (joined by spaces).
func promptText(raw json.RawMessage) []byte {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []byte(s)
	}
	var ids []int64
	if json.Unmarshal(raw, &ids) == nil {
		return joinIDs(nil, ids)
	}
	var texts []string
	if json.Unmarshal(raw, &texts) == nil {
		var out []byte
		for i, t := range texts {
			if i > 0 {
				out = append(out, ' ')
			}
			out = append(out, t...)
		}
		return out
	}
	var lists [][]int64
	if json.Unmarshal(raw, &lists) == nil {
		var out []byte
		for i, l := range lists {
			if i > 0 {
				out = append(out, ' ')
			}
			out = joinIDs(out, l)
		}
		return out
	}
	return nil
}

func joinIDs(out []byte, ids []int64) []byte {
	for i, id := range ids {
		if i > 0 {
			out = append(out, ' ')
		}
		out = strconv.AppendInt(out, id, 10)
	}
	return out
}
