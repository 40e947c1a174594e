// Package hugepage asks the operating system for transparent huge pages
// behind large, streamed buffers (weights).
package hugepage
