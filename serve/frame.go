package serve

import (
	"strconv"
	"unicode/utf8"
)

// appendFrame appends one streamed /generate frame, "data: {…}\n\n": the
// JSON encoding/json writes for generated{Text, OutputIDs, Meta: {ID,
// PromptTokens, CompletionTokens}}, built without reflection or
// allocation. It runs once a token a stream, where encoding/json's
// reflection and garbage were a third of the server's CPU.
func appendFrame(b []byte, text string, ids []int32, rid string, prompt int) []byte {
	b = append(b, `data: {"text":`...)
	b = appendJSONString(b, text)
	b = append(b, `,"output_ids":[`...)
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(id), 10)
	}
	b = append(b, `],"meta_info":{"id":`...)
	b = appendJSONString(b, rid)
	b = append(b, `,"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(prompt), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(len(ids)), 10)
	return append(b, "}}\n\n"...)
}

// appendJSONString appends s as a JSON string (RFC 8259): '"' and '\'
// escaped, control characters as \n, \r, \t, \b, \f or \u00XX, U+2028 and U+2029
// escaped as encoding/json does, and each byte that is not valid UTF-8
// replaced by U+FFFD, as encoding/json does.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
		default:
			i += n
			continue
		}
		i += n
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
