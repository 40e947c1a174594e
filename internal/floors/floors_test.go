package floors

import (
	"bytes"
	"fmt"
	"os/exec"
	"path"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/moex-project/moex"

// floorOf is the floor of pkg (relative to the module) and the root of its
// tree; ok is false for a package no floor names.
func floorOf(pkg string) (floor int, root string, ok bool) {
	for p := pkg; p != "." && p != ""; p = path.Dir(p) {
		if f, found := Floors[p]; found {
			return f, p, true
		}
	}
	return 0, "", false
}

// allowed is whether pkg may import dep (both relative to the module).
func allowed(pkg, dep string) error {
	fp, rootP, ok := floorOf(pkg)
	if !ok {
		return fmt.Errorf("%s is on no floor: add its tree to floors.Floors", pkg)
	}
	fd, _, ok := floorOf(dep)
	if !ok {
		return fmt.Errorf("%s (imported by %s) is on no floor: add its tree to floors.Floors", dep, pkg)
	}
	if rootP == "router" && fd != 0 {
		return fmt.Errorf("%s imports %s: the router speaks HTTP to workers and imports no engine package", pkg, dep)
	}
	switch {
	case fd < fp:
		return nil
	case fd > fp:
		return fmt.Errorf("%s (floor %d) imports %s (floor %d): an import up the house", pkg, fp, dep, fd)
	case fp == 0 && fd == 0:
		return nil // the helpers may use one another
	case strings.HasPrefix(pkg, dep+"/"):
		return nil // a subpackage uses its parent
	default:
		return fmt.Errorf("%s imports %s on its own floor %d, which is not its ancestor", pkg, dep, fp)
	}
}

// imports lists every moex package's moex imports under tags, from go
// list (-e: a package that does not build, such as the cuda package
// before its fatbin exists, still lists its imports).
func imports(t *testing.T, tags string) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-e", "-tags", tags, "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, module+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "go list: %s", stderr.String())
	got := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg, ok := strings.CutPrefix(f[0], module+"/")
		if !ok {
			continue
		}
		for _, imp := range f[1:] {
			if dep, ok := strings.CutPrefix(imp, module+"/"); ok {
				got[pkg] = append(got[pkg], dep)
			}
		}
		if _, seen := got[pkg]; !seen {
			got[pkg] = nil
		}
	}
	return got
}

// TestImportsPointDown: no import from a lower floor to a higher one, no
// sibling on one floor, in any build configuration.
func TestImportsPointDown(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	edges := map[string]bool{}
	for _, tags := range []string{"", "cuda", "cudaemu", "mpi", "cuda,mpi", "purego"} {
		for pkg, deps := range imports(t, tags) {
			for _, dep := range deps {
				require.NoError(t, allowed(pkg, dep), "build tags %q", tags)
				edges[pkg+" → "+dep] = true
			}
		}
	}
	require.Contains(t, edges, "moe/moegpu → cuda", "the listing sees the cuda-tagged packages")
	require.Contains(t, edges, "cmd/moex → moe")
	if testing.Verbose() {
		lines := make([]string, 0, len(edges))
		for e := range edges {
			lines = append(lines, e)
		}
		sort.Strings(lines)
		t.Log("imports between moex packages (all build configurations):\n" + strings.Join(lines, "\n"))
	}
}

// TestAllowed: the rule itself, on imports it must refuse and accept.
func TestAllowed(t *testing.T) {
	for _, c := range []struct {
		pkg, dep string
		ok       bool
	}{
		{"moe", "kernels", true},
		{"moe/moegpu", "moe", true},
		{"moe/moegpu", "cuda", true},
		{"dpattn/dpattngpu", "moe/moegpu", true},
		{"internal/stwrite", "internal/half", true},
		{"cuda", "moe", false},            // the runtime above the pipeline
		{"kernels/cudaemu", "moe", false}, // the ground floor reaching up
		{"bindings/nccl", "ep", false},
		{"moe", "moe/moegpu", false},  // a parent importing its subpackage
		{"ep/mpi", "ep/epgpu", false}, // siblings
		{"router", "moe", false},
		{"moe", "cmd/moex", false},
		{"newtree", "moe", false},
		{"internal/decoderun", "dpattn", true},
		{"dpattn", "internal/decoderun", false},
		{"cmd/moex", "internal/decoderun", true},
	} {
		err := allowed(c.pkg, c.dep)
		if c.ok {
			require.NoError(t, err, "%s → %s", c.pkg, c.dep)
		} else {
			require.Error(t, err, "%s → %s", c.pkg, c.dep)
		}
	}
}
