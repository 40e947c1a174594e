package router

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// check walks the tree and checks its invariants: the byte and node
// counts, labels non-empty and keyed by their first byte, every worker of
// a node also on its parent (a node's prefix includes its parent's), no
// node without a worker or a child.
func check(t *testing.T, tr *Tree) {
	t.Helper()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	bytes, nodes := 0, 0
	var walk func(x *tnode)
	walk = func(x *tnode) {
		for b, c := range x.children {
			require.NotEmpty(t, c.label)
			require.Equal(t, b, c.label[0])
			require.Same(t, x, c.parent)
			require.False(t, len(c.tenants) == 0 && len(c.children) == 0, "a node nobody holds")
			if x != tr.root {
				for _, w := range c.tenants {
					require.True(t, x.holds(w.w), "a worker on a node but not its parent")
				}
			}
			bytes += len(c.label)
			nodes++
			walk(c)
		}
	}
	walk(tr.root)
	require.Equal(t, bytes, tr.bytes)
	require.Equal(t, nodes, tr.nodes)
}

func TestTreeMatch(t *testing.T) {
	tr := NewTree(1 << 20)
	tr.Insert([]byte("hello world"), "a")
	m, _ := tr.MatchInsert([]byte("hello there"), func(Match) string { return "" })
	require.Equal(t, 6, m.Bytes)
	require.InDelta(t, 6.0/11, m.Rate, 1e-12)
	require.Equal(t, []string{"a"}, m.Holders)
	tr.Insert([]byte("hello there"), "b") // splits "hello world" after "hello "
	check(t, tr)
	m, _ = tr.MatchInsert([]byte("hello world!"), func(Match) string { return "" })
	require.Equal(t, 11, m.Bytes)
	require.Equal(t, []string{"a"}, m.Holders)
	m, _ = tr.MatchInsert([]byte("hello"), func(Match) string { return "" })
	require.Equal(t, 5, m.Bytes)
	holders := slices.Sorted(slices.Values(m.Holders))
	require.Equal(t, []string{"a", "b"}, holders, "both hold the prefix the match ends inside")
	m, _ = tr.MatchInsert([]byte("goodbye"), func(Match) string { return "" })
	require.Zero(t, m.Bytes)
	require.Empty(t, m.Holders)
	m, _ = tr.MatchInsert(nil, func(Match) string { return "" })
	require.Zero(t, m.Rate)
	bytes, nodes := tr.Size()
	require.Equal(t, len("hello world")+len("there"), bytes)
	require.Equal(t, 3, nodes)
	require.Equal(t, len("hello world"), tr.WorkerBytes("a"))
	require.Equal(t, len("hello there"), tr.WorkerBytes("b"))
}

// TestTreeUTF8: texts that differ inside a character (é is C3 A9, ê is
// C3 AA) split between its bytes; matches and rates count bytes.
func TestTreeUTF8(t *testing.T) {
	tr := NewTree(1 << 20)
	tr.Insert([]byte("héllo"), "a")
	tr.Insert([]byte("hêllo"), "b")
	check(t, tr)
	m, _ := tr.MatchInsert([]byte("héllo"), func(Match) string { return "" })
	require.Equal(t, 6, m.Bytes)
	require.Equal(t, []string{"a"}, m.Holders)
	m, _ = tr.MatchInsert([]byte("hëllo"), func(Match) string { return "" }) // C3 AB
	require.Equal(t, 2, m.Bytes, "h and the first byte of the character")
	require.InDelta(t, 2.0/6, m.Rate, 1e-12)
	require.Len(t, m.Holders, 2)
}

// TestTreeBudget: all-unique prompts never hold the tree over its budget,
// and what goes first is what was used longest ago.
func TestTreeBudget(t *testing.T) {
	tr := NewTree(10_000)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		text := make([]byte, 100)
		for j := range text {
			text[j] = byte(rng.IntN(256))
		}
		tr.Insert(text, fmt.Sprint("w", i%4))
		bytes, _ := tr.Size()
		require.LessOrEqual(t, bytes, 10_000)
	}
	check(t, tr)

	clock := time.Unix(0, 0)
	tr = NewTree(35)
	tr.now = func() time.Time { clock = clock.Add(time.Second); return clock }
	tr.Insert([]byte("aaaaaaaaaa"), "w")
	tr.Insert([]byte("bbbbbbbbbb"), "w")
	tr.Insert([]byte("aaaaaaaaaa"), "w") // used again: b is now the oldest
	tr.Insert([]byte("cccccccccc"), "w")
	tr.Insert([]byte("dddddddddd"), "w") // 40 bytes: down to 90 % of 35, b goes
	check(t, tr)
	for text, kept := range map[string]bool{"aaaaaaaaaa": true, "bbbbbbbbbb": false, "cccccccccc": true, "dddddddddd": true} {
		m, _ := tr.MatchInsert([]byte(text), func(Match) string { return "" })
		require.Equal(t, kept, m.Bytes == 10, text)
	}
	tr.budget = 10
	tr.Evict()
	bytes, nodes := tr.Size()
	require.Equal(t, 10, bytes)
	require.Equal(t, 1, nodes)
	m, _ := tr.MatchInsert([]byte("dddddddddd"), func(Match) string { return "" })
	require.Equal(t, 10, m.Bytes, "the newest stays")
}

func TestTreeRemoveWorker(t *testing.T) {
	tr := NewTree(1 << 20)
	tr.Insert([]byte("shared prefix, a's part"), "a")
	tr.Insert([]byte("shared prefix, b's part"), "b")
	tr.Insert([]byte("only a"), "a")
	tr.RemoveWorker("a")
	check(t, tr)
	m, _ := tr.MatchInsert([]byte("shared prefix, a's part"), func(Match) string { return "" })
	require.Equal(t, len("shared prefix, "), m.Bytes)
	require.Equal(t, []string{"b"}, m.Holders)
	m, _ = tr.MatchInsert([]byte("only a"), func(Match) string { return "" })
	require.Zero(t, m.Bytes)
	bytes, _ := tr.Size()
	require.Equal(t, len("shared prefix, b's part"), bytes)
	require.Zero(t, tr.WorkerBytes("a"))
}

// TestTreeConcurrent: inserts, matches, evictions and removals from many
// goroutines (run under -race) leave a consistent tree.
func TestTreeConcurrent(t *testing.T) {
	tr := NewTree(20_000)
	prefixes := []string{"system prompt one: ", "system prompt two: ", "another: ", ""}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			for i := range 500 {
				text := []byte(prefixes[rng.IntN(len(prefixes))] + fmt.Sprint(rng.IntN(1000)*i))
				switch i % 50 {
				case 49:
					tr.RemoveWorker(fmt.Sprint("w", rng.IntN(4)))
				case 48:
					tr.Evict()
				default:
					tr.MatchInsert(text, func(m Match) string {
						if len(m.Holders) > 0 && rng.IntN(2) == 0 {
							return m.Holders[0]
						}
						return fmt.Sprint("w", rng.IntN(4))
					})
				}
			}
		})
	}
	wg.Wait()
	check(t, tr)
}

// BenchmarkTree: insert (a fresh text each time, so a new leaf) and match
// of 10, 100 and 10,000 bytes on a tree of 10,000 texts sharing 16
// prefixes. SGLang's Rust tree: 603 ns for a 10-character insert, 1.08 µs
// for 100.
func BenchmarkTree(b *testing.B) {
	for _, n := range []int{10, 100, 10_000} {
		rng := rand.New(rand.NewPCG(uint64(n), 1))
		text := func() []byte {
			t := make([]byte, n)
			for i := range t {
				t[i] = byte('a' + rng.IntN(26))
			}
			copy(t, fmt.Sprintf("%02d", rng.IntN(16)))
			return t
		}
		tr := NewTree(1 << 30)
		texts := make([][]byte, 10_000)
		for i := range texts {
			texts[i] = text()
			tr.Insert(texts[i], fmt.Sprint("w", i%8))
		}
		fresh := make([][]byte, 1<<14)
		for i := range fresh {
			fresh[i] = text()
		}
		b.Run(fmt.Sprintf("insert/%d", n), func(b *testing.B) {
			i := 0
			for b.Loop() {
				tr.Insert(fresh[i%len(fresh)], "w0")
				i++
			}
		})
		b.Run(fmt.Sprintf("match/%d", n), func(b *testing.B) {
			i := 0
			for b.Loop() {
				tr.MatchInsert(texts[i%len(texts)], func(Match) string { return "" })
				i++
			}
		})
	}
}
