// Package buffers holds the one helper moex's packages share for buffers
// they reuse from call to call.
package buffers

// Grow returns (*buf)[:n], reallocating *buf (with a quarter to spare) when
// it holds fewer than n values. The contents are undefined.
func Grow[T any](buf *[]T, n int) []T {
	if cap(*buf) < n {
		*buf = make([]T, n, n+n/4)
	}
	return (*buf)[:n]
}
