package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/moex-project/moex/tokenizer"
)

// stdin is what moex tokenize reads (a test sets its own).
var stdin io.Reader = os.Stdin

// maxTokenizeLine bounds one JSON line of moex tokenize's input.
const maxTokenizeLine = 64 << 20

// cmdTokenize reads JSON lines on stdin and writes one JSON line per input
// line, in order: {"text"} → {"ids"} (encode), {"ids"} → {"text"}
// (--decode), {"messages", "add_generation_prompt"} → {"text", "ids"}
// (--chat). A line that cannot be served gets {"error"} on its line; the
// command then exits non-zero, naming the first such line.
func cmdTokenize(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tokenize", flag.ContinueOnError)
	model := fs.String("model", "", "a model folder (tokenizer.json, tokenizer_config.json, chat_template.jinja; no weights needed)")
	noSpecial := fs.Bool("no-special", false, "encode without adding the special tokens (add_special_tokens=False)")
	decode := fs.Bool("decode", false, `decode: {"ids": [...]} → {"text": "..."}`)
	chatMode := fs.Bool("chat", false, `render the chat template: {"messages": [...], "add_generation_prompt": true} → {"text", "ids"}`)
	skipSpecial := fs.Bool("skip-special", false, "--decode: leave the special tokens out of the text")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	switch {
	case *model == "":
		return fmt.Errorf("%w: tokenize: --model is required", errUsage)
	case *decode && *chatMode:
		return fmt.Errorf("%w: tokenize: give --decode or --chat, not both", errUsage)
	}
	text, err := loadText(*model, *chatMode)
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(stdin)
	sc.Buffer(make([]byte, 64<<10), maxTokenizeLine)
	out := bufio.NewWriter(stdout)
	defer out.Flush()
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	line, failed, first := 0, 0, 0
	for sc.Scan() {
		line++
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var answer any
		var err error
		switch {
		case *decode:
			answer, err = tokenizeDecode(text.tok, sc.Bytes(), *skipSpecial)
		case *chatMode:
			answer, err = text.chatLine(sc.Bytes())
		default:
			answer, err = tokenizeEncode(text.tok, sc.Bytes(), !*noSpecial)
		}
		if err != nil {
			failed++
			if first == 0 {
				first = line
			}
			answer = map[string]string{"error": err.Error()}
		}
		if err := enc.Encode(answer); err != nil {
			return fmt.Errorf("tokenize: writing the answer to line %d: %w", line, err)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("tokenize: reading line %d: %w", line+1, err)
	}
	if failed > 0 {
		return fmt.Errorf("tokenize: %d of %d lines failed (the first: line %d)", failed, line, first)
	}
	return nil
}

func tokenizeEncode(t *tokenizer.Tokenizer, line []byte, addSpecial bool) (any, error) {
	var in struct {
		Text *string `json:"text"`
	}
	if err := strictJSON(line, &in); err != nil {
		return nil, err
	}
	if in.Text == nil {
		return nil, errors.New(`the line has no "text"`)
	}
	ids, err := t.Encode(*in.Text, addSpecial)
	if err != nil {
		return nil, err
	}
	return map[string][]int32{"ids": nonNilIDs(ids)}, nil
}

func tokenizeDecode(t *tokenizer.Tokenizer, line []byte, skipSpecial bool) (any, error) {
	var in struct {
		IDs *[]int64 `json:"ids"`
	}
	if err := strictJSON(line, &in); err != nil {
		return nil, err
	}
	if in.IDs == nil {
		return nil, errors.New(`the line has no "ids"`)
	}
	ids := make([]int32, len(*in.IDs))
	for i, id := range *in.IDs {
		if id < 0 || id >= int64(t.VocabSize()) {
			return nil, fmt.Errorf("ids[%d] = %d is outside the vocabulary of %d tokens", i, id, t.VocabSize())
		}
		ids[i] = int32(id)
	}
	text, err := t.Decode(ids, skipSpecial)
	if err != nil {
		return nil, err
	}
	return map[string]string{"text": text}, nil
}

// strictJSON decodes one JSON object, refusing trailing data.
func strictJSON(line []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(line))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("malformed JSON: %v", err)
	}
	if dec.More() {
		return errors.New("malformed JSON: data after the object")
	}
	return nil
}

func nonNilIDs(ids []int32) []int32 {
	if ids == nil {
		return []int32{}
	}
	return ids
}
