package tokenizer

import (
	"errors"
	"strings"
	"unicode/utf8"

	"github.com/moex-project/moex/internal/errkind"
)

// The classes of error a caller branches on with errors.Is.
var (
	// ErrFormat: a tokenizer file that is not what its format says.
	ErrFormat = errors.New("tokenizer: malformed tokenizer file")
	// ErrUnsupported: a model, normalizer, pre-tokenizer, post-processor or
	// decoder this package does not implement, named in the message.
	ErrUnsupported = errors.New("tokenizer: unsupported component")
	// ErrUnknownID: an id outside the vocabulary.
	ErrUnknownID = errors.New("tokenizer: id outside the vocabulary")
	// ErrInvalidUTF8: text to encode that is not valid UTF-8.
	ErrInvalidUTF8 = errors.New("tokenizer: text is not valid UTF-8")
)

// Tokenizer is a model's text ↔ ids mapping. It is immutable and safe for
// concurrent use.
type Tokenizer struct {
	model wordModel
	vocab map[string]int32 // the model's tokens
	added *addedVocab
	norm  normalizer    // nil: none
	pre   preTokenizer  // nil: the whole piece is one word
	post  postProcessor // nil: no special tokens added
	dec   decoder       // nil: tokens joined with spaces (as the Rust library)

	tokens  []string // id → token, the model's vocabulary and the added tokens
	present []bool   // id → is a token (ids may have holes)
	special []bool   // id → is a special added token

	// specials maps tokenizer_config.json's names (bos_token, eos_token,
	// unk_token, pad_token) to their token strings.
	specials map[string]string
	bos, eos int32 // -1 when the tokenizer has none
	byteRuns bool  // the decoder joins <0xNN> runs (ByteFallback)

	maxTokenBytes int // the longest token's string, in bytes
	class         string
}

// wordModel turns one pre-tokenized word into ids: BPE by merge ranks
// (tokenizer.json, GGUF's gpt2) or SentencePiece's by scores (GGUF's llama).
type wordModel interface {
	tokenize(word string, out []int32) []int32
}

// span is a piece of the input on its way through the pipeline: text still
// to tokenize (id < 0) or an added token already matched (id ≥ 0). atStart
// says the piece begins at the start of the input (Metaspace's "first").
type span struct {
	text    string
	id      int32
	atStart bool
}

// Encode returns the ids of text: Hugging Face's tokenizer(text)["input_ids"]
// when addSpecial is true, and with add_special_tokens=False otherwise
// (special-token strings in the text are matched either way).
func (t *Tokenizer) Encode(text string, addSpecial bool) ([]int32, error) {
	if !utf8.ValidString(text) {
		for i, r := range text {
			if r == utf8.RuneError {
				if _, size := utf8.DecodeRuneInString(text[i:]); size == 1 {
					return nil, errkind.Errorf(ErrInvalidUTF8, "tokenizer: the text is not valid UTF-8 (byte %d is 0x%02x)", i, text[i])
				}
			}
		}
	}
	spans := t.added.split([]span{{text: text, id: -1, atStart: true}}, false)
	if t.norm != nil {
		for i := range spans {
			if spans[i].id < 0 {
				spans[i].text = t.norm.normalize(spans[i].text)
			}
		}
	}
	spans = t.added.split(spans, true)
	if t.pre != nil {
		var err error
		if spans, err = t.pre.preTokenize(spans); err != nil {
			return nil, err
		}
	}
	ids := make([]int32, 0, len(text)/3+4)
	for _, s := range spans {
		if s.id >= 0 {
			ids = append(ids, s.id)
			continue
		}
		if s.text == "" {
			continue
		}
		ids = t.model.tokenize(s.text, ids)
	}
	if t.post != nil {
		ids = t.post.process(ids, addSpecial)
	}
	return ids, nil
}

// Decode returns the text of ids as the tokenizer's decoder writes it
// (Hugging Face's tokenizer.decode(ids)); skipSpecial leaves out the
// special tokens. An id outside the vocabulary is an ErrUnknownID error.
func (t *Tokenizer) Decode(ids []int32, skipSpecial bool) (string, error) {
	toks := make([]string, 0, len(ids))
	for i, id := range ids {
		if id < 0 || int(id) >= len(t.tokens) || !t.present[id] {
			return "", errkind.Errorf(ErrUnknownID, "tokenizer: id %d (position %d) is outside the vocabulary of %d tokens", id, i, len(t.tokens))
		}
		if skipSpecial && t.special[id] {
			continue
		}
		toks = append(toks, t.tokens[id])
	}
	if t.dec == nil {
		return strings.Join(toks, " "), nil
	}
	return strings.Join(t.dec.decode(toks), ""), nil
}

// MaxTokenBytes is the most bytes of text one token stands for (at least
// 1): a text of n bytes has at least n/MaxTokenBytes tokens.
func (t *Tokenizer) MaxTokenBytes() int { return t.maxTokenBytes }

// VocabSize is one more than the largest id: the model's vocabulary and the
// added tokens.
func (t *Tokenizer) VocabSize() int { return len(t.tokens) }

// Token is the token string of id.
func (t *Tokenizer) Token(id int32) (string, bool) {
	if id < 0 || int(id) >= len(t.tokens) {
		return "", false
	}
	return t.tokens[id], t.present[id]
}

// ID is the id of a token string: an added token's or the model's.
func (t *Tokenizer) ID(token string) (int32, bool) {
	if id, ok := t.added.byContent[token]; ok {
		return id, true
	}
	id, ok := t.vocab[token]
	return id, ok
}

// IsSpecial reports whether id is a special added token (skipped by
// Decode(ids, true)).
func (t *Tokenizer) IsSpecial(id int32) bool {
	return id >= 0 && int(id) < len(t.special) && t.special[id]
}

// BOS is the beginning-of-sequence id, if the tokenizer names one.
func (t *Tokenizer) BOS() (int32, bool) { return t.bos, t.bos >= 0 }

// EOS is the end-of-sequence id, if the tokenizer names one.
func (t *Tokenizer) EOS() (int32, bool) { return t.eos, t.eos >= 0 }

// SpecialTokens maps tokenizer_config.json's names of special tokens
// (bos_token, eos_token, unk_token, pad_token, …) to their strings: the
// variables a chat template reads.
func (t *Tokenizer) SpecialTokens() map[string]string {
	m := make(map[string]string, len(t.specials))
	for k, v := range t.specials {
		m[k] = v
	}
	return m
}

// Class is tokenizer_config.json's tokenizer_class ("" when absent).
func (t *Tokenizer) Class() string { return t.class }

// maxHoles bounds the ids a vocabulary may leave unused: an id far past
// the number of tokens is a malformed file, not a reason to allocate
// gigabytes.
const maxHoles = 1 << 16

// index fills the id → token tables from the model's vocabulary and the
// added tokens (which win where both name an id); byID, when not nil, is
// every token by id (a GGUF vocabulary's list, duplicates included).
func (t *Tokenizer) index(added []addedToken, byID []string) error {
	t.added = newAddedVocab(added)
	n := len(byID)
	for tok, id := range t.vocab {
		if id < 0 || int(id) >= len(t.vocab)+len(added)+maxHoles {
			return formatErr("token %q has the id %d, outside a vocabulary of %d tokens", tok, id, len(t.vocab)+len(added))
		}
		n = max(n, int(id)+1)
	}
	for _, a := range added {
		if a.id < 0 || int(a.id) >= len(t.vocab)+len(added)+maxHoles {
			return formatErr("added token %q has the id %d, outside a vocabulary of %d tokens", a.content, a.id, len(t.vocab)+len(added))
		}
		n = max(n, int(a.id)+1)
	}
	t.tokens, t.present, t.special = make([]string, n), make([]bool, n), make([]bool, n)
	if byID != nil {
		for id, tok := range byID {
			t.tokens[id], t.present[id] = tok, true
		}
	} else {
		for tok, id := range t.vocab {
			t.tokens[id], t.present[id] = tok, true
		}
	}
	for _, a := range added {
		t.tokens[a.id], t.present[a.id], t.special[a.id] = a.content, true, a.special
	}
	// A token's string has at least as many bytes as the text it stands
	// for (GGUF's byte-level characters take one or two bytes each, the
	// ▁ of SentencePiece three for a space), plus a normalizer's Prepend.
	t.maxTokenBytes = 1
	for _, tok := range t.tokens {
		t.maxTokenBytes = max(t.maxTokenBytes, len(tok))
	}
	return nil
}

func formatErr(format string, args ...any) error {
	return errkind.Errorf(ErrFormat, "tokenizer: "+format, args...)
}

func unsupported(format string, args ...any) error {
	return errkind.Errorf(ErrUnsupported, "tokenizer: "+format, args...)
}
