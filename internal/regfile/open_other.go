//go:build !unix

package regfile

import (
	"fmt"
	"os"
)

// openNoBlock checks the path before opening it where O_NONBLOCK is not
// available.
func openNoBlock(path string) (*os.File, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is %s, not a regular file", path, kind(st.Mode()))
	}
	return os.Open(path)
}
