package tokenizer

import (
	"fmt"
	"slices"
	"strings"
)

// GGUFVocab is the tokenizer a GGUF file carries in its tokenizer.ggml.*
// keys (ReadGGUFVocab reads them). A GGUF file means what llama.cpp
// computes from it: FromGGUF follows llama.cpp's tokenizer on it, which for
// a file converted from a Hugging Face model gives that model's ids.
type GGUFVocab struct {
	Model      string    // tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SentencePiece)
	Pre        string    // tokenizer.ggml.pre: the pre-tokenizer of a gpt2 vocabulary
	Tokens     []string  // tokenizer.ggml.tokens, by id
	TokenTypes []int32   // tokenizer.ggml.token_type (nil: every token normal)
	Scores     []float32 // tokenizer.ggml.scores (llama)
	Merges     []string  // tokenizer.ggml.merges, "a b" (gpt2)
	// BOS, EOS, UNK, PAD: tokenizer.ggml.bos_token_id and the others; nil
	// when the file has no key (llama.cpp's default for the model applies).
	BOS, EOS, UNK, PAD *int32
	AddBOS, AddEOS     *bool  // tokenizer.ggml.add_bos_token, add_eos_token
	AddSpacePrefix     *bool  // tokenizer.ggml.add_space_prefix (llama)
	ChatTemplate       string // tokenizer.chat_template
}

// The token types of tokenizer.ggml.token_type.
const (
	ggufNormal      = 1
	ggufUnknown     = 2
	ggufControl     = 3
	ggufUserDefined = 4
	ggufUnused      = 5
	ggufByte        = 6
)

// ReadGGUFVocab reads a GGUF file's tokenizer keys from its metadata, as
// Go values: strings, bools, integers, float32s and their slices ([]any
// or typed). A key of the wrong type is an ErrFormat error naming it.
func ReadGGUFVocab(meta map[string]any) (GGUFVocab, error) {
	var v GGUFVocab
	var err error
	str := func(key string, dst *string) {
		if x, ok := meta[key]; ok && err == nil {
			if *dst, ok = x.(string); !ok {
				err = formatErr("gguf: %s is a %T, not a string", key, x)
			}
		}
	}
	str("tokenizer.ggml.model", &v.Model)
	str("tokenizer.ggml.pre", &v.Pre)
	str("tokenizer.chat_template", &v.ChatTemplate)
	if err != nil {
		return v, err
	}
	if v.Tokens, err = stringList(meta, "tokenizer.ggml.tokens"); err != nil {
		return v, err
	}
	if v.Merges, err = stringList(meta, "tokenizer.ggml.merges"); err != nil {
		return v, err
	}
	if x, ok := meta["tokenizer.ggml.token_type"]; ok {
		list, lerr := numberList(x, "tokenizer.ggml.token_type")
		if lerr != nil {
			return v, lerr
		}
		for _, f := range list {
			v.TokenTypes = append(v.TokenTypes, int32(f))
		}
	}
	if x, ok := meta["tokenizer.ggml.scores"]; ok {
		list, lerr := numberList(x, "tokenizer.ggml.scores")
		if lerr != nil {
			return v, lerr
		}
		for _, f := range list {
			v.Scores = append(v.Scores, float32(f))
		}
	}
	for key, dst := range map[string]**int32{"tokenizer.ggml.bos_token_id": &v.BOS, "tokenizer.ggml.eos_token_id": &v.EOS,
		"tokenizer.ggml.unknown_token_id": &v.UNK, "tokenizer.ggml.padding_token_id": &v.PAD} {
		if x, ok := meta[key]; ok {
			n, ok := asNumber(x)
			if !ok || n != float64(int32(n)) {
				return v, formatErr("gguf: %s is %v, not an id", key, x)
			}
			id := int32(n)
			*dst = &id
		}
	}
	for key, dst := range map[string]**bool{"tokenizer.ggml.add_bos_token": &v.AddBOS, "tokenizer.ggml.add_eos_token": &v.AddEOS,
		"tokenizer.ggml.add_space_prefix": &v.AddSpacePrefix} {
		if x, ok := meta[key]; ok {
			b, ok := x.(bool)
			if !ok {
				return v, formatErr("gguf: %s is a %T, not a bool", key, x)
			}
			*dst = &b
		}
	}
	return v, nil
}

func stringList(meta map[string]any, key string) ([]string, error) {
	x, ok := meta[key]
	if !ok {
		return nil, nil
	}
	switch l := x.(type) {
	case []string:
		return l, nil
	case []any:
		out := make([]string, len(l))
		for i, e := range l {
			s, ok := e.(string)
			if !ok {
				return nil, formatErr("gguf: %s[%d] is a %T, not a string", key, i, e)
			}
			out[i] = s
		}
		return out, nil
	}
	return nil, formatErr("gguf: %s is a %T, not a list of strings", key, x)
}

func numberList(x any, key string) ([]float64, error) {
	switch l := x.(type) {
	case []int32:
		out := make([]float64, len(l))
		for i, e := range l {
			out[i] = float64(e)
		}
		return out, nil
	case []float32:
		out := make([]float64, len(l))
		for i, e := range l {
			out[i] = float64(e)
		}
		return out, nil
	case []any:
		out := make([]float64, len(l))
		for i, e := range l {
			f, ok := asNumber(e)
			if !ok {
				return nil, formatErr("gguf: %s[%d] is a %T, not a number", key, i, e)
			}
			out[i] = f
		}
		return out, nil
	}
	return nil, formatErr("gguf: %s is a %T, not a list of numbers", key, x)
}

func asNumber(x any) (float64, bool) {
	switch n := x.(type) {
	case int:
		return float64(n), true
	case int8:
		return float64(n), true
	case int16:
		return float64(n), true
	case int32:
		return float64(n), true
	case int64:
		return float64(n), true
	case uint8:
		return float64(n), true
	case uint16:
		return float64(n), true
	case uint32:
		return float64(n), true
	case uint64:
		return float64(n), true
	case float32:
		return float64(n), true
	case float64:
		return n, true
	}
	return 0, false
}

// ggufPre maps tokenizer.ggml.pre to the word patterns llama.cpp splits on
// (each a Split, isolated, in turn), for the pre-tokenizers of the MoE
// families' vocabularies; ignoreMerges and addBOS are llama.cpp's defaults
// for them. The patterns are the models' own tokenizer.json patterns.
var ggufPre = map[string]struct {
	patterns     []string
	ignoreMerges bool
	addBOS       bool
}{
	"gpt-2":       {patterns: []string{gpt2Pattern}},
	"olmo":        {patterns: []string{gpt2Pattern}},
	"qwen2":       {patterns: []string{qwen2Pattern}},
	"deepseek-v3": {patterns: deepseekV3Patterns},
	"gpt-4o":      {patterns: []string{o200kPattern}},
	"llama-bpe":   {patterns: []string{llama3Pattern}, ignoreMerges: true, addBOS: true},
	"llama3":      {patterns: []string{llama3Pattern}, ignoreMerges: true, addBOS: true},
	"glm4":        {patterns: []string{llama3Pattern}},
	"chatglm-bpe": {patterns: []string{llama3Pattern}},
}

func init() {
	ggufPre["deepseek-r1-qwen"] = ggufPre["qwen2"]
	ggufPre["llama-v3"] = ggufPre["llama3"]
	ggufPre["llama4"] = ggufPre["gpt-4o"]
}

// The word patterns of the byte-level vocabularies (their tokenizer.json
// pre-tokenizers).
const (
	qwen2Pattern  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	o200kPattern  = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

var deepseekV3Patterns = []string{
	`\p{N}{1,3}`,
	`[一-龥぀-ゟ゠-ヿ]+`,
	`[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_` + "`" + `{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
}

// FromGGUF builds the tokenizer of a GGUF file's vocabulary.
func FromGGUF(v GGUFVocab) (*Tokenizer, error) {
	n := len(v.Tokens)
	switch {
	case n == 0:
		return nil, formatErr("gguf: tokenizer.ggml.tokens is missing or empty")
	case v.TokenTypes != nil && len(v.TokenTypes) != n:
		return nil, formatErr("gguf: tokenizer.ggml.token_type has %d entries for %d tokens", len(v.TokenTypes), n)
	case v.Scores != nil && len(v.Scores) != n:
		return nil, formatErr("gguf: tokenizer.ggml.scores has %d entries for %d tokens", len(v.Scores), n)
	}
	t := &Tokenizer{bos: -1, eos: -1, class: "gguf:" + v.Model, specials: map[string]string{}, vocab: make(map[string]int32, n)}
	var added []addedToken
	names := make([]string, n)
	for i, tok := range v.Tokens {
		typ := int32(ggufNormal)
		if v.TokenTypes != nil {
			typ = v.TokenTypes[i]
		}
		if tok == "" {
			tok = fmt.Sprintf("[EMPTY_%d]", i) // as llama.cpp names them
		}
		names[i] = tok
		t.vocab[tok] = int32(i) // a repeated token: the last id, as llama.cpp's map
		switch typ {
		case ggufControl, ggufUserDefined, ggufUnknown:
			// Matched in the text before the model runs (llama.cpp's
			// special-token partition); control tokens are special.
			added = append(added, addedToken{id: int32(i), content: tok, special: typ != ggufUserDefined})
		}
	}
	if err := t.index(added, names); err != nil {
		return nil, err
	}
	id := func(p *int32, def int32, key string) (int32, error) {
		if p == nil {
			if def >= int32(n) {
				def = -1 // llama.cpp's default id, past this vocabulary
			}
			return def, nil
		}
		if *p < 0 || int(*p) >= n {
			return -1, formatErr("gguf: %s %d is outside the vocabulary of %d tokens", key, *p, n)
		}
		return *p, nil
	}
	var addBOS, addEOS bool
	var err error
	switch v.Model {
	case "gpt2":
		pre, ok := ggufPre[v.Pre]
		if !ok {
			return nil, unsupported("gguf: the pre-tokenizer %q (tokenizer.ggml.pre; this package reads %s)", v.Pre, strings.Join(ggufPreNames(), ", "))
		}
		merges := make([][2]string, len(v.Merges))
		for i, m := range v.Merges {
			k := strings.IndexByte(m[min(1, len(m)):], ' ')
			if k < 0 {
				return nil, formatErr("gguf: tokenizer.ggml.merges[%d] %q is not two tokens separated by a space", i, m)
			}
			k += min(1, len(m))
			merges[i] = [2]string{m[:k], m[k+1:]}
		}
		if t.model, err = newBPE(t.vocab, merges, "", false, false, pre.ignoreMerges, "", ""); err != nil {
			return nil, fmt.Errorf("%w (gguf)", err)
		}
		var q preSequence
		for _, p := range pre.patterns {
			q = append(q, split{pat: pattern{re: mustRegex(p)}, b: isolated})
		}
		t.pre = append(q, byteLevel{})
		t.dec = byteLevelDecoder{}
		if t.bos, err = id(v.BOS, 11, "tokenizer.ggml.bos_token_id"); err != nil {
			return nil, err
		}
		if t.eos, err = id(v.EOS, 11, "tokenizer.ggml.eos_token_id"); err != nil {
			return nil, err
		}
		addBOS = pre.addBOS
	case "llama":
		if v.Scores == nil {
			return nil, formatErr("gguf: a llama (SentencePiece) vocabulary needs tokenizer.ggml.scores")
		}
		m := &spm{vocab: t.vocab, scores: v.Scores, unk: -1}
		for b := range 256 {
			m.byteIDs[b] = -1
			if id, ok := t.vocab[fmt.Sprintf("<0x%02X>", b)]; ok {
				m.byteIDs[b] = id
			}
		}
		if m.unk, err = id(v.UNK, 0, "tokenizer.ggml.unknown_token_id"); err != nil {
			return nil, err
		}
		t.model = m
		prefix := v.AddSpacePrefix == nil || *v.AddSpacePrefix
		t.norm = replace{pattern{lit: " "}, "▁"}
		if prefix {
			t.norm = normSequence{prepend{"▁"}, replace{pattern{lit: " "}, "▁"}}
		}
		t.dec = decSequence{replaceDecoder{replace{pattern{lit: "▁"}, " "}}, byteFallback{}, fuse{}}
		if prefix {
			t.dec = append(t.dec.(decSequence), stripDecoder{content: ' ', start: 1})
		}
		t.byteRuns = true
		if t.bos, err = id(v.BOS, 1, "tokenizer.ggml.bos_token_id"); err != nil {
			return nil, err
		}
		if t.eos, err = id(v.EOS, 2, "tokenizer.ggml.eos_token_id"); err != nil {
			return nil, err
		}
		addBOS = true
	default:
		return nil, unsupported("gguf: the tokenizer model %q (tokenizer.ggml.model; this package reads gpt2 and llama)", v.Model)
	}
	if v.AddBOS != nil {
		addBOS = *v.AddBOS
	}
	if v.AddEOS != nil {
		addEOS = *v.AddEOS
	}
	var tp template
	if addBOS {
		if t.bos < 0 {
			return nil, formatErr("gguf: the vocabulary adds a BOS but has none (tokenizer.ggml.bos_token_id)")
		}
		tp.before = []int32{t.bos}
	}
	if addEOS {
		if t.eos < 0 {
			return nil, formatErr("gguf: the vocabulary adds an EOS but has none (tokenizer.ggml.eos_token_id)")
		}
		tp.after = []int32{t.eos}
	}
	t.post = tp
	if t.bos >= 0 {
		t.specials["bos_token"] = t.tokens[t.bos]
	}
	if t.eos >= 0 {
		t.specials["eos_token"] = t.tokens[t.eos]
	}
	if v.UNK != nil {
		if u, err := id(v.UNK, -1, "tokenizer.ggml.unknown_token_id"); err != nil {
			return nil, err
		} else {
			t.specials["unk_token"] = t.tokens[u]
		}
	}
	if p, err := id(v.PAD, -1, "tokenizer.ggml.padding_token_id"); err != nil {
		return nil, err
	} else if p >= 0 {
		t.specials["pad_token"] = t.tokens[p]
	}
	return t, nil
}

func ggufPreNames() []string {
	names := make([]string, 0, len(ggufPre))
	for k := range ggufPre {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}
