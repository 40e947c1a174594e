package main

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/moetest"
	"github.com/moex-project/moex/internal/tokref"
)

// tokenizeCLI runs moex tokenize with input on stdin.
func tokenizeCLI(t *testing.T, input string, args ...string) (string, error) {
	t.Helper()
	old := stdin
	stdin = strings.NewReader(input)
	defer func() { stdin = old }()
	out, _, err := runCLI(append([]string{"tokenize"}, args...)...)
	return out, err
}

// refLines reads testdata/tokenizer/<model>.jsonl (Hugging Face's output)
// without its header.
func refLines(t *testing.T, model string) []map[string]json.RawMessage {
	t.Helper()
	f, err := os.Open(tokref.Testdata("tokenizer", model+".jsonl"))
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	var out []map[string]json.RawMessage
	for first := true; sc.Scan(); first = false {
		if first {
			continue
		}
		var m map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m))
		out = append(out, m)
	}
	require.NoError(t, sc.Err())
	return out
}

// TestTokenize: moex tokenize on a model folder and on a GGUF file answers
// every line as Hugging Face's tokenizer does (encode, --no-special,
// --decode), one line per line, in order.
func TestTokenize(t *testing.T) {
	dir := tokref.Dir(t, "deepseek_v3")
	gguf := filepath.Join(t.TempDir(), "vocab.gguf")
	writeVocabGGUF(t, gguf, tokref.GGUFMetadata(t, "deepseek_v3"))
	var texts, ids, idsNoSpecial, decodes, decoded []string
	for _, m := range refLines(t, "deepseek_v3") {
		if m["ids"] != nil {
			texts = append(texts, `{"text": `+string(m["text"])+`}`)
			ids = append(ids, `{"ids":`+compact(t, m["ids"])+`}`)
			idsNoSpecial = append(idsNoSpecial, `{"ids":`+compact(t, m["ids_no_special"])+`}`)
		} else if m["decode"] != nil {
			decodes = append(decodes, `{"ids": `+string(m["decode"])+`}`)
			var s string
			require.NoError(t, json.Unmarshal(m["text"], &s))
			decoded = append(decoded, s)
		}
	}
	for _, model := range []string{dir, gguf} {
		out, err := tokenizeCLI(t, strings.Join(texts, "\n")+"\n", "--model", model)
		require.NoError(t, err)
		require.Equal(t, ids, strings.Split(strings.TrimSuffix(out, "\n"), "\n"), model)
		out, err = tokenizeCLI(t, strings.Join(texts, "\n"), "--model", model, "--no-special")
		require.NoError(t, err)
		require.Equal(t, idsNoSpecial, strings.Split(strings.TrimSuffix(out, "\n"), "\n"), model)
		out, err = tokenizeCLI(t, strings.Join(decodes, "\n"), "--model", model, "--decode")
		require.NoError(t, err)
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		require.Len(t, lines, len(decoded))
		for i, l := range lines {
			var got struct{ Text string }
			require.NoError(t, json.Unmarshal([]byte(l), &got))
			require.Equal(t, decoded[i], got.Text, "%s line %d", model, i+1)
		}
	}

	// Bad lines get an error on their line, the good ones their answer,
	// and the command fails naming the first bad line.
	out, err := tokenizeCLI(t, texts[0]+"\nnot json\n{\"txt\": 1}\n\n"+texts[1]+"\n", "--model", dir)
	require.ErrorContains(t, err, "2 of 5 lines failed (the first: line 2)")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Len(t, lines, 4)
	require.Equal(t, ids[0], lines[0])
	require.Contains(t, lines[1], `"error":"malformed JSON`)
	require.Contains(t, lines[2], `"error":"the line has no \"text\""`)
	require.Equal(t, ids[1], lines[3])
	out, err = tokenizeCLI(t, `{"ids": [0, 99999999]}`+"\n"+`{"ids": [-1]}`, "--model", dir, "--decode")
	require.Error(t, err)
	require.Contains(t, out, "ids[1] = 99999999 is outside the vocabulary")
	require.Contains(t, out, "ids[0] = -1 is outside the vocabulary")

	_, err = tokenizeCLI(t, "", "--model", t.TempDir())
	require.ErrorContains(t, err, "tokenizer.json")
	_, err = tokenizeCLI(t, "")
	require.ErrorContains(t, err, "--model is required")
	_, err = tokenizeCLI(t, "", "--model", dir, "--decode", "--chat")
	require.ErrorContains(t, err, "not both")
	bad := filepath.Join(t.TempDir(), "bad.gguf")
	meta := tokref.GGUFMetadata(t, "deepseek_v3")
	meta["tokenizer.ggml.pre"] = "no-such-pre"
	writeVocabGGUF(t, bad, meta)
	_, err = tokenizeCLI(t, "", "--model", bad)
	require.ErrorContains(t, err, `pre-tokenizer "no-such-pre"`)
}

func compact(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var ids []int32
	require.NoError(t, json.Unmarshal(raw, &ids))
	if ids == nil {
		ids = []int32{}
	}
	b, err := json.Marshal(ids)
	require.NoError(t, err)
	return string(b)
}

// writeVocabGGUF writes a GGUF file holding only the tokenizer metadata.
func writeVocabGGUF(t *testing.T, path string, meta map[string]any) {
	t.Helper()
	keys := make([]string, 0, len(meta))
	for k := range meta {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var kvs []moetest.GGUFKV
	for _, k := range keys {
		v := meta[k]
		switch x := v.(type) {
		case []string:
			a := moetest.GGUFArray{Elem: 8}
			for _, s := range x {
				a.Values = append(a.Values, s)
			}
			v = a
		case []int32:
			a := moetest.GGUFArray{Elem: 5}
			for _, n := range x {
				a.Values = append(a.Values, n)
			}
			v = a
		case []float32:
			a := moetest.GGUFArray{Elem: 6}
			for _, n := range x {
				a.Values = append(a.Values, n)
			}
			v = a
		}
		kvs = append(kvs, moetest.GGUFKV{Key: k, Value: v})
	}
	f, err := os.Create(path)
	require.NoError(t, err)
	require.NoError(t, moetest.WriteGGUF(f, kvs, nil, 32))
	require.NoError(t, f.Close())
}

// TestTokenizeChat: moex tokenize --chat renders each conversation as
// Jinja2 does (testdata/chat, scripts/chatref/render.py) and gives the ids
// Hugging Face's tokenizer gives that text; a conversation the template
// rejects is an error on its line.
func TestTokenizeChat(t *testing.T) {
	dir := tokref.Dir(t, "qwen3")
	ids := map[string]string{}
	for _, m := range refLines(t, "qwen3") {
		if m["chat_ids"] != nil {
			var name string
			require.NoError(t, json.Unmarshal(m["name"], &name))
			ids[strings.TrimPrefix(name, "chat/")] = compact(t, m["chat_ids"])
		}
	}
	f, err := os.Open(tokref.Testdata("chat", "qwen3.jsonl"))
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	sc.Scan() // the header
	var in []string
	var want []map[string]json.RawMessage
	for sc.Scan() {
		var c map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(sc.Bytes(), &c))
		line, err := json.Marshal(map[string]json.RawMessage{"messages": c["messages"], "add_generation_prompt": c["add_generation_prompt"],
			"tools": c["tools"], "chat_template_kwargs": c["kwargs"]})
		require.NoError(t, err)
		in = append(in, string(line))
		want = append(want, c)
	}
	require.NotEmpty(t, in)
	out, err := tokenizeCLI(t, strings.Join(in, "\n"), "--model", dir, "--chat")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Len(t, lines, len(in))
	rejected := 0
	for i, l := range lines {
		var name string
		require.NoError(t, json.Unmarshal(want[i]["name"], &name))
		if want[i]["error"] != nil {
			rejected++
			require.Contains(t, l, `"error"`, name)
			continue
		}
		var got struct {
			Text string  `json:"text"`
			IDs  []int32 `json:"ids"`
		}
		require.NoError(t, json.Unmarshal([]byte(l), &got), l)
		var text string
		require.NoError(t, json.Unmarshal(want[i]["text"], &text))
		require.Equal(t, text, got.Text, name)
		b, _ := json.Marshal(got.IDs)
		require.Equal(t, ids[name], string(b), name)
	}
	if rejected > 0 {
		require.ErrorContains(t, err, "lines failed")
	} else {
		require.NoError(t, err)
	}
}
