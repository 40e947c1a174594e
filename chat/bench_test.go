package chat_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/chat"
)

// BenchmarkRender renders testdata/chat/features.jinja with a tool-calling
// conversation from its fixture.
func BenchmarkRender(b *testing.B) {
	src, err := os.ReadFile(filepath.Join(repoRoot, "testdata", "chat", "features.jinja"))
	require.NoError(b, err)
	tmpl, err := chat.Parse(string(src), map[string]any{"bos_token": "<s>", "eos_token": "</s>"})
	require.NoError(b, err)
	_, cases := readFixtureF(b, "features")
	var c fixtureCase
	for _, fc := range cases {
		if fc.Name == "tool_calls_null_content" {
			c = fc
		}
	}
	require.NotEmpty(b, c.Messages)
	opt := chat.Options{AddGenerationPrompt: true, Tools: rawListTB(b, c.Tools)}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tmpl.RenderJSON(ctx, c.Messages, opt); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParse parses testdata/chat/features.jinja.
func BenchmarkParse(b *testing.B) {
	src, err := os.ReadFile(filepath.Join(repoRoot, "testdata", "chat", "features.jinja"))
	require.NoError(b, err)
	for b.Loop() {
		if _, err := chat.Parse(string(src), nil); err != nil {
			b.Fatal(err)
		}
	}
}
