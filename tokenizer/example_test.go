package tokenizer_test

import (
	"fmt"

	"github.com/moex-project/moex/tokenizer"
)

// A tokenizer.json of four characters and two merges, with a BOS its
// template adds.
func Example() {
	tj := `{
	  "added_tokens": [{"id": 4, "content": "<s>", "special": true}],
	  "pre_tokenizer": {"type": "WhitespaceSplit"},
	  "post_processor": {"type": "TemplateProcessing",
	    "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}],
	    "special_tokens": {"<s>": {"id": "<s>", "ids": [4]}}},
	  "decoder": {"type": "Fuse"},
	  "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "abab": 3}, "merges": ["a b", "ab ab"]}
	}`
	tk, err := tokenizer.FromJSON([]byte(tj), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	ids, _ := tk.Encode("abab ab", true)
	fmt.Println(ids)
	text, _ := tk.Decode(ids, true)
	fmt.Println(text)
	// Output:
	// [4 3 2]
	// ababab
}
