//go:build !linux

package hugepage

// Advise does nothing where transparent huge pages are not known.
func Advise([]byte) {}
