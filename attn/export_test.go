package attn

// WidenOnly makes the attentions widen their caches where they could read
// them in place, until restore is called.
func WidenOnly() (restore func()) {
	widenOnly.Store(true)
	return func() { widenOnly.Store(false) }
}
