package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"sync"

	"github.com/dlclark/regexp2/v2"
	"golang.org/x/text/unicode/norm"

	"github.com/moex-project/moex/internal/regfile"
)

// Size limits of the files read (the largest tokenizer.json seen, o200k
// with its merges, is 28 MB).
const (
	maxTokenizerJSON = 512 << 20
	maxConfigJSON    = 16 << 20
)

// Load reads a model folder's tokenizer: tokenizer.json, and
// tokenizer_config.json when present.
func Load(dir string) (*Tokenizer, error) {
	tj, err := regfile.ReadFile(filepath.Join(dir, "tokenizer.json"), maxTokenizerJSON)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	cj, err := regfile.ReadFile(filepath.Join(dir, "tokenizer_config.json"), maxConfigJSON)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	t, err := FromJSON(tj, cj)
	if err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, dir)
	}
	return t, nil
}

// FromJSON builds a tokenizer from the bytes of tokenizer.json and of
// tokenizer_config.json (nil when the model has none).
func FromJSON(tokenizerJSON, configJSON []byte) (*Tokenizer, error) {
	var f fileJSON
	if err := strictUnmarshal(tokenizerJSON, &f); err != nil {
		return nil, formatErr("tokenizer.json: %v", err)
	}
	var cfg configFile
	if len(configJSON) > 0 {
		if err := strictUnmarshal(configJSON, &cfg); err != nil {
			return nil, formatErr("tokenizer_config.json: %v", err)
		}
	}
	t := &Tokenizer{bos: -1, eos: -1, class: cfg.TokenizerClass, specials: map[string]string{}}
	m, err := buildModel(f.Model)
	if err != nil {
		return nil, err
	}
	t.model, t.vocab = m, m.vocab
	// The ids the Rust library gives added tokens as it reads them (the
	// file's ids agree for files it wrote): the model's id for a token of
	// its vocabulary, an earlier added token's for a repeat, else the next
	// id past the vocabulary and the tokens added so far.
	added := make([]addedToken, 0, len(f.AddedTokens))
	seen := map[string]int32{}
	next := int32(len(m.vocab))
	for _, a := range f.AddedTokens {
		id, ok := seen[a.Content]
		if !ok {
			if id, ok = m.vocab[a.Content]; !ok {
				id = next
			}
		}
		next = max(next, id+1)
		seen[a.Content] = id
		added = append(added, addedToken{id: id, content: a.Content, special: a.Special, lstrip: a.Lstrip,
			rstrip: a.Rstrip, singleWord: a.SingleWord, normalized: a.Normalized})
	}
	if err := t.index(added, nil); err != nil {
		return nil, err
	}
	if t.norm, err = buildNormalizer(f.Normalizer); err != nil {
		return nil, err
	}
	if t.pre, err = buildPreTokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	if t.post, err = buildPost(f.PostProcessor, t); err != nil {
		return nil, err
	}
	if t.dec, err = buildDecoder(f.Decoder); err != nil {
		return nil, err
	}
	t.byteRuns = hasByteFallback(t.dec)
	for name, raw := range map[string]json.RawMessage{"bos_token": cfg.BOS, "eos_token": cfg.EOS, "unk_token": cfg.UNK, "pad_token": cfg.PAD} {
		s, ok, err := tokenString(raw)
		if err != nil {
			return nil, formatErr("tokenizer_config.json: %s: %v", name, err)
		}
		if ok {
			t.specials[name] = s
		}
	}
	if s, ok := t.specials["bos_token"]; ok {
		if t.bos, ok = t.ID(s); !ok {
			return nil, formatErr("tokenizer_config.json: bos_token %q is not a token", s)
		}
	}
	if s, ok := t.specials["eos_token"]; ok {
		if t.eos, ok = t.ID(s); !ok {
			return nil, formatErr("tokenizer_config.json: eos_token %q is not a token", s)
		}
	}
	if llamaClass(cfg.TokenizerClass) {
		// transformers' LlamaTokenizerFast (and its kin) replaces the file's
		// post-processor with one built from add_bos_token (default true)
		// and add_eos_token (default false).
		addBOS, addEOS := cfg.AddBOS == nil || *cfg.AddBOS, cfg.AddEOS != nil && *cfg.AddEOS
		var tp template
		if addBOS {
			if t.bos < 0 {
				return nil, formatErr("tokenizer_config.json: add_bos_token is set but there is no bos_token")
			}
			tp.before = []int32{t.bos}
		}
		if addEOS {
			if t.eos < 0 {
				return nil, formatErr("tokenizer_config.json: add_eos_token is set but there is no eos_token")
			}
			tp.after = []int32{t.eos}
		}
		t.post = tp
	}
	return t, nil
}

// llamaClass names the transformers classes that rebuild their
// post-processor from add_bos_token and add_eos_token.
func llamaClass(c string) bool {
	switch strings.TrimSuffix(c, "Fast") {
	case "LlamaTokenizer", "CodeLlamaTokenizer", "GemmaTokenizer":
		return true
	}
	return false
}

// tokenString reads a special token of tokenizer_config.json: a string or
// an AddedToken object; null or absent is none.
func tokenString(raw json.RawMessage) (string, bool, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", false, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, true, nil
	}
	var o struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(raw, &o); err != nil || o.Content == nil {
		return "", false, fmt.Errorf("neither a string nor an object with a content")
	}
	return *o.Content, true, nil
}

func strictUnmarshal(b []byte, v any) error {
	if len(bytes.TrimSpace(b)) == 0 {
		return errors.New("empty file")
	}
	return json.Unmarshal(b, v)
}

type fileJSON struct {
	AddedTokens []struct {
		ID         int32  `json:"id"`
		Content    string `json:"content"`
		SingleWord bool   `json:"single_word"`
		Lstrip     bool   `json:"lstrip"`
		Rstrip     bool   `json:"rstrip"`
		Normalized bool   `json:"normalized"`
		Special    bool   `json:"special"`
	} `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         json.RawMessage `json:"model"`
}

type configFile struct {
	TokenizerClass string          `json:"tokenizer_class"`
	AddBOS         *bool           `json:"add_bos_token"`
	AddEOS         *bool           `json:"add_eos_token"`
	BOS            json.RawMessage `json:"bos_token"`
	EOS            json.RawMessage `json:"eos_token"`
	UNK            json.RawMessage `json:"unk_token"`
	PAD            json.RawMessage `json:"pad_token"`
}

// component is the shape every normalizer, pre-tokenizer, post-processor
// and decoder shares: a type and its settings.
type component struct {
	Type string `json:"type"`

	// Sequences.
	Normalizers   []json.RawMessage `json:"normalizers"`
	PreTokenizers []json.RawMessage `json:"pretokenizers"`
	Processors    []json.RawMessage `json:"processors"`
	Decoders      []json.RawMessage `json:"decoders"`

	// Split, Replace.
	Pattern  *patternJSON `json:"pattern"`
	Behavior string       `json:"behavior"`
	Invert   bool         `json:"invert"`
	Content  json.RawMessage

	// Prepend.
	Prepend string `json:"prepend"`
	// Strip (normalizer).
	StripLeft  *bool `json:"strip_left"`
	StripRight *bool `json:"strip_right"`
	// Strip (decoder).
	Start int `json:"start"`
	Stop  int `json:"stop"`

	// ByteLevel, Metaspace.
	AddPrefixSpace *bool   `json:"add_prefix_space"`
	UseRegex       *bool   `json:"use_regex"`
	Replacement    string  `json:"replacement"`
	PrependScheme  string  `json:"prepend_scheme"`
	Split          *bool   `json:"split"`
	Individual     bool    `json:"individual_digits"`
	Single         []piece `json:"single"`
	SpecialTokens  map[string]struct {
		IDs []int32 `json:"ids"`
	} `json:"special_tokens"`
	Sep []json.RawMessage `json:"sep"`
	Cls []json.RawMessage `json:"cls"`
}

type patternJSON struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

// piece is an item of TemplateProcessing's template.
type piece struct {
	SpecialToken *struct {
		ID string `json:"id"`
	} `json:"SpecialToken"`
	Sequence *struct {
		ID string `json:"id"`
	} `json:"Sequence"`
}

func parseComponent(raw json.RawMessage, what string) (*component, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, formatErr("%s: %v", what, err)
	}
	if c.Type == "" {
		return nil, formatErr("%s has no type", what)
	}
	return &c, nil
}

func (p *patternJSON) compile(what string) (pattern, error) {
	switch {
	case p == nil:
		return pattern{}, formatErr("%s has no pattern", what)
	case p.String != nil:
		return pattern{lit: *p.String}, nil
	case p.Regex != nil:
		re, err := compileRegex(*p.Regex)
		if err != nil {
			return pattern{}, formatErr("%s: the regex %q: %v", what, *p.Regex, err)
		}
		return pattern{re: re}, nil
	}
	return pattern{}, formatErr("%s's pattern is neither a String nor a Regex", what)
}

// compileRegex compiles a pattern of tokenizer.json (Oniguruma syntax in
// the Rust library) with regexp2, whose .NET syntax reads the same
// constructs (\p{L}, look-ahead, (?i:…)).
// A compiled pattern serves every tokenizer that names it (a Regexp is safe
// for concurrent use): loading a model compiles its patterns once.
func compileRegex(expr string) (*regexp2.Regexp, error) {
	if re, ok := regexCache.Load(expr); ok {
		return re.(*regexp2.Regexp), nil
	}
	re, err := regexp2.Compile(expr, regexp2.None)
	if err != nil {
		return nil, err
	}
	regexCache.Store(expr, re)
	return re, nil
}

var regexCache sync.Map // pattern → *regexp2.Regexp

// mustRegex compiles one of this package's own patterns.
func mustRegex(expr string) *regexp2.Regexp {
	re, err := compileRegex(expr)
	if err != nil {
		panic(err) // a pattern written in this package: a test catches it
	}
	return re
}

func buildModel(raw json.RawMessage) (*bpe, error) {
	var m struct {
		Type                    string           `json:"type"`
		Vocab                   map[string]int32 `json:"vocab"`
		Merges                  json.RawMessage  `json:"merges"`
		UnkToken                *string          `json:"unk_token"`
		FuseUnk                 bool             `json:"fuse_unk"`
		ByteFallback            bool             `json:"byte_fallback"`
		IgnoreMerges            bool             `json:"ignore_merges"`
		ContinuingSubwordPrefix *string          `json:"continuing_subword_prefix"`
		EndOfWordSuffix         *string          `json:"end_of_word_suffix"`
		Dropout                 *float64         `json:"dropout"`
	}
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return nil, formatErr("tokenizer.json has no model")
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, formatErr("model: %v", err)
	}
	if m.Type == "" && m.Merges != nil {
		m.Type = "BPE"
	}
	if m.Type != "BPE" {
		return nil, unsupported("the model type %q (this package implements BPE)", m.Type)
	}
	if m.Dropout != nil && *m.Dropout > 0 {
		return nil, unsupported("BPE dropout %g (tokenization would be random)", *m.Dropout)
	}
	if len(m.Vocab) == 0 {
		return nil, formatErr("the BPE model has no vocabulary")
	}
	merges, err := parseMerges(m.Merges)
	if err != nil {
		return nil, err
	}
	deref := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	return newBPE(m.Vocab, merges, deref(m.UnkToken), m.FuseUnk, m.ByteFallback, m.IgnoreMerges,
		deref(m.ContinuingSubwordPrefix), deref(m.EndOfWordSuffix))
}

// parseMerges reads merges as "a b" strings (older files) or ["a", "b"]
// pairs.
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		return nil, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, formatErr("merges: %v", err)
	}
	out := make([][2]string, len(items))
	for i, it := range items {
		var s string
		if json.Unmarshal(it, &s) == nil {
			a, b, ok := strings.Cut(s, " ")
			if !ok || strings.Contains(b, " ") {
				return nil, formatErr("merge %d %q is not two tokens separated by one space", i, s)
			}
			out[i] = [2]string{a, b}
			continue
		}
		var p []string
		if err := json.Unmarshal(it, &p); err != nil || len(p) != 2 {
			return nil, formatErr("merge %d is neither \"a b\" nor a pair of strings", i)
		}
		out[i] = [2]string{p[0], p[1]}
	}
	return out, nil
}

func buildNormalizer(raw json.RawMessage) (normalizer, error) {
	c, err := parseComponent(raw, "normalizer")
	if err != nil || c == nil {
		return nil, err
	}
	switch c.Type {
	case "Sequence":
		var q normSequence
		for i, r := range c.Normalizers {
			n, err := buildNormalizer(r)
			if err != nil {
				return nil, fmt.Errorf("%w (normalizer %d of the sequence)", err, i)
			}
			if n != nil {
				q = append(q, n)
			}
		}
		if len(q) == 0 {
			return nil, nil
		}
		return q, nil
	case "NFC":
		return unicodeForm{norm.NFC}, nil
	case "NFD":
		return unicodeForm{norm.NFD}, nil
	case "NFKC":
		return unicodeForm{norm.NFKC}, nil
	case "NFKD":
		return unicodeForm{norm.NFKD}, nil
	case "Lowercase":
		return lowercase{}, nil
	case "Prepend":
		return prepend{c.Prepend}, nil
	case "Replace":
		p, err := c.Pattern.compile("the Replace normalizer")
		if err != nil {
			return nil, err
		}
		var content string
		if err := json.Unmarshal(c.Content, &content); err != nil {
			return nil, formatErr("the Replace normalizer's content is not a string")
		}
		return replace{p, content}, nil
	case "Strip":
		return strip{left: c.StripLeft == nil || *c.StripLeft, right: c.StripRight == nil || *c.StripRight}, nil
	case "StripAccents":
		return stripAccents{}, nil
	}
	return nil, unsupported("the normalizer %q", c.Type)
}

func parseBehavior(s string) (behavior, error) {
	switch strings.ToLower(s) {
	case "removed":
		return removed, nil
	case "isolated":
		return isolated, nil
	case "mergedwithprevious":
		return mergedWithPrevious, nil
	case "mergedwithnext":
		return mergedWithNext, nil
	case "contiguous":
		return contiguous, nil
	}
	return 0, formatErr("the split behavior %q", s)
}

func buildPreTokenizer(raw json.RawMessage) (preTokenizer, error) {
	c, err := parseComponent(raw, "pre_tokenizer")
	if err != nil || c == nil {
		return nil, err
	}
	switch c.Type {
	case "Sequence":
		var q preSequence
		for i, r := range c.PreTokenizers {
			p, err := buildPreTokenizer(r)
			if err != nil {
				return nil, fmt.Errorf("%w (pre-tokenizer %d of the sequence)", err, i)
			}
			if p != nil {
				q = append(q, p)
			}
		}
		return q, nil
	case "Split":
		p, err := c.Pattern.compile("the Split pre-tokenizer")
		if err != nil {
			return nil, err
		}
		b, err := parseBehavior(c.Behavior)
		if err != nil {
			return nil, err
		}
		return split{pat: p, invert: c.Invert, b: b}, nil
	case "ByteLevel":
		bl := byteLevel{addPrefixSpace: c.AddPrefixSpace == nil || *c.AddPrefixSpace}
		if c.UseRegex == nil || *c.UseRegex {
			bl.re = mustRegex(gpt2Pattern)
		}
		return bl, nil
	case "Digits":
		return digits{individual: c.Individual}, nil
	case "Metaspace":
		m := metaspace{repl: c.Replacement, scheme: strings.ToLower(c.PrependScheme), split: c.Split == nil || *c.Split}
		if m.repl == "" {
			m.repl = "▁"
		}
		if m.scheme == "" {
			m.scheme = "always"
			if c.AddPrefixSpace != nil && !*c.AddPrefixSpace {
				m.scheme = "never"
			}
		}
		if m.scheme != "always" && m.scheme != "first" && m.scheme != "never" {
			return nil, formatErr("the Metaspace prepend_scheme %q", c.PrependScheme)
		}
		return m, nil
	case "Whitespace":
		// \w+|[^\w\s]+ with Oniguruma's Unicode \w (letters, marks, decimal
		// and letter numbers, connectors), wider than .NET's.
		return whitespace{re: mustRegex(`[\p{L}\p{M}\p{Nd}\p{Nl}\p{Pc}]+|[^\p{L}\p{M}\p{Nd}\p{Nl}\p{Pc}\s]+`)}, nil
	case "WhitespaceSplit":
		return whitespaceSplit{}, nil
	case "Punctuation":
		b := isolated
		if c.Behavior != "" {
			if b, err = parseBehavior(c.Behavior); err != nil {
				return nil, err
			}
		}
		return punctuation{b}, nil
	}
	return nil, unsupported("the pre-tokenizer %q", c.Type)
}

func buildPost(raw json.RawMessage, t *Tokenizer) (postProcessor, error) {
	c, err := parseComponent(raw, "post_processor")
	if err != nil || c == nil {
		return nil, err
	}
	switch c.Type {
	case "ByteLevel":
		return nil, nil // offsets only
	case "Sequence":
		var q postSequence
		for i, r := range c.Processors {
			p, err := buildPost(r, t)
			if err != nil {
				return nil, fmt.Errorf("%w (post-processor %d of the sequence)", err, i)
			}
			if p != nil {
				q = append(q, p)
			}
		}
		return q, nil
	case "TemplateProcessing":
		var tp template
		seen := false
		for _, p := range c.Single {
			switch {
			case p.Sequence != nil:
				if seen {
					return nil, formatErr("TemplateProcessing's single template holds the sequence twice")
				}
				seen = true
			case p.SpecialToken != nil:
				st, ok := c.SpecialTokens[p.SpecialToken.ID]
				if !ok {
					return nil, formatErr("TemplateProcessing names the special token %q but does not define it", p.SpecialToken.ID)
				}
				for _, id := range st.IDs {
					if id < 0 || int(id) >= len(t.tokens) || !t.present[id] {
						return nil, formatErr("TemplateProcessing's special token %q has the id %d outside the vocabulary", p.SpecialToken.ID, id)
					}
				}
				if seen {
					tp.after = append(tp.after, st.IDs...)
				} else {
					tp.before = append(tp.before, st.IDs...)
				}
			default:
				return nil, formatErr("TemplateProcessing's single template has an item that is neither SpecialToken nor Sequence")
			}
		}
		if !seen {
			return nil, formatErr("TemplateProcessing's single template has no sequence")
		}
		return tp, nil
	case "BertProcessing", "RobertaProcessing":
		var tp template
		for _, side := range []struct {
			raw []json.RawMessage
			dst *[]int32
		}{{c.Cls, &tp.before}, {c.Sep, &tp.after}} {
			if len(side.raw) != 2 {
				return nil, formatErr("%s's cls and sep are [token, id] pairs", c.Type)
			}
			var id int32
			if err := json.Unmarshal(side.raw[1], &id); err != nil {
				return nil, formatErr("%s's cls and sep are [token, id] pairs", c.Type)
			}
			if id < 0 || int(id) >= len(t.tokens) || !t.present[id] {
				return nil, formatErr("%s's id %d is outside the vocabulary", c.Type, id)
			}
			*side.dst = []int32{id}
		}
		return tp, nil
	}
	return nil, unsupported("the post-processor %q", c.Type)
}

func buildDecoder(raw json.RawMessage) (decoder, error) {
	c, err := parseComponent(raw, "decoder")
	if err != nil || c == nil {
		return nil, err
	}
	switch c.Type {
	case "Sequence":
		var q decSequence
		for i, r := range c.Decoders {
			d, err := buildDecoder(r)
			if err != nil {
				return nil, fmt.Errorf("%w (decoder %d of the sequence)", err, i)
			}
			if d != nil {
				q = append(q, d)
			}
		}
		return q, nil
	case "ByteLevel":
		return byteLevelDecoder{}, nil
	case "ByteFallback":
		return byteFallback{}, nil
	case "Fuse":
		return fuse{}, nil
	case "Strip":
		var content string
		if err := json.Unmarshal(c.Content, &content); err != nil || len([]rune(content)) != 1 {
			return nil, formatErr("the Strip decoder's content is not one character")
		}
		return stripDecoder{content: []rune(content)[0], start: c.Start, stop: c.Stop}, nil
	case "Replace":
		p, err := c.Pattern.compile("the Replace decoder")
		if err != nil {
			return nil, err
		}
		var content string
		if err := json.Unmarshal(c.Content, &content); err != nil {
			return nil, formatErr("the Replace decoder's content is not a string")
		}
		return replaceDecoder{replace{p, content}}, nil
	case "Metaspace":
		repl := c.Replacement
		if repl == "" {
			repl = "▁"
		}
		scheme := strings.ToLower(c.PrependScheme)
		strip := scheme != "never"
		if scheme == "" && c.AddPrefixSpace != nil {
			strip = *c.AddPrefixSpace
		}
		return metaspaceDecoder{repl: repl, stripPrefix: strip}, nil
	}
	return nil, unsupported("the decoder %q", c.Type)
}

// hasByteFallback reports whether a decoder chain holds ByteFallback.
func hasByteFallback(d decoder) bool {
	switch d := d.(type) {
	case byteFallback:
		return true
	case decSequence:
		for _, x := range d {
			if hasByteFallback(x) {
				return true
			}
		}
	}
	return false
}
