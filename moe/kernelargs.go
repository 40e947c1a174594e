package moe

// GateKernelArgs is the routing of a config as the CUDA gating kernel takes
// it by value (moex::GateParams in kernels/cuda/moe_routing.cu: seven int32
// then two float32, the same layout).
type GateKernelArgs struct {
	Experts, TopK, Scoring, Method, Groups, TopKGroups, Norm int32
	NormEps, Scaling                                         float32
}

// GateKernelArgs maps c's routing to the kernel's codes: scoring 1 softmax,
// 2 sigmoid; method 1 greedy, 2 group-limited greedy, 3 noaux_tc; DeepSeek's
// renormalisation adds 1e-20 to the denominator.
func (c *Config) GateKernelArgs() GateKernelArgs {
	a := GateKernelArgs{Experts: int32(c.NumExperts), TopK: int32(c.TopK), Scoring: 1,
		Groups: int32(max(c.NumGroups, 1)), TopKGroups: int32(max(c.TopKGroups, 1)), Scaling: float32(c.RoutedScaling)}
	if c.Scoring == Sigmoid {
		a.Scoring = 2
	}
	a.Method = map[TopKMethod]int32{Greedy: 1, GroupLimitedGreedy: 2, NoAuxTC: 3}[c.Method]
	if c.NormTopK {
		a.Norm = 1
		if c.ModelType == "deepseek_v2" || c.ModelType == "deepseek_v3" {
			a.NormEps = 1e-20
		}
	}
	return a
}
