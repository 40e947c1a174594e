package tokenizer

// postProcessor adds the special tokens around an encoded text.
type postProcessor interface {
	process(ids []int32, addSpecial bool) []int32
}

// template is TemplateProcessing's single-sequence template (and BERT's and
// RoBERTa's fixed ones): ids before and after the text's.
type template struct {
	before, after []int32
}

func (t template) process(ids []int32, addSpecial bool) []int32 {
	if !addSpecial || len(t.before)+len(t.after) == 0 {
		return ids
	}
	out := make([]int32, 0, len(t.before)+len(ids)+len(t.after))
	out = append(out, t.before...)
	out = append(out, ids...)
	return append(out, t.after...)
}

type postSequence []postProcessor

func (q postSequence) process(ids []int32, addSpecial bool) []int32 {
	for _, p := range q {
		ids = p.process(ids, addSpecial)
	}
	return ids
}
