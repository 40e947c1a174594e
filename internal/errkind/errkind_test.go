package errkind_test

import (
	"errors"
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/moex-project/moex/internal/errkind"
)

func TestErrorf(t *testing.T) {
	kind := errors.New("the class")
	other := errors.New("another class")
	err := errkind.Errorf(kind, "pkg: tensor %q: %w", "w", io.ErrUnexpectedEOF)
	require.EqualError(t, err, `pkg: tensor "w": unexpected EOF`, "the message is the format's, the class is not added")
	require.ErrorIs(t, err, kind)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF, "what the format wraps stays reachable")
	require.NotErrorIs(t, err, other)
	wrapped := errkind.Errorf(other, "outer: %w", err)
	require.ErrorIs(t, wrapped, kind)
	require.ErrorIs(t, wrapped, other)
}
