package kernels

// GateArgs is a layer's routing as the CUDA gating kernel takes it by value
// (moex::GateParams in kernels/cuda/moe_routing.cu: seven int32, two
// float32, an int32 and a float32, the same layout). Scoring: 1 softmax, 2
// sigmoid, 3 sqrt(softplus); Method: 1 greedy, 2 group-limited greedy, 3
// noaux_tc (which reads a bias per expert); Norm 1 renormalises the top-k
// weights, the denominator max(sum + NormEps, NormMin); ChooseOnLogits 1
// ranks the experts by their logits.
type GateArgs struct {
	Experts, TopK, Scoring, Method, Groups, TopKGroups, Norm int32
	NormEps, Scaling                                         float32
	ChooseOnLogits                                           int32
	NormMin                                                  float32
}

// The codes of GateArgs.Scoring and GateArgs.Method.
const (
	GateSoftmax int32 = 1
	GateSigmoid int32 = 2
	// GateSqrtSoftplus is DeepSeek-V4's sqrt(softplus(logit)).
	GateSqrtSoftplus int32 = 3

	GateGreedy             int32 = 1
	GateGroupLimitedGreedy int32 = 2
	GateNoAuxTC            int32 = 3
)
