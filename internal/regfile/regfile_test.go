package regfile

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestOpen(t *testing.T) {
	dir := t.TempDir()
	reg := filepath.Join(dir, "config.json")
	require.NoError(t, os.WriteFile(reg, []byte(`{"a": 1}`), 0o644))
	link := filepath.Join(dir, "link.json")
	require.NoError(t, os.Symlink(reg, link)) // as the Hugging Face cache lays files out

	for _, p := range []string{reg, link} {
		data, err := ReadFile(p, 1<<20)
		require.NoError(t, err)
		require.Equal(t, `{"a": 1}`, string(data))
	}
	_, err := ReadFile(reg, 4)
	require.EqualError(t, err, reg+" holds 8 bytes, more than the 4 a file of its kind may")

	fifo := filepath.Join(dir, "model.safetensors")
	require.NoError(t, unix.Mkfifo(fifo, 0o644))
	_, err = Open(fifo) // returns at once: no writer is waited for
	require.EqualError(t, err, fifo+" is a named pipe, not a regular file")
	_, err = ReadFile(dir, 1<<20)
	require.EqualError(t, err, dir+" is a directory, not a regular file")
	_, err = Open("/dev/null")
	require.EqualError(t, err, "/dev/null is a character device, not a regular file")
	_, err = Open(filepath.Join(dir, "missing"))
	require.ErrorIs(t, err, os.ErrNotExist)
}
