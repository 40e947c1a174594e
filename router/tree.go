// Package router is a cache-aware request router in front of several
// serving workers (SGLang's router): it keeps an approximate copy of every
// worker's prefix cache — a radix tree over the bytes of the requests it
// sent each worker — and sends a request where its prefix is cached unless
// the loads are too uneven; it proxies SGLang's and OpenAI's APIs, counts
// each worker's requests in flight, checks workers' health, retries
// requests whose response has not started, and breaks the circuit to a
// failing worker.
package router

import (
	"container/heap"
	"slices"
	"sync"
	"time"
)

// Tree is one radix tree over request text (bytes, so that a character's
// bytes may be split between nodes without harm) shared by every worker:
// each node knows which workers (tenants) hold its prefix and when each
// last used it. Its memory is bounded by one budget of bytes for the whole
// tree, enforced by evicting least recently used leaves, reactively when
// an insert crosses the budget and by Evict. Safe for concurrent use.
type Tree struct {
	mu     sync.Mutex
	root   *tnode
	bytes  int // bytes of every node's edge label
	nodes  int
	budget int
	now    func() time.Time
}

type tnode struct {
	label    []byte // the edge from the parent (the root's empty)
	parent   *tnode
	children map[byte]*tnode
	tenants  []tenant // the workers holding it (a few: a slice beats a map)
	last     int64    // the latest of tenants' times
}

// tenant is a worker holding a node, and its last use in unix nanoseconds.
type tenant struct {
	w  string
	ts int64
}

// mark records worker w's use of x at now.
func (x *tnode) mark(w string, now int64) {
	x.last = now
	for i := range x.tenants {
		if x.tenants[i].w == w {
			x.tenants[i].ts = now
			return
		}
	}
	x.tenants = append(x.tenants, tenant{w, now})
}

// holds is whether worker w holds x.
func (x *tnode) holds(w string) bool {
	for _, t := range x.tenants {
		if t.w == w {
			return true
		}
	}
	return false
}

// NewTree makes a tree bounded by budget bytes of edge labels.
func NewTree(budget int) *Tree {
	return &Tree{root: newTNode(nil, nil), budget: max(budget, 1), now: time.Now}
}

func newTNode(label []byte, parent *tnode) *tnode {
	return &tnode{label: label, parent: parent}
}

// setChild links c under x by its first byte.
func (x *tnode) setChild(c *tnode) {
	if x.children == nil {
		x.children = make(map[byte]*tnode, 2)
	}
	x.children[c.label[0]] = c
}

// Match is what a descent found for a text: how many of its bytes are
// cached somewhere, and the workers holding that longest prefix.
type Match struct {
	Bytes   int      // matched bytes
	Rate    float64  // Bytes / len(text) (0 for an empty text)
	Holders []string // the workers holding the longest matched prefix
}

// common is the length of the common prefix of a and b.
func common(a, b []byte) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// MatchInsert matches text and, in the same descent and lock, inserts it
// for the worker choose picks from the match ("" inserts nothing). It
// returns the match and the worker chosen.
func (t *Tree) MatchInsert(text []byte, choose func(Match) string) (Match, string) {
	return t.matchInsert(text, choose, "")
}

// matchInsert is MatchInsert; with choose nil it inserts for w and leaves
// the match's holders out.
func (t *Tree) matchInsert(text []byte, choose func(Match) string, w string) (Match, string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	// Match: the path of whole nodes matched, and a partial one at the end.
	var path []*tnode
	x, n := t.root, 0
	var partial *tnode // the child whose label the match ends inside
	for n < len(text) {
		c := x.children[text[n]]
		if c == nil {
			break
		}
		k := common(c.label, text[n:])
		n += k
		if k < len(c.label) {
			partial = c
			break
		}
		path = append(path, c)
		x = c
	}
	m := Match{Bytes: n}
	if len(text) > 0 {
		m.Rate = float64(n) / float64(len(text))
	}
	holder := x
	if partial != nil {
		holder = partial
	}
	if holder != t.root && choose != nil {
		m.Holders = make([]string, 0, len(holder.tenants))
		for _, t := range holder.tenants {
			m.Holders = append(m.Holders, t.w)
		}
	}
	if choose != nil {
		w = choose(m)
	}
	if w == "" {
		return m, ""
	}
	t.insertLocked(text, w, path, partial, n)
	if t.bytes > t.budget {
		t.evictLocked(t.budget - t.budget/10)
	}
	return m, w
}

// Insert adds text for worker w.
func (t *Tree) Insert(text []byte, w string) {
	t.matchInsert(text, nil, w)
}

// insertLocked marks text for w, given the descent's path of whole nodes,
// the node the match ended inside (or nil) and the bytes matched.
func (t *Tree) insertLocked(text []byte, w string, path []*tnode, partial *tnode, n int) {
	now := t.now().UnixNano()
	mark := func(x *tnode) { x.mark(w, now) }
	for _, x := range path {
		mark(x)
	}
	x := t.root
	if len(path) > 0 {
		x = path[len(path)-1]
	}
	if partial != nil {
		// Split partial where the match ended: the matched part becomes a
		// node of its own, holding partial's tenants and now w.
		k := n
		for _, p := range path {
			k -= len(p.label)
		}
		// Copies, not views: a view would keep the whole old label alive
		// after its other part is evicted, past the budget's count.
		up := newTNode(slices.Clone(partial.label[:k]), x)
		up.tenants = slices.Clone(partial.tenants)
		up.last = partial.last
		x.setChild(up)
		partial.label = slices.Clone(partial.label[k:])
		partial.parent = up
		up.setChild(partial)
		t.nodes++
		mark(up)
		x = up
	}
	if n < len(text) {
		leaf := newTNode(append([]byte(nil), text[n:]...), x)
		x.setChild(leaf)
		t.bytes += len(leaf.label)
		t.nodes++
		mark(leaf)
	}
}

// Evict removes least recently used leaves until the tree holds at most
// budget bytes (the reactive eviction goes down to 90 % of it); the
// router calls it periodically.
func (t *Tree) Evict() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.bytes > t.budget {
		t.evictLocked(t.budget)
	}
}

// evictLocked removes leaves, oldest last use first, until at most target
// bytes remain.
func (t *Tree) evictLocked(target int) {
	var h leafHeap
	var walk func(x *tnode)
	walk = func(x *tnode) {
		for _, c := range x.children {
			walk(c)
		}
		if x != t.root && len(x.children) == 0 {
			h = append(h, x)
		}
	}
	walk(t.root)
	heap.Init(&h)
	for t.bytes > target && h.Len() > 0 {
		x := heap.Pop(&h).(*tnode)
		up := x.parent
		t.removeLocked(x)
		if up != t.root && len(up.children) == 0 {
			heap.Push(&h, up)
		}
	}
}

// removeLocked takes leaf x out of the tree.
func (t *Tree) removeLocked(x *tnode) {
	delete(x.parent.children, x.label[0])
	t.bytes -= len(x.label)
	t.nodes--
}

// RemoveWorker removes worker w's marks, and the nodes no worker holds
// then.
func (t *Tree) RemoveWorker(w string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var walk func(x *tnode)
	walk = func(x *tnode) {
		for _, c := range x.children {
			walk(c)
		}
		if x == t.root {
			return
		}
		x.tenants = slices.DeleteFunc(x.tenants, func(t tenant) bool { return t.w == w })
		if len(x.tenants) == 0 && len(x.children) == 0 {
			t.removeLocked(x)
		}
	}
	walk(t.root)
}

// Size is the bytes of the tree's edge labels and its nodes (the root
// not counted).
func (t *Tree) Size() (bytes, nodes int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.bytes, t.nodes
}

// WorkerBytes is the bytes of the prefixes worker w holds (the sum of the
// labels of the nodes marked for it).
func (t *Tree) WorkerBytes(w string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	total := 0
	var walk func(x *tnode)
	walk = func(x *tnode) {
		if x.holds(w) {
			total += len(x.label)
		}
		for _, c := range x.children {
			walk(c)
		}
	}
	walk(t.root)
	return total
}

// leafHeap orders leaves by their last use, oldest first.
type leafHeap []*tnode

func (h leafHeap) Len() int           { return len(h) }
func (h leafHeap) Less(i, j int) bool { return h[i].last < h[j].last }
func (h leafHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *leafHeap) Push(x any)        { *h = append(*h, x.(*tnode)) }
func (h *leafHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
