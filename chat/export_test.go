package chat

// ArgumentsAsString reports whether t gets tool-call arguments as the JSON string.
func ArgumentsAsString(t *Template) bool { return t.argumentsAsString }

// Specials are t's special-token variables as Go values.
func Specials(t *Template) map[string]any {
	out := make(map[string]any, len(t.vars))
	for k, v := range t.vars {
		if v.IsList() {
			var items []any
			for _, it := range v.AsList().Items {
				items = append(items, pyStr(it))
			}
			out[k] = items
			continue
		}
		out[k] = pyStr(v)
	}
	return out
}
