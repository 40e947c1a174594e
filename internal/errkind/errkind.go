// Package errkind makes errors that belong to a class a caller branches on
// with errors.Is (a package's sentinel), while their message stays exactly
// the words written for them: the sentinel is not added to the text.
package errkind

import "fmt"

// Errorf formats the error as fmt.Errorf does (%w included) and marks it as
// one of kind: errors.Is(err, kind) holds, and so does errors.Is for
// anything the format wraps.
func Errorf(kind error, format string, args ...any) error {
	return &kindError{kind: kind, err: fmt.Errorf(format, args...)}
}

type kindError struct {
	kind, err error
}

func (e *kindError) Error() string   { return e.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }
