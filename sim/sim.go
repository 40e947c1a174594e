// Package sim models decode deployments of MLA MoE models (DeepSeek-V2,
// V3, Kimi K2 and their kin) on one machine or a thousand: which batch fits
// each rank's KV budget, each decode step's time by stage, and the tokens a
// second that follow, for tensor-parallel attention and for DP attention
// with the MoE in gather or all-to-all (EP) mode.
//
// Every formula is in this file, each with its reasoning; the hardware
// figures and their sources are in hardware.go. A stage's time is a
// roofline: the larger of its bytes over the memory bandwidth and its FLOPs
// over the compute rate, or for a collective, its bytes over the link
// bandwidth plus a fixed latency. Stages do not overlap (no two-batch
// overlap), which is how moex run executes and what SGLang did in v0.4.
//
// The functions are pure: safe from several goroutines.
package sim

import (
	"errors"
	"fmt"
	"math"

	"github.com/moex-project/moex/dpattn"
)

// Layout is how a deployment splits attention and the MoE over its ranks.
type Layout string

const (
	// TP: attention heads split over the ranks, every rank caching every
	// request's latents; the MoE's experts sharded over the ranks, each
	// over all tokens; all-reduces after attention and after the MoE.
	TP Layout = "tp"
	// DPGather: DP attention (each rank its own requests and latent
	// cache); the MoE in gather mode: all-gather the tokens, every rank
	// its expert shard over all of them, reduce-scatter.
	DPGather Layout = "dp-gather"
	// DPEP: DP attention; the MoE in all-to-all mode (expert parallelism):
	// each rank dispatches its tokens to the experts' owners and combines
	// them back; shared experts replicated.
	DPEP Layout = "dp-ep"
)

// Layouts lists the layouts.
var Layouts = []Layout{TP, DPGather, DPEP}

// ParseLayout reads a layout's name.
func ParseLayout(s string) (Layout, error) {
	for _, l := range Layouts {
		if string(l) == s {
			return l, nil
		}
	}
	return "", fmt.Errorf("sim: unknown layout %q (tp, dp-gather, dp-ep)", s)
}

// Deployment is a model on ranks of one kind of hardware in one layout.
type Deployment struct {
	Model    Model
	Hardware Hardware
	Layout   Layout
	Ranks    int
	// WeightDType is "bf16" or "fp8" (1 byte a weight; block scales
	// ignored); KVDType the latent cache's, likewise.
	WeightDType, KVDType string
	// DispatchDType is the all-to-all dispatch's activation dtype (DeepEP
	// sends fp8, moex bf16); combine and every other collective carry bf16.
	DispatchDType string
	// EPLBImbalance is the busiest rank's expert load over the mean (≥ 1;
	// 1: perfectly balanced, as EPLB aims at). DPImbalance is the busiest
	// attention rank's requests over the mean (≥ 1: stragglers).
	EPLBImbalance, DPImbalance float64
	// KVBudget is each rank's KV-cache bytes; 0: what memory leaves after
	// the weights (Mem × MemFraction − WeightsPerRank).
	KVBudget float64
}

// Workload is what the deployment serves: requests of Input prompt tokens
// generating Output tokens, Batch of them decoding at once over all ranks
// (0: the largest that fits, at most MaxBatch if that is positive).
type Workload struct {
	Input, Output int
	Batch         int
	MaxBatch      int
	// Prefill: the batch's prefill (Deployment.Prefill) rather than a
	// decode step, where a sweep or moex sim chooses.
	Prefill bool
}

// Stage is one part of a decode step, summed over the layers.
type Stage struct {
	Name    string  `json:"name"`
	Seconds float64 `json:"seconds"`
	// Bound is what limits it: memory, compute or link.
	Bound string  `json:"bound"`
	Bytes float64 `json:"bytes"` // read from memory, or sent over links
	FLOPs float64 `json:"flops"`
}

// Result is one decode (or prefill) step of a deployment at a batch.
type Result struct {
	Phase  string `json:"phase"` // decode or prefill
	Layout Layout `json:"layout"`
	Ranks  int    `json:"ranks"`
	// Batch is the requests decoding over all ranks; RankBatch those on
	// the busiest attention rank (TP: all of them).
	Batch, RankBatch int
	// Context is a request's mean cached tokens over its decode (Input +
	// Output/2); a prefill's prompt length.
	Context float64 `json:"context"`
	// Per rank: the weights, the KV pool, and the KV this batch holds.
	WeightBytes, KVPool, KVBytes float64
	// MaxBatch is the most requests of Input+Output tokens the KV pools
	// hold at once.
	MaxBatch int     `json:"max_batch"`
	Stages   []Stage `json:"stages"`
	Step     float64 `json:"step_seconds"`
	// TokensPerSec: generated tokens a second over all ranks (prefill:
	// prompt tokens).
	TokensPerSec float64 `json:"tokens_per_second"`
	// IdleFraction is the share of attention rank-steps DP attention
	// leaves unused because the busiest rank sets the step (IDLE batches
	// and stragglers); 0 under TP.
	IdleFraction float64 `json:"idle_fraction"`
}

func dtypeBytes(dt string) (float64, error) {
	switch dt {
	case "bf16", "fp16":
		return 2, nil
	case "fp8":
		return 1, nil
	case "fp32":
		return 4, nil
	}
	return 0, fmt.Errorf("sim: unknown dtype %q (bf16, fp16, fp8, fp32)", dt)
}

// actBytes: activations travel as bf16.
const actBytes = 2

// Validate names the first field that cannot describe a deployment.
func (d Deployment) Validate() error {
	if err := d.Model.Validate(); err != nil {
		return err
	}
	if err := d.Hardware.Validate(); err != nil {
		return err
	}
	if _, err := ParseLayout(string(d.Layout)); err != nil {
		return err
	}
	if d.Ranks < 1 {
		return fmt.Errorf("sim: %d ranks: a deployment needs at least one", d.Ranks)
	}
	for _, dt := range []string{d.WeightDType, d.KVDType, d.DispatchDType} {
		if _, err := dtypeBytes(dt); err != nil {
			return err
		}
	}
	gemmDT := d.WeightDType
	if gemmDT == "fp16" || gemmDT == "fp32" {
		gemmDT = "bf16"
	}
	if _, ok := d.Hardware.GEMM[gemmDT]; !ok {
		return fmt.Errorf("sim: hardware %q has no %s GEMM rate", d.Hardware.Name, d.WeightDType)
	}
	if d.EPLBImbalance < 1 || d.DPImbalance < 1 {
		return fmt.Errorf("sim: imbalance factors (EPLB %v, DP %v) are max over mean: at least 1", d.EPLBImbalance, d.DPImbalance)
	}
	if d.KVBudget < 0 {
		return fmt.Errorf("sim: negative KV budget %v", d.KVBudget)
	}
	return nil
}

func (d Deployment) gemmRate() float64 {
	if r, ok := d.Hardware.GEMM[d.WeightDType]; ok {
		return r
	}
	return d.Hardware.GEMM["bf16"]
}

// attnRanks is the ranks attention's heads are split over: all under TP,
// none (each rank whole) under DP attention.
func (d Deployment) attnRanks() float64 {
	if d.Layout == TP {
		return float64(d.Ranks)
	}
	return 1
}

// WeightsPerRank is the bytes of weights each rank holds. Under TP:
// attention split by heads (kv_a and q_a whole), the dense MLPs, the
// embedding and lm_head 1/ranks, routed and shared experts 1/ranks. Under
// DP attention everything but the MoE is whole on every rank; the routed
// experts 1/ranks, the shared ones 1/ranks in gather mode and whole under
// EP, where every rank runs them on its own tokens.
func (d Deployment) WeightsPerRank() float64 {
	m, n := d.Model, float64(d.Ranks)
	wb, _ := dtypeBytes(d.WeightDType)
	perHead, whole := m.attnParams()
	attn := float64(m.Layers) * (perHead/d.attnRanks() + whole)
	shared := m.sharedParams() / n
	if d.Layout == DPEP {
		shared = m.sharedParams()
	}
	moeL := float64(m.Layers - m.DenseLayers)
	experts := moeL * (float64(m.Experts)*m.expertParams()/n + shared)
	dense := float64(m.DenseLayers) * m.denseParams()
	vocab := 2 * float64(m.Vocab) * float64(m.Hidden)
	if d.Layout == TP {
		dense, vocab = dense/n, vocab/n
	}
	return wb * (attn + experts + dense + vocab)
}

// KVPerToken is the latent cache's bytes for one token on one rank: every
// layer's kv_lora_rank + rope values. Under TP every rank holds it for
// every request; under DP attention only the request's own rank.
func (d Deployment) KVPerToken() float64 {
	kb, _ := dtypeBytes(d.KVDType)
	return float64(d.Model.Layers*d.Model.kvValues(int(d.attnRanks()))) * kb
}

// KVPool is each rank's KV-cache bytes: the budget given, or what memory
// leaves after the weights.
func (d Deployment) KVPool() (float64, error) {
	if d.KVBudget > 0 {
		return d.KVBudget, nil
	}
	w := d.WeightsPerRank()
	pool := d.Hardware.Mem*d.Hardware.MemFraction - w
	if pool <= 0 {
		return 0, fmt.Errorf("sim: %s on %d × %s (%s): the weights take %.1f GB a rank, more than the %.1f GB usable (%.0f %% of %.0f GB)",
			d.Model.Name, d.Ranks, d.Hardware.Name, d.Layout, w/1e9, d.Hardware.Mem*d.Hardware.MemFraction/1e9,
			100*d.Hardware.MemFraction, d.Hardware.Mem/1e9)
	}
	return pool, nil
}

// ErrNoFit is returned (wrapped) when not one request fits the KV budget.
var ErrNoFit = errors.New("no request fits the KV budget")

// MaxBatch is the most requests of w.Input + w.Output tokens the ranks'
// KV pools hold at once (dpattn.Account, moex run's accounting): a rank's
// pool over a request's latents, times the ranks under DP attention (each
// holds its own requests; over DPImbalance, the busiest rank's excess),
// once under TP (each holds all of them).
func (d Deployment) MaxBatch(w Workload) (int, error) {
	if err := d.Validate(); err != nil {
		return 0, err
	}
	if w.Input < 0 || w.Output < 1 {
		return 0, fmt.Errorf("sim: workload of %d input and %d output tokens: input ≥ 0 and output ≥ 1", w.Input, w.Output)
	}
	pool, err := d.KVPool()
	if err != nil {
		return 0, err
	}
	kb, _ := dtypeBytes(d.KVDType)
	need := float64(w.Input+w.Output) * d.KVPerToken()
	if !d.Model.mla() { // grouped-query: a TP rank holds its key/value heads of every request
		perRank := int(pool / need)
		if perRank < 1 {
			return 0, fmt.Errorf("sim: a request of %d tokens needs %.1f MB of KV cache a rank; the budget of %.1f MB holds none: %w",
				w.Input+w.Output, need/1e6, pool/1e6, ErrNoFit)
		}
		if d.Layout == TP {
			return perRank, nil
		}
		return max(int(float64(perRank*d.Ranks)/d.DPImbalance), min(perRank, 1)), nil
	}
	acct, err := dpattn.Account(d.Ranks, d.Model.Layers, d.Model.kvValues(1), int(kb), int64(pool))
	if err != nil && pool >= need/float64(w.Input+w.Output) {
		return 0, fmt.Errorf("sim: %w", err) // not the budget: a size Account refuses
	}
	if err != nil || acct.MaxTokensTP < int64(w.Input+w.Output) {
		return 0, fmt.Errorf("sim: a request of %d tokens needs %.1f MB of latent cache a rank; the budget of %.1f MB holds none: %w",
			w.Input+w.Output, need/1e6, pool/1e6, ErrNoFit)
	}
	perRank := int(acct.MaxTokensTP / int64(w.Input+w.Output))
	if d.Layout == TP {
		return perRank, nil
	}
	// The busiest rank holds DPImbalance times the mean: the batch is what
	// leaves it within its pool.
	return max(int(float64(perRank*d.Ranks)/d.DPImbalance), min(perRank, 1)), nil
}

// Decode is one decode step at w's batch (or the largest that fits): a
// token for each request, over its mean context (Input + Output/2).
func (d Deployment) Decode(w Workload) (Result, error) { return d.step(w, false) }

// Prefill is the prefill of w's batch of prompts (or the largest batch
// that fits) in one step: every request's Input tokens at once, attention
// over each prompt's causal prefix in the expanded (MHA) form SGLang and
// vLLM prefill MLA with, at the GEMM rate; lm_head on the last token of
// each. Its TokensPerSec are prompt tokens a second, its Step the batch's
// time to first token. (moex's own CPU prefill runs the absorbed form; it
// is not what the cpu preset was calibrated on.)
func (d Deployment) Prefill(w Workload) (Result, error) {
	if w.Input < 1 {
		return Result{}, fmt.Errorf("sim: prefill of %d-token prompts", w.Input)
	}
	return d.step(w, true)
}

func (d Deployment) step(w Workload, prefill bool) (Result, error) {
	maxB, err := d.MaxBatch(w)
	if err != nil {
		return Result{}, err
	}
	B := w.Batch
	switch {
	case B < 0:
		return Result{}, fmt.Errorf("sim: batch %d is negative", B)
	case B == 0:
		B = maxB
		if w.MaxBatch > 0 {
			B = min(B, w.MaxBatch)
		}
	case B > maxB:
		return Result{}, fmt.Errorf("sim: a batch of %d requests of %d tokens does not fit: %d do (%w)", B, w.Input+w.Output, maxB, ErrNoFit)
	}
	m, n := d.Model, float64(d.Ranks)
	hw := d.Hardware
	bw, gemm, mla := hw.MemBW, d.gemmRate(), hw.MLA
	wb, _ := dtypeBytes(d.WeightDType)
	kb, _ := dtypeBytes(d.KVDType)
	db, _ := dtypeBytes(d.DispatchDType)
	ctx, per := float64(w.Input)+float64(w.Output)/2, 1.0 // mean context; tokens a request this step
	if prefill {
		ctx, per = float64(w.Input), float64(w.Input)
	}
	L, moeL, denseL := float64(m.Layers), float64(m.Layers-m.DenseLayers), float64(m.DenseLayers)
	H, k, E := float64(m.Hidden), float64(m.TopK), float64(m.Experts)

	// The busiest attention rank's requests: all of them under TP; under
	// DP attention its share, times the straggler factor.
	rb := B
	if d.Layout != TP {
		rb = min(B, int(math.Ceil(float64(B)/n*d.DPImbalance)))
	}
	T := float64(rb) * per   // tokens through this rank's attention
	Ball := float64(B) * per // and over all ranks
	phase := "decode"
	if prefill {
		phase = "prefill"
	}
	r := Result{Phase: phase, Layout: d.Layout, Ranks: d.Ranks, Batch: B, RankBatch: rb, Context: ctx, MaxBatch: maxB,
		WeightBytes: d.WeightsPerRank(), KVBytes: float64(rb) * ctx * d.KVPerToken()}
	r.KVPool, _ = d.KVPool()
	if d.Layout != TP {
		r.IdleFraction = 1 - float64(B)/(n*float64(rb))
	}

	// roofPlus: the larger of bytes/bw and extra + flops/rate; bound
	// names it.
	roofPlus := func(name string, bytes, flops, rate, extra float64) {
		mem, c := bytes/bw, extra+flops/rate
		t, bound := mem, "memory"
		if c > mem {
			t, bound = c, "compute"
		}
		r.Stages = append(r.Stages, Stage{Name: name, Seconds: t, Bound: bound, Bytes: bytes, FLOPs: flops})
	}
	roof := func(name string, bytes, flops, rate float64) { roofPlus(name, bytes, flops, rate, 0) }
	// link: a collective moving bytes out of each rank, count times a step.
	link := func(name string, bytes, count float64) {
		bwL, lat := hw.IntraBW, hw.IntraLatency
		if d.Ranks > hw.RanksPerNode { // the ring or the exchange crosses nodes: the NIC bounds it
			bwL, lat = hw.InterBW, hw.InterLatency
		}
		if d.Ranks == 1 {
			return
		}
		r.Stages = append(r.Stages, Stage{Name: name, Seconds: count * (bytes/bwL + lat), Bound: "link", Bytes: count * bytes})
	}
	// allReduce: a ring all-reduce (or an all-gather plus reduce-scatter)
	// of bytes sends 2(n−1)/n of them from each rank (NCCL's bus
	// bandwidth definition).
	allReduce := func(name string, bytes, count float64) { link(name, 2*(n-1)/n*bytes, count) }

	// Attention. Projections: 2 FLOPs a weight a token; under TP the head
	// part is 1/n a rank. MLA decode in the absorbed form: every request
	// reads its context's latents once for all its heads (FlashMLA's bytes
	// Σs_k·576·2), and computes s_q·Σs_k·h·(576+512)·2 FLOPs (ANCHORS.md).
	perHead, whole := m.attnParams()
	projW := perHead/d.attnRanks() + whole
	roof("attention projections", L*wb*projW, L*2*T*projW, gemm)
	// Where a row costs time before the heads use it (hw.MLARow: the
	// CPU's widening), that adds to the compute side.
	heads := float64(m.Heads) / d.attnRanks()
	lat := float64(m.kvValues(int(d.attnRanks())))
	switch {
	case !m.mla() && prefill: // grouped-query: each (query, key) pair 2·head_dim FLOPs for the score, as many for the value
		S := float64(w.Input)
		pairs := L * float64(rb) * S * (S + 1) / 2
		roof("attention (GQA)", L*T*lat*kb, 2*pairs*heads*2*float64(m.HeadDim), gemm)
	case !m.mla(): // every request reads its context's keys and values once for all its heads
		rows := L * T * ctx
		roof("attention (GQA)", rows*lat*kb, 2*rows*heads*2*float64(m.HeadDim), gemm)
	case prefill:
		// A prompt of S tokens: S(S+1)/2 (query, key) pairs a head, each
		// 2·(qk_nope + qk_rope) FLOPs for the score and 2·v_head for the
		// value; its latents read once.
		S := float64(w.Input)
		pairs := L * float64(rb) * S * (S + 1) / 2
		roof("attention (MHA)", L*T*lat*kb, 2*pairs*heads*float64(m.NopeDim+m.RopeDim+m.VDim), gemm)
	default:
		rows := L * T * ctx
		roofPlus("MLA", rows*lat*kb, 2*rows*heads*(lat+float64(m.KVLoraRank)), mla, rows*hw.MLARow)
	}
	if d.Layout == TP {
		allReduce("attention all-reduce", Ball*H*actBytes, L)
	}

	// Dense MLP layers: under TP tensor-parallel over every token and
	// all-reduced; under DP attention data-parallel as attention is (each
	// rank the whole MLP over its own tokens, no collective: SGLang's
	// --moe-dense-tp-size 1, what its large EP deployments use).
	if denseL > 0 {
		if d.Layout == TP {
			roof("dense MLP", denseL*wb*m.denseParams()/n, denseL*2*T*m.denseParams()/n, gemm)
			allReduce("dense MLP all-reduce", Ball*H*actBytes, denseL)
		} else {
			roof("dense MLP", denseL*wb*m.denseParams(), denseL*2*T*m.denseParams(), gemm)
		}
	}

	// MoE. Of E experts, B tokens choosing k each leave an expert unchosen
	// with probability (1 − k/E)^B: the weights read are those of the
	// chosen experts. The busiest rank computes its share of the B·k
	// (token, expert) pairs times the EPLB imbalance.
	if moeL > 0 {
		// The router: every token a rank routes, against every expert
		// (TP and gather mode route all the step's tokens on every rank,
		// all-to-all only its own); its weights in fp32.
		routed, routerRate := Ball, gemm
		if d.Layout == DPEP {
			routed = T
		}
		if hw.Router > 0 {
			routerRate = hw.Router
		}
		roof("router", moeL*4*E*H, moeL*2*routed*E*H, routerRate)
		hit := 1 - math.Pow(1-k/E, Ball)
		pairs := Ball * k / n * d.EPLBImbalance
		switch d.Layout {
		case TP, DPGather:
			roof("MoE experts", moeL*wb*(E/n*hit*m.expertParams()+m.sharedParams()/n),
				moeL*2*(pairs*m.expertParams()+Ball*m.sharedParams()/n), gemm)
			name := "MoE all-reduce"
			if d.Layout == DPGather {
				name = "all-gather + reduce-scatter"
			}
			allReduce(name, Ball*H*actBytes, moeL)
		case DPEP:
			// Each of the rank's T tokens goes to k experts, (n−1)/n of
			// them on other ranks, one copy per (token, expert) as
			// DeepEP's low-latency kernels send; combine returns as many.
			out := T * k * (n - 1) / n * H
			link("dispatch", out*db, moeL)
			roof("MoE experts", moeL*wb*(E/n*hit*m.expertParams()+m.sharedParams()),
				moeL*2*(pairs*m.expertParams()+T*m.sharedParams()), gemm)
			link("combine", out*actBytes, moeL)
		}
	}

	// lm_head, on each request's last token: under TP vocab-parallel over
	// every request, its logits all-gathered; under DP attention each
	// rank's whole lm_head over its own (SGLang's --enable-dp-lm-head).
	if V := float64(m.Vocab); V > 0 {
		if d.Layout == TP {
			roof("lm_head", wb*V*H/n, 2*float64(rb)*V*H/n, gemm)
			// Each rank's vocabulary shard of every request's fp32
			// logits, gathered for sampling.
			link("logits all-gather", (n-1)/n*float64(B)*V*4, 1)
		} else {
			roof("lm_head", wb*V*H, 2*float64(rb)*V*H, gemm)
		}
	}

	for _, s := range r.Stages {
		r.Step += s.Seconds
	}
	r.TokensPerSec = Ball / r.Step
	return r, nil
}
