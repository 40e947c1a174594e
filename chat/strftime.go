package chat

import (
	"strconv"
	"strings"
	"time"
)

// strftime formats t as Python's datetime.strftime does on Linux for a
// naive datetime (transformers' strftime_now formats datetime.now()):
// glibc's conversions in the C locale, its flags (- _ 0 ^ #) and widths, %f
// for microseconds, and %z and %Z empty. A conversion glibc does not know is
// copied as written.
func strftime(t time.Time, format string) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i+1 >= len(format) {
			b.WriteByte(c)
			continue
		}
		start := i
		i++
		var pad byte // 0: the conversion's own
		upper, swap := false, false
		for ; i < len(format) && strings.IndexByte("-_0^#", format[i]) >= 0; i++ {
			switch format[i] {
			case '-', '_', '0':
				pad = format[i]
			case '^':
				upper = true
			case '#':
				swap = true
			}
		}
		width := -1
		if i < len(format) && format[i] >= '1' && format[i] <= '9' {
			w := 0
			for ; i < len(format) && format[i] >= '0' && format[i] <= '9'; i++ {
				w = min(w*10+int(format[i]-'0'), 1024)
			}
			width = w
		}
		if i < len(format) && (format[i] == 'E' || format[i] == 'O') {
			i++
		}
		if i >= len(format) {
			b.WriteString(format[start:])
			break
		}
		text, isNum, numWidth, numPad, ok := conversion(t, format[i])
		if !ok {
			b.WriteString(format[start : i+1])
			continue
		}
		if isNum {
			text = padNumber(text, pad, width, numWidth, numPad)
		} else {
			switch {
			case swap && format[i] == 'p':
				text = strings.ToLower(text)
			case upper || swap:
				text = strings.ToUpper(text)
			}
			if width > len(text) {
				fill := " "
				if pad == '0' {
					fill = "0"
				}
				text = strings.Repeat(fill, width-len(text)) + text
			}
		}
		b.WriteString(text)
	}
	return b.String()
}

// conversion is the text of one %c: for numbers, the digits with their
// default width and padding.
func conversion(t time.Time, c byte) (text string, isNum bool, width int, pad byte, ok bool) {
	num := func(n, w int, p byte) (string, bool, int, byte, bool) {
		return strconv.Itoa(n), true, w, p, true
	}
	str := func(s string) (string, bool, int, byte, bool) { return s, false, 0, 0, true }
	hour12 := t.Hour() % 12
	if hour12 == 0 {
		hour12 = 12
	}
	isoYear, isoWeek := t.ISOWeek()
	yday := t.YearDay() - 1
	wday := int(t.Weekday())
	switch c {
	case 'a':
		return str(t.Weekday().String()[:3])
	case 'A':
		return str(t.Weekday().String())
	case 'b', 'h':
		return str(t.Month().String()[:3])
	case 'B':
		return str(t.Month().String())
	case 'c':
		return str(strftime(t, "%a %b %e %H:%M:%S %Y"))
	case 'C':
		return num(t.Year()/100, 2, '0')
	case 'd':
		return num(t.Day(), 2, '0')
	case 'D', 'x':
		return str(strftime(t, "%m/%d/%y"))
	case 'e':
		return num(t.Day(), 2, '_')
	case 'f':
		return str(strconv.Itoa(t.Nanosecond()/1000 + 1000000)[1:])
	case 'F':
		return str(strftime(t, "%Y-%m-%d"))
	case 'g':
		return num(isoYear%100, 2, '0')
	case 'G':
		return num(isoYear, 1, '0')
	case 'H':
		return num(t.Hour(), 2, '0')
	case 'I':
		return num(hour12, 2, '0')
	case 'j':
		return num(yday+1, 3, '0')
	case 'k':
		return num(t.Hour(), 2, '_')
	case 'l':
		return num(hour12, 2, '_')
	case 'm':
		return num(int(t.Month()), 2, '0')
	case 'M':
		return num(t.Minute(), 2, '0')
	case 'n':
		return str("\n")
	case 'p':
		if t.Hour() < 12 {
			return str("AM")
		}
		return str("PM")
	case 'P':
		if t.Hour() < 12 {
			return str("am")
		}
		return str("pm")
	case 'r':
		return str(strftime(t, "%I:%M:%S %p"))
	case 'R':
		return str(strftime(t, "%H:%M"))
	case 's':
		return num(int(t.Unix()), 1, '0')
	case 'S':
		return num(t.Second(), 2, '0')
	case 't':
		return str("\t")
	case 'T', 'X':
		return str(strftime(t, "%H:%M:%S"))
	case 'u':
		return num((wday+6)%7+1, 1, '0')
	case 'U':
		return num((yday+7-wday)/7, 2, '0')
	case 'V':
		return num(isoWeek, 2, '0')
	case 'w':
		return num(wday, 1, '0')
	case 'W':
		return num((yday+7-(wday+6)%7)/7, 2, '0')
	case 'y':
		return num(t.Year()%100, 2, '0')
	case 'Y':
		return num(t.Year(), 1, '0')
	case 'z', 'Z':
		return str("")
	case '%':
		return str("%")
	}
	return "", false, 0, 0, false
}

// padNumber pads digits to the width a flag or the conversion asks.
func padNumber(digits string, flag byte, width, defWidth int, defPad byte) string {
	if flag == '-' {
		return digits
	}
	pad := defPad
	if flag != 0 {
		pad = flag
	}
	if width < 0 {
		width = defWidth
	}
	if len(digits) >= width {
		return digits
	}
	fill := "0"
	if pad == '_' {
		fill = " "
	}
	return strings.Repeat(fill, width-len(digits)) + digits
}
