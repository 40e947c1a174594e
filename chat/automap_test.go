package chat_test

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/chat"
)

// automapLine is one render of testdata/chat/automap.jsonl.
type automapLine struct {
	Index       int     `json:"index"`
	Entry       string  `json:"entry"`
	Case        string  `json:"case"`
	Arguments   string  `json:"arguments"`
	TextSHA256  *string `json:"text_sha256"`
	Error       *string `json:"error"`
	PythonError *string `json:"python_error"`
}

var automapEntry = regexp.MustCompile(`model: "([^"]+)",\s*gguf: `)

// TestReferenceAutomap renders conversations with the chat templates of
// 100-odd GGUF models (@huggingface/ollama-utils' table) and compares each
// text's SHA-256 with Python's. Where Python fails (a TypeError, an
// undefined variable) the case is skipped: the library is more lenient.
func TestReferenceAutomap(t *testing.T) {
	path := requireReference(t, filepath.Join(repoRoot, "scripts", "chatref", "node_modules", "@huggingface",
		"ollama-utils", "src", "chat-template-automap.ts"), chatrefInstall)
	table := readFile(t, path, chatrefInstall)
	f, err := os.Open(filepath.Join(repoRoot, "testdata", "chat", "automap.jsonl"))
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	require.True(t, sc.Scan())
	var h struct {
		fixtureHeader
		FileSHA256 string `json:"file_sha256"`
	}
	require.NoError(t, json.Unmarshal(sc.Bytes(), &h))
	require.Equal(t, h.FileSHA256, sha256Hex(table), "%s is not the table the fixture was made from", path)

	var templates []string
	for _, m := range automapEntry.FindAllStringSubmatchIndex(table, -1) {
		src, err := jsString(table[m[1]:])
		require.NoError(t, err, table[m[2]:m[3]])
		templates = append(templates, src)
	}
	cases := map[string]fixtureCase{} // the conversations, by name, from the models' fixtures
	for _, model := range []string{"features", "deepseek_v3", "qwen3", "mixtral"} {
		_, cs := readFixture(t, model)
		for _, c := range cs {
			cases[c.Name] = c
		}
	}
	parsed := map[int]*chat.Template{}
	ran, skipped := 0, 0
	for sc.Scan() {
		var l automapLine
		require.NoError(t, json.Unmarshal(sc.Bytes(), &l))
		if l.PythonError != nil {
			skipped++
			continue
		}
		require.Less(t, l.Index, len(templates))
		tmpl, ok := parsed[l.Index]
		if !ok {
			tmpl, err = chat.Parse(templates[l.Index], h.Specials)
			require.NoError(t, err, l.Entry)
			parsed[l.Index] = tmpl
		}
		c, ok := cases[l.Case]
		require.True(t, ok, "no conversation %q in the fixtures", l.Case)
		got, err := tmpl.RenderJSON(context.Background(), c.Messages, chat.Options{
			AddGenerationPrompt: c.AddGenerationPrompt,
			Tools:               rawList(t, c.Tools),
			Documents:           rawList(t, c.Documents),
			Kwargs:              rawMap(c.Kwargs),
			Now:                 fixedNow(t, h.fixtureHeader),
		})
		ran++
		if l.Arguments == "string" {
			assert.True(t, chat.ArgumentsAsString(tmpl), "%s #%d concatenates the arguments", l.Entry, l.Index)
		}
		if l.Error != nil {
			var raised *chat.RaisedError
			if assert.ErrorAs(t, err, &raised, "%s #%d %s", l.Entry, l.Index, l.Case) {
				assert.Equal(t, *l.Error, raised.Message, "%s #%d %s", l.Entry, l.Index, l.Case)
			}
			continue
		}
		if assert.NoError(t, err, "%s #%d %s", l.Entry, l.Index, l.Case) {
			assert.Equal(t, *l.TextSHA256, sha256Hex(got), "%s #%d %s (arguments as %s): rerun scripts/chatref/render.py automap to compare texts",
				l.Entry, l.Index, l.Case, l.Arguments)
		}
	}
	require.NoError(t, sc.Err())
	t.Logf("%d renders of %d templates match Python's; %d skipped where Python fails", ran, len(parsed), skipped)
	require.Greater(t, ran, 500)
}
