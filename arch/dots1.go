package arch

// dots.llm1 (transformers' modeling_dots1.py): DeepSeek-V3's MoE block
// (sigmoid, noaux_tc, shared experts, first_k_dense_replace) with
// Dots1Config's defaults: one group.
var dots1 = &family{
	name:     "dots1",
	classes:  []string{"Dots1ForCausalLM"},
	read:     readDeepSeek,
	dense:    deepseekDense,
	names:    mlpNames,
	notWhole: "its attention (per-head QK norms) is read but not yet checked against transformers' reference",
}
