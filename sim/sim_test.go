package sim

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestParams: the presets' parameter counts are the published totals
// (the models' papers and cards; MTP modules and norms not counted):
// DeepSeek-V2 and Coder-V2 236B, V2-Lite 15.7B, V3 671B, Kimi K2 1T.
func TestParams(t *testing.T) {
	for name, want := range map[string]float64{"deepseek-v2": 236e9, "deepseek-coder-v2": 236e9, "deepseek-v2-lite": 15.7e9,
		"deepseek-v3": 671e9, "kimi-k2": 1.0e12} {
		m, err := ModelPreset(name)
		require.NoError(t, err)
		require.InEpsilon(t, want, m.Params(), 0.03, name)
	}
}

// TestLoadModel reads DeepSeek-V3's config.json (its published fields) and
// gets the preset; Qwen3-30B-A3B's (grouped-query attention) gets its.
func TestLoadModel(t *testing.T) {
	dir := t.TempDir()
	v3 := `{"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
	  "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
	  "n_shared_experts": 1, "n_routed_experts": 256, "num_experts_per_tok": 8, "routed_scaling_factor": 2.5,
	  "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
	  "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4, "norm_topk_prob": true, "scoring_func": "sigmoid",
	  "first_k_dense_replace": 3, "moe_layer_freq": 1, "vocab_size": 129280, "rms_norm_eps": 1e-6}`
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"), []byte(v3), 0o644))
	m, err := LoadModel(dir)
	require.NoError(t, err)
	want, err := ModelPreset("deepseek-v3")
	require.NoError(t, err)
	want.Name = m.Name
	require.Equal(t, want, m)

	qwen := `{"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48,
	  "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
	  "moe_intermediate_size": 768, "intermediate_size": 6144, "norm_topk_prob": true, "decoder_sparse_step": 1,
	  "mlp_only_layers": [], "vocab_size": 151936}`
	path := filepath.Join(dir, "qwen.json")
	require.NoError(t, os.WriteFile(path, []byte(qwen), 0o644))
	m, err = LoadModel(path)
	require.NoError(t, err)
	want, err = ModelPreset("qwen3-30b-a3b")
	require.NoError(t, err)
	want.Name, want.DenseInter = m.Name, 6144 // intermediate_size, which no layer uses
	require.Equal(t, want, m)
}

// TestGroupedQuery: a grouped-query model's KV cache per token and rank —
// every layer's keys and values of the rank's key/value heads (4 heads over
// 8 TP ranks: one each, replicated) — and a decode step under each layout.
func TestGroupedQuery(t *testing.T) {
	m, err := ModelPreset("qwen3-30b-a3b")
	require.NoError(t, err)
	for _, c := range []struct {
		layout Layout
		kv     float64
	}{{TP, 48 * 2 * 128 * 1 * 2}, {DPEP, 48 * 2 * 128 * 4 * 2}, {DPGather, 48 * 2 * 128 * 4 * 2}} {
		d := Deployment{Model: m, Hardware: h100(t), Layout: c.layout, Ranks: 8, WeightDType: "bf16", KVDType: "bf16",
			DispatchDType: "bf16", EPLBImbalance: 1, DPImbalance: 1}
		require.Equal(t, c.kv, d.KVPerToken(), "%v", c.layout)
		r, err := d.Decode(Workload{Input: 1024, Output: 256, Batch: 64})
		require.NoError(t, err)
		require.Positive(t, r.Step)
		names := ""
		for _, st := range r.Stages {
			names += st.Name + ","
		}
		require.Contains(t, names, "attention (GQA)")
	}
}

func h100(t *testing.T) Hardware {
	h, err := GPUPreset("h100")
	require.NoError(t, err)
	return h
}

// toy is a small model and machine whose step a test can work out by hand.
func toy() Deployment {
	m := Model{Name: "toy", Layers: 1, Hidden: 1024, Heads: 8, KVLoraRank: 256, NopeDim: 64, RopeDim: 32, VDim: 64,
		Experts: 16, TopK: 2, ExpertInter: 512}
	h := Hardware{Name: "toy", Mem: 1e12, MemFraction: 1, MemBW: 1e12, GEMM: map[string]float64{"bf16": 1e15}, MLA: 1e15,
		IntraBW: 1e11, IntraLatency: 1e-5, InterBW: 1e10, InterLatency: 2e-5, RanksPerNode: 8}
	return Deployment{Model: m, Hardware: h, Layout: DPEP, Ranks: 2, WeightDType: "bf16", KVDType: "bf16", DispatchDType: "bf16",
		EPLBImbalance: 1, DPImbalance: 1}
}

// TestToyStep: each stage of one decode step of the toy, worked out by
// hand from the model's definition (all memory- or link-bound there).
func TestToyStep(t *testing.T) {
	d := toy()
	r, err := d.Decode(Workload{Input: 100, Output: 2, Batch: 2})
	require.NoError(t, err)
	// Projections: q 1024·8·96, kv_b 256·8·128, o 8·64·1024, kv_a 1024·288 weights, bf16.
	proj := 2.0 * (1024*8*96 + 256*8*128 + 8*64*1024 + 1024*288)
	// MLA: one request a rank, 101 cached rows of 288 bf16 values.
	mla := 2.0 * 101 * 288
	// MoE: 2 tokens choosing 2 of 16 leave an expert unchosen with
	// probability (14/16)²; the rank reads its 8 experts' chosen share.
	experts := 2.0 * 8 * (1 - 14.0/16*14.0/16) * 3 * 1024 * 512
	// Dispatch and combine: 1 token × 2 experts, half of them remote, 1024 bf16 values.
	link := 2.0*1024/1e11 + 1e-5
	// The router: its fp32 [16, 1024] weights read for one token.
	router := 4.0 * 16 * 1024
	want := map[string]float64{"attention projections": proj / 1e12, "MLA": mla / 1e12, "dispatch": link,
		"router": router / 1e12, "MoE experts": experts / 1e12, "combine": link}
	requireStages(t, r, want)
	require.InEpsilon(t, 2/(proj/1e12+mla/1e12+2*link+router/1e12+experts/1e12), r.TokensPerSec, 1e-12)
	require.Equal(t, 1, r.RankBatch)
}

// requireStages: r has exactly the stages of want, each the seconds want
// gives.
func requireStages(t *testing.T, r Result, want map[string]float64) {
	t.Helper()
	got := map[string]float64{}
	for _, s := range r.Stages {
		got[s.Name] = s.Seconds
	}
	require.Len(t, got, len(want))
	for name, w := range want {
		require.InEpsilon(t, w, got[name], 1e-12, name)
	}
}

// TestToyPrefill: the toy's prefill of one 100-token prompt a rank, by
// hand: compute-bound attention over the causal prefix, the projections
// over every prompt token, the experts' weights read once.
func TestToyPrefill(t *testing.T) {
	d := toy()
	d.Hardware.GEMM["bf16"] = 1e12 // compute-bound where FLOPs are many
	r, err := d.Prefill(Workload{Input: 100, Output: 2, Batch: 2})
	require.NoError(t, err)
	require.Equal(t, "prefill", r.Phase)
	proj := 1024.0*8*96 + 256*8*128 + 8*64*1024 + 1024*288 // weights
	// 100 tokens: 2·100 FLOPs a weight against 2 B a weight read.
	mha := 2 * (100.0 * 101 / 2) * 8 * (64 + 32 + 64) // 5050 pairs, 8 heads
	// 100 tokens × 2 experts, half remote, 1024 bf16 values.
	link := 100*2*0.5*1024*2/1e11 + 1e-5
	// 200 tokens over both ranks choose experts: all 16 chosen with
	// probability 1 − (14/16)^200; the rank computes 200 of the 200·2 pairs.
	experts := math.Max(2*8*(1-math.Pow(14.0/16, 200))*3*1024*512/1e12, 2*200*3*1024*512/1e12)
	want := map[string]float64{"attention projections": math.Max(2*proj/1e12, 2*100*proj/1e12),
		"attention (MHA)": math.Max(100*288*2/1e12, mha/1e12), "dispatch": link, "MoE experts": experts, "combine": link,
		"router": 2 * 100 * 16 * 1024 / 1e12} // the rank's 100 tokens against 16 experts, compute-bound
	requireStages(t, r, want)
	require.InEpsilon(t, 200/r.Step, r.TokensPerSec, 1e-12)
	require.Zero(t, r.IdleFraction)
	_, err = d.Prefill(Workload{Input: 0, Output: 2})
	require.ErrorContains(t, err, "prefill of 0-token prompts")
}

// TestCapacity: DP attention holds ranks times TP's requests, the pool
// being memory less the weights; a budget that holds no request is
// ErrNoFit.
func TestCapacity(t *testing.T) {
	m, err := ModelPreset("deepseek-v2-lite")
	require.NoError(t, err)
	d := Deployment{Model: m, Hardware: h100(t), Ranks: 4, WeightDType: "bf16", KVDType: "bf16", DispatchDType: "bf16",
		EPLBImbalance: 1, DPImbalance: 1, KVBudget: 16 << 30}
	w := Workload{Input: 1000, Output: 24}
	perRequest := 1024.0 * 27 * 576 * 2 // tokens × layers × latent values × bf16
	for _, l := range Layouts {
		d.Layout = l
		got, err := d.MaxBatch(w)
		require.NoError(t, err)
		want := int(math.Floor(16 * (1 << 30) / perRequest))
		if l != TP {
			want *= 4
		}
		require.Equal(t, want, got, l)
	}
	d.KVBudget = 1 << 20
	_, err = d.MaxBatch(w)
	require.ErrorIs(t, err, ErrNoFit)
	require.ErrorContains(t, err, "holds none")
	_, err = d.Decode(Workload{Input: 10, Output: 10, Batch: 100000})
	require.ErrorIs(t, err, ErrNoFit)
}

// TestSGLangDPAttention reproduces SGLang v0.4's 1.9× decode throughput of
// DP attention over TP for DeepSeek-Coder-V2 on 8 × H100 (1 input token,
// 512 output) within ±25 %, under the assumptions the README states: fp8
// weights (in bf16 DP attention does not fit: its replicated attention
// weights leave no memory) and a benchmark keeping 1,536 requests in
// flight, all of which DP attention holds and TP, at 1,138, does not.
func TestSGLangDPAttention(t *testing.T) {
	m, err := ModelPreset("deepseek-coder-v2")
	require.NoError(t, err)
	d := Deployment{Model: m, Hardware: h100(t), Ranks: 8, WeightDType: "fp8", KVDType: "bf16", DispatchDType: "bf16",
		EPLBImbalance: 1, DPImbalance: 1}
	w := Workload{Input: 1, Output: 512, MaxBatch: 1536}
	tput := map[Layout]float64{}
	for _, l := range []Layout{TP, DPGather} {
		d.Layout = l
		r, err := d.Decode(w)
		require.NoError(t, err)
		tput[l] = r.TokensPerSec
	}
	require.InDelta(t, 1.9, tput[DPGather]/tput[TP], 0.25*1.9)
	d.WeightDType = "bf16"
	_, err = d.Decode(w)
	require.ErrorContains(t, err, "the weights take")
}

// TestDeepEPLowLatency: the all-to-all stages at EP256 with DeepEP's
// low-latency setting (128 tokens a rank, hidden 7168, top-8, fp8
// dispatch, bf16 combine, one 400 Gb/s NIC a GPU) take what DeepEP's
// README measured on H800, 194 µs and 360 µs a layer, within 15 % — the
// internode rate came from its other table (normal kernels at EP16).
func TestDeepEPLowLatency(t *testing.T) {
	m, err := ModelPreset("deepseek-v3")
	require.NoError(t, err)
	d := Deployment{Model: m, Hardware: h100(t), Layout: DPEP, Ranks: 256, WeightDType: "fp8", KVDType: "bf16",
		DispatchDType: "fp8", EPLBImbalance: 1, DPImbalance: 1}
	r, err := d.Decode(Workload{Input: 1000, Output: 100, Batch: 128 * 256})
	require.NoError(t, err)
	moeLayers := float64(m.Layers - m.DenseLayers)
	for _, s := range r.Stages {
		switch s.Name {
		case "dispatch":
			require.InEpsilon(t, 194e-6, s.Seconds/moeLayers, 0.15)
		case "combine":
			require.InEpsilon(t, 360e-6, s.Seconds/moeLayers, 0.15)
		}
	}
}

// TestCrossing: gather mode gathers every rank's tokens, all-to-all sends
// each token's top-k copies: all-to-all wins as tokens × ranks grow, and
// over several nodes gather mode falls far behind.
func TestCrossing(t *testing.T) {
	m, err := ModelPreset("deepseek-v3")
	require.NoError(t, err)
	h, err := GPUPreset("h200")
	require.NoError(t, err)
	d := Deployment{Model: m, Hardware: h, Ranks: 64, WeightDType: "fp8", KVDType: "bf16", DispatchDType: "fp8",
		EPLBImbalance: 1, DPImbalance: 1}
	pts, err := Sweep(d, Workload{Input: 2048, Output: 1024}, []Layout{DPGather, DPEP}, AxisBatch, []int{64, 8192})
	require.NoError(t, err)
	byKey := map[[2]int]float64{}
	for _, p := range pts {
		require.NotNil(t, p.Result, p.Err)
		l := 0
		if p.Layout == DPEP {
			l = 1
		}
		byKey[[2]int{l, p.X}] = p.Result.TokensPerSec
	}
	t.Logf("all-to-all over gather: %.2f at 64 requests, %.2f at 8192", byKey[[2]int{1, 64}]/byKey[[2]int{0, 64}],
		byKey[[2]int{1, 8192}]/byKey[[2]int{0, 8192}])
	require.Greater(t, byKey[[2]int{1, 8192}]/byKey[[2]int{0, 8192}], 2*byKey[[2]int{1, 64}]/byKey[[2]int{0, 64}])
	require.Greater(t, byKey[[2]int{1, 8192}], 2*byKey[[2]int{0, 8192}])
}

// TestBadInput: each names its problem.
func TestBadInput(t *testing.T) {
	_, err := GPUPreset("h900")
	require.ErrorContains(t, err, `unknown hardware preset "h900"`)
	require.ErrorContains(t, err, "h200")
	_, err = ModelPreset("gpt-5")
	require.ErrorContains(t, err, `unknown model preset "gpt-5"`)
	_, err = ParseLayout("pp")
	require.ErrorContains(t, err, `unknown layout "pp"`)
	_, err = ParseAxis("heads")
	require.ErrorContains(t, err, `unknown sweep axis "heads"`)

	d := toy()
	d.Ranks = 0
	_, err = d.Decode(Workload{Input: 1, Output: 1})
	require.ErrorContains(t, err, "0 ranks")
	d = toy()
	d.EPLBImbalance = 0.5
	_, err = d.Decode(Workload{Input: 1, Output: 1})
	require.ErrorContains(t, err, "imbalance")
	d = toy()
	d.WeightDType = "int3"
	_, err = d.Decode(Workload{Input: 1, Output: 1})
	require.ErrorContains(t, err, `unknown dtype "int3"`)
	d = toy()
	_, err = d.Decode(Workload{Input: 1, Output: 0})
	require.ErrorContains(t, err, "output ≥ 1")
	d.Hardware.Mem = 1 // the weights cannot fit
	_, err = d.Decode(Workload{Input: 1, Output: 1})
	require.ErrorContains(t, err, "the weights take")
	_, err = Sweep(toy(), Workload{Input: 1, Output: 1}, Layouts, AxisRanks, []int{0})
	require.ErrorContains(t, err, "ranks 0")

	path := filepath.Join(t.TempDir(), "hw.json")
	require.NoError(t, os.WriteFile(path, []byte(`{"mem_bw": -1}`), 0o644))
	_, err = LoadHardware(path, h100(t))
	require.ErrorContains(t, err, "mem_bw is -1")
	require.NoError(t, os.WriteFile(path, []byte(`{"mem_bw": "fast"}`), 0o644))
	_, err = LoadHardware(path, h100(t))
	require.Error(t, err)
}

// TestLoadHardware: a file overrides the fields it names and keeps the
// others.
func TestLoadHardware(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hw.json")
	require.NoError(t, os.WriteFile(path, []byte(`{"name": "h100-ib200", "inter_bw": 21.5e9}`), 0o644))
	h, err := LoadHardware(path, h100(t))
	require.NoError(t, err)
	require.Equal(t, 21.5e9, h.InterBW)
	require.Equal(t, h100(t).MemBW, h.MemBW)
	require.Equal(t, "h100-ib200", h.Name)
}

// TestPlot draws a sweep to SVG and PNG.
func TestPlot(t *testing.T) {
	m, err := ModelPreset("deepseek-v2")
	require.NoError(t, err)
	d := Deployment{Model: m, Hardware: h100(t), Ranks: 8, WeightDType: "fp8", KVDType: "bf16", DispatchDType: "bf16",
		EPLBImbalance: 1, DPImbalance: 1}
	w := Workload{Input: 1024, Output: 256}
	vals := BatchValues(d, w, Layouts)
	require.Contains(t, vals, 1)
	pts, err := Sweep(d, w, Layouts, AxisBatch, vals)
	require.NoError(t, err)
	dir := t.TempDir()
	svg := filepath.Join(dir, "p.svg")
	require.NoError(t, Plot(pts, AxisBatch, "deepseek-v2 on 8 × h100", svg))
	data, err := os.ReadFile(svg)
	require.NoError(t, err)
	for _, l := range Layouts {
		require.Contains(t, string(data), string(l))
	}
	png := filepath.Join(dir, "p.png")
	require.NoError(t, Plot(pts, AxisBatch, "x", png))
	data, err = os.ReadFile(png)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(data), "\x89PNG"))
	require.ErrorContains(t, Plot(pts, AxisBatch, "x", filepath.Join(dir, "p.gif")), ".png, .svg or .pdf")
	require.ErrorContains(t, Plot(nil, AxisBatch, "x", svg), "no point")

	// The points marshal (moex sim --format json) and read back.
	data, err = json.Marshal(pts)
	require.NoError(t, err)
	var back []Point
	require.NoError(t, json.Unmarshal(data, &back))
	require.Equal(t, pts, back)
}
