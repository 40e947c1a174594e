package moe

import "github.com/moex-project/moex/kernels"

// GateKernelArgs maps c's routing to the gating kernel's codes (see
// kernels.GateArgs).
func (c *Config) GateKernelArgs() kernels.GateArgs {
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
