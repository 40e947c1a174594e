package tokenizer

import "unicode/utf8"

// GPT-2's byte-level alphabet: every byte is a printable character, the
// printable Latin-1 bytes themselves and the others U+0100 onwards in byte
// order (bytes_to_unicode).
var (
	byteChar [256]rune
	byteStr  [256]string
	charByte = map[rune]byte{}
)

func init() {
	n := 0
	for b := range 256 {
		if b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE && b <= 0xFF {
			byteChar[b] = rune(b)
		} else {
			byteChar[b] = rune(256 + n)
			n++
		}
		byteStr[b] = string(byteChar[b])
		charByte[byteChar[b]] = byte(b)
	}
}

// ByteLevelChar is byte b's character in GPT-2's byte-level alphabet
// (bytes_to_unicode), the token a byte-level vocabulary holds for it.
func ByteLevelChar(b byte) string { return byteStr[b] }

// byteLevelString maps every byte of s to its character.
func byteLevelString(s string) string {
	buf := make([]byte, 0, 2*len(s))
	for i := 0; i < len(s); i++ {
		buf = append(buf, byteStr[s[i]]...)
	}
	return string(buf)
}

// byteLevelBytes maps token's characters back to bytes; ok is false when a
// character is outside the alphabet (an added token such as DeepSeek's
// <｜begin▁of▁sentence｜>, whose bytes are then taken as they are).
func byteLevelBytes(token string, buf []byte) ([]byte, bool) {
	n := len(buf)
	for _, r := range token {
		b, ok := charByte[r]
		if !ok {
			return buf[:n], false
		}
		buf = append(buf, b)
	}
	return buf, true
}

// appendLossy appends to dst the text of b with every maximal invalid UTF-8
// subsequence replaced by one U+FFFD, as Rust's String::from_utf8_lossy
// (and Python's errors="replace") do: a truncated sequence is one
// replacement, a stray continuation byte one each.
func appendLossy(dst []byte, b []byte) []byte {
	for i := 0; i < len(b); {
		c := b[i]
		if c < utf8.RuneSelf {
			dst = append(dst, c)
			i++
			continue
		}
		if r, size := utf8.DecodeRune(b[i:]); r != utf8.RuneError || size > 1 {
			dst = append(dst, b[i:i+size]...)
			i += size
			continue
		}
		// Invalid at i: skip the longest prefix that could start a valid
		// sequence (the maximal subpart), then write one replacement.
		i += maximalSubpart(b[i:])
		dst = append(dst, "\uFFFD"...)
	}
	return dst
}

// maximalSubpart is the length (≥ 1) of the longest prefix of b, which
// does not hold a valid character at its start, that is still a prefix of
// some valid UTF-8 sequence.
func maximalSubpart(b []byte) int {
	c := b[0]
	var need int
	lo, hi := byte(0x80), byte(0xBF)
	switch {
	case c >= 0xC2 && c <= 0xDF:
		need = 1
	case c == 0xE0:
		need, lo = 2, 0xA0
	case c >= 0xE1 && c <= 0xEC || c == 0xEE || c == 0xEF:
		need = 2
	case c == 0xED:
		need, hi = 2, 0x9F
	case c == 0xF0:
		need, lo = 3, 0x90
	case c >= 0xF1 && c <= 0xF3:
		need = 3
	case c == 0xF4:
		need, hi = 3, 0x8F
	default:
		return 1
	}
	n := 1
	for k := 0; k < need && n < len(b); k++ {
		x := b[n]
		if x < lo || x > hi {
			break
		}
		lo, hi = 0x80, 0xBF
		n++
	}
	return n
}
