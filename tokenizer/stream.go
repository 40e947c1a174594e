package tokenizer

import (
	"fmt"
	"strings"
)

// DecodeStream turns ids into text as they arrive (a generation's tokens),
// handing out only text that later ids cannot change: never half a UTF-8
// character, and with the decoder's context (a leading space stripped from
// the first token, say) as Decode of the whole sequence gives it. The
// concatenation of every Step's text and Flush's equals Decode of all the
// ids. A DecodeStream is for one goroutine.
type DecodeStream struct {
	t           *Tokenizer
	skipSpecial bool
	ids         []int32 // the ids since the window's start
	prefix      string  // Decode of ids[:prefixIndex]... as handed out
	prefixIndex int
}

// NewDecodeStream starts an incremental decoding; skipSpecial leaves the
// special tokens out of the text, as Decode(ids, true).
func (t *Tokenizer) NewDecodeStream(skipSpecial bool) *DecodeStream {
	return &DecodeStream{t: t, skipSpecial: skipSpecial}
}

// Step adds one id and returns the text it completes ("" while a
// character or a decoder's context is still open).
func (s *DecodeStream) Step(id int32) (string, error) {
	s.ids = append(s.ids, id)
	if s.t.unsettled(s.ids, s.skipSpecial) > 0 {
		return "", nil // a byte run a later byte may still turn into U+FFFD
	}
	text, err := s.t.Decode(s.ids, s.skipSpecial)
	if err != nil {
		s.ids = s.ids[:len(s.ids)-1]
		return "", err
	}
	if len(text) <= len(s.prefix) || strings.HasSuffix(text, "\uFFFD") {
		return "", nil
	}
	if !strings.HasPrefix(text, s.prefix) {
		return "", fmt.Errorf("tokenizer: incremental decoding: the text of the window no longer starts with %q", s.prefix)
	}
	out := text[len(s.prefix):]
	// Keep the ids from the previous window's start on: enough context for
	// the decoder, and bounded.
	keep := len(s.ids) - s.prefixIndex
	s.ids = append(s.ids[:0], s.ids[s.prefixIndex:]...)
	if s.prefix, err = s.t.Decode(s.ids, s.skipSpecial); err != nil {
		return "", err
	}
	s.prefixIndex = keep
	return out, nil
}

// unsettled is how many ids at the end of ids may still change the text
// of the ones before them: with a byte-fallback decoder, a trailing run of
// <0xNN> tokens (and the special tokens between them when those are
// skipped), which a later byte can turn wholly into U+FFFD.
func (t *Tokenizer) unsettled(ids []int32, skipSpecial bool) int {
	if !t.byteRuns {
		return 0
	}
	n, bytes := 0, false
	for i := len(ids) - 1; i >= 0; i-- {
		id := ids[i]
		if id < 0 || int(id) >= len(t.tokens) {
			break
		}
		if _, ok := byteToken(t.tokens[id]); ok {
			n, bytes = n+1, true
			continue
		}
		if skipSpecial && t.special[id] {
			n++
			continue
		}
		break
	}
	if !bytes {
		return 0
	}
	return n
}

// Flush returns the text still held back (an unfinished character, as
// U+FFFD) at the end of the stream, and resets the stream.
func (s *DecodeStream) Flush() (string, error) {
	text, err := s.t.Decode(s.ids, s.skipSpecial)
	if err != nil {
		return "", err
	}
	var out string
	if strings.HasPrefix(text, s.prefix) {
		out = text[len(s.prefix):]
	}
	s.ids, s.prefix, s.prefixIndex = s.ids[:0], "", 0
	return out, nil
}
