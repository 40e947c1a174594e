//go:build unix

package regfile

import (
	"os"
	"syscall"
)

// openNoBlock opens path read-only without waiting for a named pipe's
// writer (O_NONBLOCK, which reads of a regular file ignore).
func openNoBlock(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
}
