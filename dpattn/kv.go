package dpattn

import "fmt"

// KVAccounting compares the MLA latent cache under tensor parallelism and
// under DP attention for one model on N ranks.
type KVAccounting struct {
	Ranks          int
	Layers         int
	LatentDim      int   // kv_lora_rank + qk_rope_head_dim (576 for DeepSeek)
	DTypeBytes     int   // bytes per cached value
	BudgetPerRank  int64 // bytes of KV cache memory on each rank
	BytesPerToken  int64 // one token's latents over all layers
	PerRankTP      int64 // bytes per token on each rank under TP: every rank holds every token's latents
	PerRankDP      int64 // bytes per token per rank under DP attention, averaged: a token lives on one rank
	MaxTokensTP    int64 // concurrent tokens the group can hold under TP
	MaxTokensDP    int64 // and under DP attention
	DPOverTPFactor float64
}

// Account computes the KV accounting. MLA caches one latent row per token
// and layer, shared by all heads; TP cannot split it, so under TP each rank
// keeps the whole cache (1/N efficiency), while DP attention gives each rank
// its own requests.
func Account(ranks, layers, latentDim, dtypeBytes int, budgetPerRank int64) (KVAccounting, error) {
	if ranks < 1 || layers < 1 || latentDim < 1 || dtypeBytes < 1 || budgetPerRank < 0 {
		return KVAccounting{}, fmt.Errorf("dpattn: KV accounting of %d ranks, %d layers, %d dims, %d bytes, budget %d",
			ranks, layers, latentDim, dtypeBytes, budgetPerRank)
	}
	a := KVAccounting{Ranks: ranks, Layers: layers, LatentDim: latentDim, DTypeBytes: dtypeBytes, BudgetPerRank: budgetPerRank}
	a.BytesPerToken = int64(layers) * int64(latentDim) * int64(dtypeBytes)
	if budgetPerRank < a.BytesPerToken {
		return KVAccounting{}, fmt.Errorf("dpattn: a KV budget of %d B per rank holds no token (%d B each: %d layers × %d values × %d B)",
			budgetPerRank, a.BytesPerToken, layers, latentDim, dtypeBytes)
	}
	a.PerRankTP = a.BytesPerToken
	a.PerRankDP = a.BytesPerToken / int64(ranks)
	a.MaxTokensTP = budgetPerRank / a.BytesPerToken
	a.MaxTokensDP = int64(ranks) * (budgetPerRank / a.BytesPerToken)
	a.DPOverTPFactor = float64(a.MaxTokensDP) / float64(max(a.MaxTokensTP, 1))
	return a, nil
}

// String is a short report.
func (a KVAccounting) String() string {
	return fmt.Sprintf("MLA latent KV: %d layers × %d values × %d B = %d B per token; on %d ranks with %.1f GiB each: "+
		"TP %d B/token/rank → %d tokens, DP attention %d B/token/rank → %d tokens (%.1f×)",
		a.Layers, a.LatentDim, a.DTypeBytes, a.BytesPerToken, a.Ranks, float64(a.BudgetPerRank)/(1<<30),
		a.PerRankTP, a.MaxTokensTP, a.PerRankDP, a.MaxTokensDP, a.DPOverTPFactor)
}
