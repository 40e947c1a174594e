package chat_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/chat"
)

// mustParse parses src with no special tokens.
func mustParse(t *testing.T, src string) *chat.Template {
	t.Helper()
	tmpl, err := chat.Parse(src, nil)
	require.NoError(t, err)
	return tmpl
}

// render renders messages with opt and fails the test on an error.
func render(t *testing.T, tmpl *chat.Template, messages []chat.Message, opt chat.Options) string {
	t.Helper()
	out, err := tmpl.Render(context.Background(), messages, opt)
	require.NoError(t, err)
	return out
}

func TestParseSyntaxErrors(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		line      int
		words     string
	}{
		{"unclosed if", "a\n{% if x %}\nb", 2, "never closed"},
		{"unclosed for inside if", "{% if x %}\n{% for m in messages %}\n{% endif %}", 3, "endfor"},
		{"end without block", "a\n\n{% endfor %}", 3, "closes no block"},
		{"else outside a block", "x\n{% else %}", 2, "else"},
		{"break outside a loop", "{% if x %}\n{% break %}{% endif %}", 2, "outside a {% for %}"},
		{"unclosed expression", "a\n\n{{ x", 3, "end of template"},
		{"unclosed comment", "a\n{# x", 2, "comment"},
		{"unterminated string", "\n{{ 'abc }}", 2, "unexpected char"},
		{"unbalanced bracket", "\n\n{{ (1 }}", 3, "unexpected '}'"},
		{"empty expression", "x\n{{ }}", 2, "expected an expression"},
		{"bad escape", "{{ '\\x4' }}", 1, "escape"},
		{"bad expression", "line1\nline2\n{{ 1 + }}", 3, ""},
		{"unknown tag", "\n{% include 'other.jinja' %}", 2, "include"},
		{"nested too deep", strings.Repeat("{% if x %}\n", 200), 101, "nested deeper"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmpl, err := chat.Parse(tc.src, nil)
			require.Error(t, err)
			assert.Nil(t, tmpl)
			assert.Contains(t, err.Error(), fmt.Sprintf("line %d", tc.line))
			assert.Contains(t, err.Error(), tc.words)
			var se *chat.SyntaxError
			if errors.As(err, &se) {
				assert.Equal(t, tc.line, se.Line)
			}
		})
	}
}

func TestRenderRaiseException(t *testing.T) {
	tmpl := mustParse(t, `{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}`+
		`{{ raise_exception('Unknown role: ' + m.role) }}{% endif %}{{ m.content }}{% endfor %}`)
	out, err := tmpl.Render(context.Background(), []chat.Message{{"role": "user", "content": "hi"}, {"role": "narrator", "content": "..."}}, chat.Options{})
	require.ErrorIs(t, err, chat.ErrTemplateRaised)
	var raised *chat.RaisedError
	require.ErrorAs(t, err, &raised)
	assert.Equal(t, "Unknown role: narrator", raised.Message)
	assert.Contains(t, err.Error(), "Unknown role: narrator")
	assert.Empty(t, out, "a rejected conversation renders no prompt")

	out, err = tmpl.Render(context.Background(), []chat.Message{{"role": "user", "content": "hi"}}, chat.Options{})
	require.NoError(t, err)
	assert.Equal(t, "hi", out)
}

// writeFiles writes files (name -> content) under a new folder.
func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		path := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
	}
	return dir
}

// probe prints the special tokens a template sees.
const probe = `{{ bos_token is defined }}|{{ bos_token }}|{{ eos_token }}|{{ unk_token is defined }}|` +
	`{{ pad_token }}|{{ additional_special_tokens|length if additional_special_tokens is defined else '-' }}`

func TestLoad(t *testing.T) {
	ctx := context.Background()
	user := []chat.Message{{"role": "user", "content": "hi"}}
	for _, tc := range []struct {
		name  string
		files map[string]string
		tmpl  string // Load's name argument
		want  string // the render, or
		err   error  // the error Load returns (errors.Is), or
		words string // words of an error that is none of the sentinels
	}{
		{name: "config string", tmpl: "", want: "True|<s>|</s>|False|<pad>|-", files: map[string]string{
			"tokenizer_config.json": `{"chat_template": ` + jsonString(probe) + `, "bos_token": "<s>", "eos_token": "</s>", "unk_token": null, "pad_token": "<pad>"}`}},
		{name: "AddedToken and additional tokens", want: "True|<｜begin▁of▁sentence｜>|<|im_end|>|False||2", files: map[string]string{
			"tokenizer_config.json": `{"chat_template": ` + jsonString(probe) + `,
				"bos_token": {"__type": "AddedToken", "content": "<｜begin▁of▁sentence｜>", "lstrip": false},
				"eos_token": "<|im_end|>", "unk_token": "", "additional_special_tokens": ["<|a|>", {"content": "<|b|>"}]}`}},
		{name: "chat_template.jinja wins", want: "jinja file", files: map[string]string{
			"chat_template.jinja":   "jinja file\n",
			"tokenizer_config.json": `{"chat_template": "config"}`}},
		{name: "chat_template.jinja alone", want: "False", files: map[string]string{
			"chat_template.jinja": "{{ bos_token is defined }}"}},
		{name: "chat_template.json", want: "processor", files: map[string]string{
			"chat_template.json": `{"chat_template": "processor"}`}},
		{name: "list picks default", want: "plain", files: map[string]string{
			"tokenizer_config.json": `{"chat_template": [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "plain"}]}`}},
		{name: "list picks a name", tmpl: "tool_use", want: "tools", files: map[string]string{
			"tokenizer_config.json": `{"chat_template": [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": "plain"}]}`}},
		{name: "additional_chat_templates", tmpl: "rag", want: "rag", files: map[string]string{
			"chat_template.jinja":                 "default",
			"additional_chat_templates/rag.jinja": "rag"}},
		{name: "list without default", err: chat.ErrNoTemplate, words: "tool_use", files: map[string]string{
			"tokenizer_config.json": `{"chat_template": [{"name": "tool_use", "template": "tools"}]}`}},
		{name: "unknown name", tmpl: "rag", err: chat.ErrNoTemplate, words: `"rag"`, files: map[string]string{
			"tokenizer_config.json": `{"chat_template": "plain"}`}},
		{name: "no template in config", err: chat.ErrNoTemplate, files: map[string]string{
			"tokenizer_config.json": `{"bos_token": "<s>", "chat_template": null}`}},
		{name: "empty folder", err: chat.ErrNoTemplate, files: map[string]string{}},
		{name: "malformed config", words: "tokenizer_config.json", files: map[string]string{
			"tokenizer_config.json": `{"chat_template": "x",`}},
		{name: "chat_template of the wrong type", words: "neither a string nor a list", files: map[string]string{
			"tokenizer_config.json": `{"chat_template": 42}`}},
		{name: "list entry without template", words: `lacks "name" or "template"`, files: map[string]string{
			"tokenizer_config.json": `{"chat_template": [{"name": "default"}]}`}},
		{name: "special token of the wrong type", words: "bos_token", files: map[string]string{
			"tokenizer_config.json": `{"chat_template": "x", "bos_token": 1}`}},
		{name: "template syntax error", words: "line 2", files: map[string]string{
			"chat_template.jinja": "ok\n{% if %}"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmpl, err := chat.Load(writeFiles(t, tc.files), tc.tmpl)
			if tc.err != nil || tc.words != "" {
				require.Error(t, err)
				if tc.err != nil {
					require.ErrorIs(t, err, tc.err)
				} else {
					require.NotErrorIs(t, err, chat.ErrNoTemplate)
				}
				assert.Contains(t, err.Error(), tc.words)
				return
			}
			require.NoError(t, err)
			out, err := tmpl.Render(ctx, user, chat.Options{})
			require.NoError(t, err)
			assert.Equal(t, tc.want, out)
		})
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func TestRenderVariables(t *testing.T) {
	tmpl, err := chat.Parse(`{{ tools is none }}/{{ documents is none }}/{{ add_generation_prompt }}/{{ messages|length }}/`+
		`{{ bos_token }}/{{ enable_thinking }}/{{ tools|length if tools else 0 }}/{{ documents[0].title if documents else '' }}`,
		map[string]any{"bos_token": "<s>"})
	require.NoError(t, err)
	msgs := []chat.Message{{"role": "user", "content": "hi"}}
	assert.Equal(t, "True/True/False/1/<s>//0/", render(t, tmpl, msgs, chat.Options{}))
	assert.Equal(t, "False/False/True/1/[BOS]/False/1/T", render(t, tmpl, msgs, chat.Options{
		AddGenerationPrompt: true,
		Tools:               []any{map[string]any{"type": "function"}},
		Documents:           []any{json.RawMessage(`{"title": "T"}`)},
		Kwargs:              map[string]any{"enable_thinking": false, "bos_token": "[BOS]"},
	}), "Kwargs override special tokens")
	assert.Equal(t, "False/True/False/1/<s>//0/", render(t, tmpl, msgs, chat.Options{Tools: []any{}}), "empty tools are a list")

	for _, name := range []string{"messages", "tools", "documents", "add_generation_prompt", "__moex_print"} {
		_, err := tmpl.Render(context.Background(), msgs, chat.Options{Kwargs: map[string]any{name: 1}})
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), name)
	}
}

// TestRenderValues: Go values and raw JSON reach the template as Python
// would hold them.
func TestRenderValues(t *testing.T) {
	tmpl := mustParse(t, `{% for m in messages %}{{ m|tojson }}{% endfor %}|{{ tools|tojson }}`)
	type call struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	}
	out := render(t, tmpl, []chat.Message{{
		"role": "assistant", "content": nil, "n": 3.0, "f": 2.5, "i": int64(7),
		"calls": []call{{Name: "f", Arguments: "x"}},
	}}, chat.Options{Tools: []any{json.RawMessage(`{"z": 1, "a": 1.0, "m": [true, null]}`)}})
	assert.Equal(t, `{"calls": [{"name": "f", "arguments": "x"}], "content": null, "f": 2.5, "i": 7, "n": 3, "role": "assistant"}`+
		`|[{"z": 1, "a": 1.0, "m": [true, null]}]`, out,
		"map keys sorted, struct fields and raw JSON in order, a whole float64 an int, JSON's 1.0 a float")

	_, err := tmpl.Render(context.Background(), []chat.Message{{"c": make(chan int)}}, chat.Options{})
	require.Error(t, err, "a value JSON cannot hold")
}

func TestRenderToolArguments(t *testing.T) {
	messages := `[{"role": "assistant", "content": "", "tool_calls": [
		{"type": "function", "function": {"name": "a", "arguments": "{\"city\": \"Paris\", \"n\": 2}"}},
		{"type": "function", "function": {"name": "b", "arguments": "[1, 2]"}},
		{"type": "function", "function": {"name": "c", "arguments": "{not json"}},
		{"type": "function", "function": {"name": "d", "arguments": {"already": "a mapping"}}}]}]`
	mapping := mustParse(t, `{% for c in messages[0].tool_calls %}{{ c.function.name }}:`+
		`{% if c.function.arguments is mapping %}{% for k, v in c.function.arguments|items %}{{ k }}={{ v }},{% endfor %}`+
		`{% else %}{{ c.function.arguments }}{% endif %};{% endfor %}`)
	out, err := mapping.RenderJSON(context.Background(), []byte(messages), chat.Options{})
	require.NoError(t, err)
	assert.Equal(t, `a:city=Paris,n=2,;b:[1, 2];c:{not json;d:already=a mapping,;`, out)

	concat := mustParse(t, `{% for c in messages[0].tool_calls %}{{ '<' + c['function']['arguments'] + '>' }}{% endfor %}`)
	assert.True(t, chat.ArgumentsAsString(concat))
	out, err = concat.RenderJSON(context.Background(), []byte(`[{"role": "assistant", "tool_calls": [
		{"function": {"arguments": "{\"city\": \"Paris\", \"n\": 2}"}},
		{"function": {"arguments": "[1, 2]"}}, {"function": {"arguments": "{not json"}}]}]`), chat.Options{})
	require.NoError(t, err)
	assert.Equal(t, `<{"city": "Paris", "n": 2}><[1, 2]><{not json>`, out, "a template that concatenates gets the string")

	// The caller's messages are not changed.
	msgs := []chat.Message{{"role": "assistant", "tool_calls": []any{map[string]any{"function": map[string]any{"name": "a", "arguments": `{"x": 1}`}}}}}
	render(t, mapping, msgs, chat.Options{})
	assert.Equal(t, `{"x": 1}`, msgs[0]["tool_calls"].([]any)[0].(map[string]any)["function"].(map[string]any)["arguments"])
}

func TestRenderJSONBadInput(t *testing.T) {
	tmpl := mustParse(t, "{{ messages|length }}")
	for _, in := range []string{``, `[`, `{"role": "user"}`, `[1] 2`, `[{"a": 1,}]`} {
		_, err := tmpl.RenderJSON(context.Background(), []byte(in), chat.Options{})
		assert.Error(t, err, in)
	}
	deep := strings.Repeat("[", 1000) + strings.Repeat("]", 1000)
	_, err := tmpl.RenderJSON(context.Background(), []byte("["+deep+"]"), chat.Options{})
	assert.ErrorContains(t, err, "nested too deeply")
}

// TestRenderFailures: what Python's sandbox refuses, and what would crash
// the library, are errors.
func TestRenderFailures(t *testing.T) {
	for _, tc := range []struct{ name, src, words string }{
		{"library panic", `{{ 'a' * -1 }}`, "render"},
		{"range past the sandbox's limit", `{% for i in range(200000) %}{% endfor %}`, "MAX_RANGE"},
		{"endless recursion", `{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}`, "nested deeper"},
		{"str method on None", `{{ none.strip() }}`, "has no attribute 'strip'"},
		{"tojson of Undefined", `{{ missing|tojson }}`, "not JSON serializable"},
		{"empty separator", `{{ 'a'.split('') }}`, "empty separator"},
		{"strftime_now without a string", `{{ strftime_now(1) }}`, "format"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmpl := mustParse(t, tc.src)
			out, err := tmpl.Render(context.Background(), nil, chat.Options{})
			require.Error(t, err)
			assert.ErrorContains(t, err, tc.words)
			assert.Empty(t, out)
			assert.NotErrorIs(t, err, chat.ErrTemplateRaised)
		})
	}
}

func TestRenderContext(t *testing.T) {
	tmpl := mustParse(t, `{% for m in messages %}{{ m.content }}{% endfor %}`)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := tmpl.Render(ctx, []chat.Message{{"content": "x"}}, chat.Options{})
	require.ErrorIs(t, err, context.Canceled)

	// A loop that prints nothing still stops.
	loop := mustParse(t, `{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}`)
	ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = loop.Render(ctx, nil, chat.Options{})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 5*time.Second)
}

func TestRenderNow(t *testing.T) {
	tmpl := mustParse(t, `{{ strftime_now("%Y-%m-%d") }}|{{ strftime_now("%d %b %Y") }}`)
	at := time.Date(2024, 2, 29, 23, 59, 0, 0, time.UTC)
	assert.Equal(t, "2024-02-29|29 Feb 2024", render(t, tmpl, nil, chat.Options{Now: func() time.Time { return at }}))
	today := time.Now().Format("2006-01-02")
	got := render(t, tmpl, nil, chat.Options{})
	if !strings.HasPrefix(got, today) { // unless midnight passed in between
		assert.Equal(t, time.Now().Format("2006-01-02"), got[:10])
	}
}

func TestRenderConcurrent(t *testing.T) {
	tmpl := mustParse(t, `{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}`+
		`{{ m.role }}:{{ m.content.strip() }}|{% endfor %}{{ ns.n }}{{ strftime_now('%Y') }}`)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				msgs := []chat.Message{{"role": "user", "content": fmt.Sprintf(" %d-%d ", g, i)}}
				year := 2000 + g
				out, err := tmpl.Render(context.Background(), msgs, chat.Options{Now: func() time.Time { return time.Date(year, 1, 1, 0, 0, 0, 0, time.UTC) }})
				if want := fmt.Sprintf("user:%d-%d|1%d", g, i, year); err != nil || out != want {
					errs <- fmt.Errorf("got %q, %v; want %q", out, err, want)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// FuzzParseRender: any source and conversation give a prompt or an error,
// never a panic.
func FuzzParseRender(f *testing.F) {
	h, cases := readFixtureF(f, "snippets")
	_ = h
	for _, c := range cases {
		f.Add(c.Template, `[{"role": "user", "content": "hi"}]`)
	}
	features, err := os.ReadFile(filepath.Join(repoRoot, "testdata", "chat", "features.jinja"))
	require.NoError(f, err)
	f.Add(string(features), `[{"role": "system", "content": " s "}, {"role": "user", "content": "a?"}, {"role": "assistant", "content": null, "tool_calls": [{"function": {"name": "f", "arguments": "{\"a\": 1}"}}]}]`)
	f.Add(`{% macro m(x) %}{{ x.split()|join(',') }}{% endmacro %}{{ m(messages[0].content) }}`, `[{"content": "a b"}]`)
	f.Fuzz(func(t *testing.T, src, messages string) {
		tmpl, err := chat.Parse(src, map[string]any{"bos_token": "<s>"})
		if err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, _ = tmpl.RenderJSON(ctx, []byte(messages), chat.Options{AddGenerationPrompt: true, Now: time.Now})
	})
}

// readFixtureF reads a fixture for a fuzz target's seeds or a benchmark.
func readFixtureF(f testing.TB, name string) (fixtureHeader, []fixtureCase) {
	var h fixtureHeader
	var cases []fixtureCase
	data, err := os.ReadFile(filepath.Join(repoRoot, "testdata", "chat", name+".jsonl"))
	require.NoError(f, err)
	for i, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if i == 0 {
			require.NoError(f, json.Unmarshal([]byte(line), &h))
			continue
		}
		var c fixtureCase
		require.NoError(f, json.Unmarshal([]byte(line), &c))
		cases = append(cases, c)
	}
	return h, cases
}

// TestRenderIsolated: what one render changes, the next does not see.
func TestRenderIsolated(t *testing.T) {
	tmpl, err := chat.Parse(`{% set _ = additional_special_tokens.append('x') %}{{ additional_special_tokens|length }}`+
		`{% set _ = messages.append(1) %}{{ messages|length }}`, map[string]any{"additional_special_tokens": []any{"a"}})
	require.NoError(t, err)
	msgs := []chat.Message{{"role": "user"}}
	for range 3 {
		assert.Equal(t, "22", render(t, tmpl, msgs, chat.Options{}))
	}
	assert.Len(t, msgs, 1)
}
