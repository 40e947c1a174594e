package chat

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// specialTokens are the tokenizer attributes transformers passes to the
// template (special_tokens_map), additional_special_tokens aside.
var specialTokens = []string{"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}

// Load reads the chat template of a model folder (a Hugging Face
// snapshot), as transformers finds it:
//
//   - chat_template.jinja beside the tokenizer is the default template, and
//     additional_chat_templates/NAME.jinja a named one;
//   - else chat_template.json's or tokenizer_config.json's "chat_template":
//     a string (the default), or a list of {"name", "template"}.
//
// name picks a template ("" means "default"). The special tokens come from
// tokenizer_config.json: bos_token, eos_token, unk_token, sep_token,
// pad_token, cls_token, mask_token (a string or {"content": ...}), and
// additional_special_tokens (a list of them); those null or empty are not
// set. No template, or none of that name, is ErrNoTemplate.
func Load(dir, name string) (*Template, error) {
	if name == "" {
		name = "default"
	}
	config, err := readConfig(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		return nil, err
	}
	templates := map[string]string{}
	for _, file := range []string{"tokenizer_config.json", "chat_template.json"} {
		c := config
		if file != "tokenizer_config.json" {
			if c, err = readConfig(filepath.Join(dir, file)); err != nil {
				return nil, err
			}
		}
		if err := addTemplates(templates, c["chat_template"]); err != nil {
			return nil, fmt.Errorf("chat: %s: %w", filepath.Join(dir, file), err)
		}
	}
	if src, ok, err := readOptional(filepath.Join(dir, "chat_template.jinja")); err != nil {
		return nil, err
	} else if ok {
		templates["default"] = src
	}
	if name != "default" && !strings.ContainsAny(name, `/\`) && name != "." && name != ".." {
		if src, ok, err := readOptional(filepath.Join(dir, "additional_chat_templates", name+".jinja")); err != nil {
			return nil, err
		} else if ok {
			templates[name] = src
		}
	}
	src, ok := templates[name]
	if !ok {
		if len(templates) == 0 {
			return nil, fmt.Errorf("%w in %s", ErrNoTemplate, dir)
		}
		names := make([]string, 0, len(templates))
		for n := range templates {
			names = append(names, n)
		}
		slices.Sort(names)
		return nil, fmt.Errorf("%w named %q in %s (it has %s)", ErrNoTemplate, name, dir, strings.Join(names, ", "))
	}
	specials, err := configSpecials(config)
	if err != nil {
		return nil, fmt.Errorf("chat: %s: %w", filepath.Join(dir, "tokenizer_config.json"), err)
	}
	t, err := Parse(src, specials)
	if err != nil {
		return nil, fmt.Errorf("%s template of %s: %w", name, dir, err)
	}
	return t, nil
}

// readConfig reads a JSON object; a missing file is an empty one.
func readConfig(path string) (map[string]json.RawMessage, error) {
	data, ok, err := readOptional(path)
	if err != nil || !ok {
		return nil, err
	}
	var c map[string]json.RawMessage
	if err := json.Unmarshal([]byte(data), &c); err != nil {
		return nil, fmt.Errorf("chat: %s: %w", path, err)
	}
	return c, nil
}

// readOptional reads a file; ok is false when there is none.
func readOptional(path string) (string, bool, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("chat: %w", err)
	}
	return string(data), true, nil
}

// addTemplates adds a "chat_template" value: a string (the default
// template) or a list of {"name", "template"}.
func addTemplates(templates map[string]string, raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		templates["default"] = s
		return nil
	}
	var list []struct {
		Name     *string `json:"name"`
		Template *string `json:"template"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return errors.New(`"chat_template" is neither a string nor a list of {"name", "template"}`)
	}
	for i, e := range list {
		if e.Name == nil || e.Template == nil {
			return fmt.Errorf(`"chat_template"[%d] lacks "name" or "template"`, i)
		}
		templates[*e.Name] = *e.Template
	}
	return nil
}

// configSpecials reads the special tokens of a tokenizer_config.json.
func configSpecials(config map[string]json.RawMessage) (map[string]any, error) {
	out := map[string]any{}
	for _, key := range specialTokens {
		s, err := tokenContent(config[key])
		if err != nil {
			return nil, fmt.Errorf("%q: %w", key, err)
		}
		if s != "" {
			out[key] = s
		}
	}
	if raw := config["additional_special_tokens"]; len(raw) > 0 && string(raw) != "null" {
		var list []json.RawMessage
		if err := json.Unmarshal(raw, &list); err != nil {
			return nil, fmt.Errorf(`"additional_special_tokens" is not a list`)
		}
		var toks []any
		for i, r := range list {
			s, err := tokenContent(r)
			if err != nil {
				return nil, fmt.Errorf(`"additional_special_tokens"[%d]: %w`, i, err)
			}
			toks = append(toks, s)
		}
		if len(toks) > 0 {
			out["additional_special_tokens"] = toks
		}
	}
	return out, nil
}

// tokenContent reads a token: a string, {"__type": "AddedToken",
// "content": ...}, or null ("").
func tokenContent(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var tok struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(raw, &tok); err != nil || tok.Content == nil {
		return "", errors.New(`neither a string nor {"content": ...}`)
	}
	return *tok.Content, nil
}
