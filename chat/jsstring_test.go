package chat_test

import (
	"errors"
	"strconv"
	"strings"
)

// jsString decodes the JavaScript string literal at the start of s.
func jsString(s string) (string, error) {
	if s == "" || s[0] != '"' && s[0] != '\'' && s[0] != '`' {
		return "", errors.New("no string literal")
	}
	quote := s[0]
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		c := s[i]
		switch {
		case c == quote:
			return b.String(), nil
		case c != '\\':
			b.WriteByte(c)
			continue
		}
		i++
		if i >= len(s) {
			break
		}
		switch e := s[i]; e {
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'v':
			b.WriteByte('\v')
		case '0':
			b.WriteByte(0)
		case 'x', 'u':
			size := 2
			if e == 'u' {
				size = 4
			}
			hex := ""
			if e == 'u' && i+1 < len(s) && s[i+1] == '{' {
				end := strings.IndexByte(s[i:], '}')
				if end < 0 {
					return "", errors.New("bad \\u{} escape")
				}
				hex, i = s[i+2:i+end], i+end
			} else {
				if i+size >= len(s) {
					return "", errors.New("truncated escape")
				}
				hex, i = s[i+1:i+1+size], i+size
			}
			n, err := strconv.ParseUint(hex, 16, 32)
			if err != nil {
				return "", err
			}
			b.WriteRune(rune(n))
		default: // \' \" \\ \/ \`
			b.WriteByte(e)
		}
	}
	return "", errors.New("unterminated string literal")
}
