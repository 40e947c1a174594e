package arch

import (
	"fmt"
	"math"

	"github.com/moex-project/moex/internal/errkind"
	"github.com/moex-project/moex/kernels"
)

// Scoring turns router logits into expert scores.
type Scoring uint8

// Scoring functions.
const (
	Softmax      Scoring = iota + 1 // softmax over all experts
	Sigmoid                         // independent sigmoid per expert
	SqrtSoftplus                    // sqrt(softplus(logit)) per expert (DeepSeek-V4)
)

func (s Scoring) String() string {
	switch s {
	case Softmax:
		return "softmax"
	case Sigmoid:
		return "sigmoid"
	case SqrtSoftplus:
		return "sqrtsoftplus"
	}
	return fmt.Sprintf("Scoring(%d)", uint8(s))
}

// TopKMethod is how the top-k experts are chosen from the scores.
type TopKMethod uint8

// Expert selection methods.
const (
	// Greedy takes the k highest scores.
	Greedy TopKMethod = iota + 1
	// GroupLimitedGreedy keeps the TopKGroups groups whose best score is
	// highest, then takes the k highest scores inside them (DeepSeek-V2).
	GroupLimitedGreedy
	// NoAuxTC chooses with scores plus a per-expert correction bias: groups
	// ranked by the sum of their two best biased scores, then the k highest
	// biased scores inside the kept groups; the weights are the unbiased
	// scores (DeepSeek-V3).
	NoAuxTC
)

func (m TopKMethod) String() string {
	switch m {
	case Greedy:
		return "greedy"
	case GroupLimitedGreedy:
		return "group_limited_greedy"
	case NoAuxTC:
		return "noaux_tc"
	}
	return fmt.Sprintf("TopKMethod(%d)", uint8(m))
}

// MoE is a model's MoE block, normalised over the families' differing
// field names and defaults (moe.Config is this type).
type MoE struct {
	// ModelType is the family whose block the model computes; Name is
	// config.json's own model_type (kimi_k2 for a ModelType deepseek_v3).
	ModelType  string
	Name       string
	Hidden     int // hidden_size
	NumExperts int // routed experts
	TopK       int // experts per token
	Inter      int // intermediate width of one routed expert

	// SharedInter is the intermediate width of the shared-expert MLP (DeepSeek:
	// n_shared_experts × moe_intermediate_size, fused as one MLP); 0 for none.
	SharedInter int
	// SharedGate: the shared expert's output is multiplied by
	// sigmoid(shared_expert_gate · x) (qwen2_moe).
	SharedGate bool

	Scoring        Scoring
	Method         TopKMethod
	NumGroups      int     // n_group, for the group-limited methods
	TopKGroups     int     // topk_group
	NormTopK       bool    // renormalise the k weights to sum to one
	NormEps        float64 // added to the renormalisation's denominator (DeepSeek: 1e-20)
	NormMin        float64 // the renormalisation's denominator is at least this (ERNIE: moe_norm_min, 1e-12)
	RoutedScaling  float64 // multiply the final weights by this
	ScoreBiasInput bool    // NoAuxTC: the gate has an e_score_correction_bias tensor
	// ChooseOnLogits: the experts are ranked by their raw logits rather
	// than by their scores (llama4: top-k on the logits, then sigmoid).
	ChooseOnLogits bool
	// WeightOnInput: a chosen expert's routing weight multiplies its input
	// rather than its output, expert(w·x) (llama4).
	WeightOnInput bool

	// RouterBias: the router adds a bias to its logits (gpt_oss's
	// router.bias). ExpertBias: the experts' projections have biases
	// (gpt_oss). Act is the experts' activation (the zero value: SwiGLU).
	RouterBias, ExpertBias bool
	Act                    kernels.Activation
	// SharedAct is the shared expert's activation (the zero value: SwiGLU;
	// gemma4's dense MLP: GeGLU, as its experts).
	SharedAct kernels.Activation

	// HashLayers are the layers that choose their experts by token id,
	// from the checkpoint's tid2eid table [VocabSize, top_k], and weight
	// them by their scores (deepseek_v4's hash_moe layers): their forward
	// passes need the batch's token ids.
	HashLayers []int
	VocabSize  int

	// ResidualInput (gemma4): the block reads the residual stream and owns
	// its norms. The router reads RMSNorm(x) (no weight) × router.scale ×
	// hidden^−½ and multiplies the renormalised weights by per_expert_scale;
	// the experts read pre_feedforward_layernorm_2(x), the dense MLP (the
	// "shared expert", width SharedInter) pre_feedforward_layernorm(x); the
	// block's output is post_feedforward_layernorm(
	// post_feedforward_layernorm_1(mlp) + post_feedforward_layernorm_2(moe)),
	// what the decoder adds to x. RMSNormEps is the norms' epsilon.
	ResidualInput bool
	RMSNormEps    float64
	// DoubleWideFrom > 0 (gemma4's use_double_wide_mlp): from this layer
	// on (the KV-shared layers) the dense MLP is twice SharedInter wide.
	DoubleWideFrom int
}

// Validate checks that the routing is well defined: positive sizes, top_k
// within the experts, groups that divide the experts and leave enough
// experts to choose from.
func (c *MoE) Validate() error {
	if _, ok := byName[c.ModelType]; !ok {
		return errkind.Errorf(ErrUnknownFamily, "unknown model_type %q (supported: %v)", c.ModelType, Families())
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"hidden_size", c.Hidden}, {"number of experts", c.NumExperts}, {"num_experts_per_tok", c.TopK}, {"expert intermediate size", c.Inter}} {
		if f.v <= 0 {
			return fmt.Errorf("%s is %d, must be positive", f.name, f.v)
		}
	}
	if c.SharedInter < 0 {
		return fmt.Errorf("negative shared expert size")
	}
	if err := c.Act.Validate(); err != nil {
		return fmt.Errorf("swiglu_limit: %w", err)
	}
	if err := c.SharedAct.Validate(); err != nil {
		return fmt.Errorf("shared expert: %w", err)
	}
	if len(c.HashLayers) > 0 && c.VocabSize <= 0 {
		return fmt.Errorf("vocab_size %d must be positive: the hash layers' tid2eid has a row per token id", c.VocabSize)
	}
	if c.ResidualInput && (!(c.RMSNormEps > 0) || math.IsInf(c.RMSNormEps, 0) || c.SharedInter <= 0) {
		return fmt.Errorf("rms_norm_eps %v must be positive and finite, and the dense MLP's width %d positive", c.RMSNormEps, c.SharedInter)
	}
	if c.TopK > c.NumExperts {
		return fmt.Errorf("num_experts_per_tok %d is larger than the %d experts", c.TopK, c.NumExperts)
	}
	if c.Scoring != Softmax && c.Scoring != Sigmoid && c.Scoring != SqrtSoftplus {
		return fmt.Errorf("unknown scoring %v", c.Scoring)
	}
	if !(c.RoutedScaling > 0) || c.RoutedScaling > 1e30 {
		return fmt.Errorf("routed_scaling_factor %v must be positive and finite", c.RoutedScaling)
	}
	switch c.Method {
	case Greedy:
	case GroupLimitedGreedy, NoAuxTC:
		if c.NumGroups <= 0 || c.NumExperts%c.NumGroups != 0 {
			return fmt.Errorf("n_group %d does not divide the %d experts", c.NumGroups, c.NumExperts)
		}
		if c.TopKGroups <= 0 || c.TopKGroups > c.NumGroups {
			return fmt.Errorf("topk_group %d must be between 1 and n_group %d", c.TopKGroups, c.NumGroups)
		}
		if per := c.NumExperts / c.NumGroups; c.TopKGroups*per < c.TopK {
			return fmt.Errorf("topk_group %d × %d experts per group = %d is fewer than num_experts_per_tok %d",
				c.TopKGroups, per, c.TopKGroups*per, c.TopK)
		}
	default:
		return fmt.Errorf("unknown topk method %v", c.Method)
	}
	if !(c.NormMin >= 0) || math.IsInf(c.NormMin, 0) || !(c.NormEps >= 0) || math.IsInf(c.NormEps, 0) {
		return fmt.Errorf("moe_norm_min %v and the renormalisation epsilon %v must be finite and not negative", c.NormMin, c.NormEps)
	}
	return nil
}

// GateKernelArgs maps c's routing to the gating kernel's codes (see
// kernels.GateArgs).
func (c *MoE) GateKernelArgs() kernels.GateArgs {
	a := kernels.GateArgs{Experts: int32(c.NumExperts), TopK: int32(c.TopK), Scoring: kernels.GateSoftmax,
		Groups: int32(max(c.NumGroups, 1)), TopKGroups: int32(max(c.TopKGroups, 1)), Scaling: float32(c.RoutedScaling)}
	switch c.Scoring {
	case Sigmoid:
		a.Scoring = kernels.GateSigmoid
	case SqrtSoftplus:
		a.Scoring = kernels.GateSqrtSoftplus
	}
	if c.ChooseOnLogits {
		a.ChooseOnLogits = 1
	}
	a.Method = map[TopKMethod]int32{Greedy: kernels.GateGreedy, GroupLimitedGreedy: kernels.GateGroupLimitedGreedy, NoAuxTC: kernels.GateNoAuxTC}[c.Method]
	if c.NormTopK {
		a.Norm, a.NormEps, a.NormMin = 1, float32(c.NormEps), float32(c.NormMin)
	}
	return a
}

// FLOPs returns the floating-point operations of a forward pass over tokens
// tokens: 2·hidden·(3·inter) per token per routed expert, the same for the
// shared expert, plus the router.
func (c *MoE) FLOPs(tokens int) float64 {
	per := 2 * float64(c.Hidden) * 3 * float64(c.Inter) * float64(c.TopK)
	per += 2 * float64(c.Hidden) * 3 * float64(c.SharedInter)
	per += 2 * float64(c.Hidden) * float64(c.NumExperts)
	return per * float64(tokens)
}
