// Package tokenizer turns text into a model's token ids and back, id for id
// what Hugging Face's tokenizers give for the same files.
//
// A Tokenizer is read from a model folder's tokenizer.json and
// tokenizer_config.json (Load, or FromJSON for the bytes). It runs the
// pipeline the file describes, in Hugging Face's order: added tokens
// (special tokens first, on the raw text), the normalizer on what is left,
// the pre-tokenizer, the model (BPE: byte-level as in GPT-2, Llama 3, Qwen,
// DeepSeek and o200k, or SentencePiece-style with byte fallback as in
// Mistral), then the post-processor that adds the special tokens. Where
// Python transformers departs from the file, it follows transformers: a
// Llama-class tokenizer's post-processor is rebuilt from add_bos_token and
// add_eos_token in tokenizer_config.json, so DeepSeek-V3's ids start with
// its BOS although its tokenizer.json adds none.
//
// Decode maps ids back to text as the file's decoder does, with one U+FFFD
// for each maximal invalid UTF-8 run (byte-level models) or each invalid
// byte token (byte fallback), as the Rust library does. A DecodeStream
// hands out text as ids arrive, never half a character.
//
// A Tokenizer is immutable after loading and safe for concurrent use by
// many goroutines. Bad input — a malformed file, a model or component this
// package does not implement, an unknown pre-tokenizer, an id outside the
// vocabulary — returns an error naming the problem (errors.Is with
// ErrFormat, ErrUnsupported or ErrUnknownID); nothing panics.
package tokenizer
