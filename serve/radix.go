package serve

import (
	"container/heap"
	"errors"
	"fmt"
	"slices"
	"unsafe"

	"github.com/moex-project/moex/model"
)

// prefixCache is RadixAttention's tree over token ids: each node's key is a
// run of tokens, whole cache blocks long, and the node holds those tokens'
// latent rows as shared blocks (model.Blocks) of the caches; a path from
// the root spells a prefix whose rows any request starting with it reuses.
// A finished request leaves its tokens' whole blocks in the tree; nodes that
// no running request uses are evicted least recently used first when the
// caches need blocks. Not safe for concurrent use: the scheduler's lock
// guards it.
type prefixCache struct {
	kv    *model.KV
	bs    int
	root  *node
	clock uint64 // ticks for least-recently-used order
	held  int    // blocks the tree holds (per layer)
}

type node struct {
	key      []int32 // len a multiple of bs (the root's empty)
	blocks   model.Blocks
	parent   *node
	children map[string]*node // by their key's first block (blockKey)
	users    int              // running requests attached through it
	used     uint64           // last match or insert
}

func newPrefixCache(kv *model.KV) *prefixCache {
	return &prefixCache{kv: kv, bs: kv.BlockSize(), root: &node{children: map[string]*node{}}}
}

// blockKey is a map key of a block's tokens: children differ in their
// first block, not only in their first token, since a node holds whole
// blocks.
func (p *prefixCache) blockKey(ids []int32) string {
	return string(unsafe.Slice((*byte)(unsafe.Pointer(&ids[0])), 4*p.bs))
}

// common is the length of the longest common prefix of a and b, whole
// blocks long.
func (p *prefixCache) common(a, b []int32) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n - n%p.bs
}

// split cuts x after its first at tokens (a multiple of bs, inside its key)
// into a new parent holding them and x holding the rest; it returns the
// new parent.
func (p *prefixCache) split(x *node, at int) *node {
	up := &node{key: slices.Clone(x.key[:at]), blocks: x.blocks.Slice(0, at/p.bs), parent: x.parent,
		children: map[string]*node{p.blockKey(x.key[at:]): x}, users: x.users, used: x.used}
	x.parent.children[p.blockKey(x.key)] = up
	x.key, x.blocks, x.parent = slices.Clone(x.key[at:]), x.blocks.Slice(at/p.bs, x.blocks.Len()), up
	return up
}

// match finds the longest cached prefix of ids, at most limit tokens and
// whole blocks, and returns the node where it ends (splitting a node the
// prefix ends inside), its length, and its blocks; its nodes count as used
// now.
func (p *prefixCache) match(ids []int32, limit int) (last *node, n int, blocks []model.Blocks) {
	p.clock++
	x := p.root
	for n+p.bs <= limit {
		c := x.children[p.blockKey(ids[n:])]
		if c == nil {
			break
		}
		k := p.common(c.key, ids[n:limit])
		if k == 0 {
			break
		}
		if k < len(c.key) {
			c = p.split(c, k)
		}
		c.used = p.clock
		blocks = append(blocks, c.blocks)
		n += k
		x = c
	}
	return x, n, blocks
}

// lock adds d to the users of x and the nodes above it: a running request
// attached to the prefix x ends is counted on every node of it (a split
// node's new parent inherits its count), and used nodes are not evicted.
func (p *prefixCache) lock(x *node, d int) {
	for ; x != nil && x != p.root; x = x.parent {
		x.users += d
	}
}

// insert adds the whole blocks of ids, whose rows sequence seq holds in the
// caches, to the tree: the part already there is only marked used, the rest
// becomes a new node holding a share of seq's blocks. It returns the node
// where ids' whole blocks end (the root for none). A running sequence may
// be inserted: it never writes its whole blocks again.
func (p *prefixCache) insert(ids []int32, seq int) (*node, error) {
	ids = ids[:len(ids)-len(ids)%p.bs]
	p.clock++
	x, n := p.root, 0
	for n < len(ids) {
		c := x.children[p.blockKey(ids[n:])]
		k := 0
		if c != nil {
			k = p.common(c.key, ids[n:])
		}
		if k == 0 {
			b, err := p.kv.Share(seq, n/p.bs, len(ids)/p.bs)
			if err != nil {
				return x, err
			}
			leaf := &node{key: append([]int32(nil), ids[n:]...), blocks: b, parent: x, children: map[string]*node{}, used: p.clock}
			x.children[p.blockKey(leaf.key)] = leaf
			p.held += b.Len()
			return leaf, nil
		}
		if k < len(c.key) {
			c = p.split(c, k)
		}
		c.used = p.clock
		n += k
		x = c
	}
	return x, nil
}

// evict removes least recently used leaves that no running request uses
// until want blocks are freed or none is left to remove, and returns the
// blocks freed.
func (p *prefixCache) evict(want int) int {
	if want <= 0 {
		return 0
	}
	var h lruHeap
	var walk func(x *node)
	walk = func(x *node) {
		for _, c := range x.children {
			walk(c)
		}
		if x != p.root && len(x.children) == 0 && x.users == 0 {
			h = append(h, x)
		}
	}
	walk(p.root)
	heap.Init(&h)
	freed := 0
	for freed < want && h.Len() > 0 {
		x := heap.Pop(&h).(*node)
		p.remove(x)
		freed += x.blocks.Len()
		if up := x.parent; up != p.root && len(up.children) == 0 && up.users == 0 {
			heap.Push(&h, up)
		}
	}
	return freed
}

// remove takes leaf x out of the tree and releases its blocks.
func (p *prefixCache) remove(x *node) {
	delete(x.parent.children, p.blockKey(x.key))
	p.kv.Release(x.blocks)
	p.held -= x.blocks.Len()
}

// errInUse is flush's refusal while requests use the tree.
var errInUse = errors.New("serve: requests are using the prefix cache")

// flush empties the tree, releasing every block; it refuses while any node
// is in use.
func (p *prefixCache) flush() error {
	used := 0
	for _, c := range p.root.children {
		used += c.users
	}
	if used > 0 {
		return fmt.Errorf("%w (%d of them)", errInUse, used)
	}
	p.evict(p.held)
	return nil
}

// lruHeap orders nodes by last use, oldest first.
type lruHeap []*node

func (h lruHeap) Len() int           { return len(h) }
func (h lruHeap) Less(i, j int) bool { return h[i].used < h[j].used }
func (h lruHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *lruHeap) Push(x any)        { *h = append(*h, x.(*node)) }
func (h *lruHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
