//go:build cudaemu

//go:generate go run gen_sources.go

package cudaemu

/*
#cgo CXXFLAGS: -std=c++20 -O1 -pthread -Wno-unused-function
#cgo LDFLAGS: -pthread -lstdc++
#include <stdint.h>
void moex_emu_gate(const float* logits, const float* bias, int tokens, int experts, int topK, int scoring, int method,
                   int groups, int topkGroups, int norm, float normEps, float scaling, int chooseOnLogits, float normMin,
                   int32_t* ids, float* weights);
void moex_emu_align(const int32_t* ids, int n, int lo, int experts, int block, int maxBlocks, int32_t* counts,
                    int32_t* offsets, int32_t* sorted, int32_t* blockExpert, int32_t* rows);
void moex_emu_combine(const float* out, const int32_t* rows, int tokens, int topK, int hidden, const float* shared,
                      float* y);
void moex_emu_attn_decode(int bf16, const float* q, const void* cache, const int32_t* blockTable, const int32_t* seqlens,
                          int batch, int heads, int kvHeads, int D, int dk, int dv, int voff, int window, int blockSize,
                          int maxBlocks, int splitRows, int splits, float scale, const float* sinks, float* partO,
                          float* partL, float* out, float* lse);
void moex_emu_grouped_gemm_bf16(const uint16_t* a, const uint16_t* w, const int32_t* sorted, const int32_t* blockExpert,
                                int paddedRows, int topK, int pairs, int gatherA, int N, int K, const float* weights,
                                const float* bias, const float* bias2, int act, float alpha, float limit, const float* inScale, float* c);
void moex_emu_f32_to_bf16(const float* src, uint16_t* dst, int n);
void moex_emu_grouped_gemm_fp8(const uint16_t* a, const uint8_t* w, const float* ws, int br, int bc,
                               const int32_t* sorted, const int32_t* blockExpert, int paddedRows, int topK, int pairs,
                               int gatherA, int N, int K, const float* weights, const float* bias, const float* bias2, int act, float alpha, float limit, const float* inScale, float* c);
void moex_emu_grouped_gemm_codes(const uint16_t* a, const uint8_t* w, const float* ws, const float* wo, int group, int kind,
                              const int8_t* wf, int per, const int32_t* sorted, const int32_t* blockExpert, int paddedRows, int topK, int pairs,
                              int gatherA, int N, int K, const float* weights, const float* bias, const float* bias2, int act, float alpha, float limit, const float* inScale, float* c);
void moex_emu_grouped_gemm_swiglu_codes(const uint16_t* a, const uint8_t* gate, const float* gs, const float* go,
                                        const uint8_t* up, const float* us, const float* uo, int group, int kind,
                                        const int8_t* gf, const int8_t* uf, int per, const int32_t* sorted,
                                     const int32_t* blockExpert, int paddedRows, int topK, int pairs, int N, int K,
                                     const float* bias, const float* bias2, int act, float alpha, float limit, const float* inScale, float* h);
void moex_emu_grouped_gemm_swiglu_fp8(const uint16_t* a, const uint8_t* gate, const float* gs, const uint8_t* up,
                                      const float* us, int br, int bc, const int32_t* sorted,
                                      const int32_t* blockExpert, int paddedRows, int topK, int pairs, int N, int K,
                                      const float* bias, const float* bias2, int act, float alpha, float limit, const float* inScale, float* h);
void moex_emu_grouped_gemm_swiglu_bf16(const uint16_t* a, const uint16_t* gate, const uint16_t* up, const int32_t* sorted,
                                       const int32_t* blockExpert, int paddedRows, int topK, int pairs, int N, int K,
                                       const float* bias, const float* bias2, int act, float alpha, float limit, const float* inScale, float* h);
void moex_emu_rmsnorm(float* x, int rows, int stride, int col, int width, const float* w, double eps);
void moex_emu_rope(float* x, int rows, int stride, int col, int width, int perPos, const int32_t* pos, const double* freq);
void moex_emu_copy_rows(const float* src, int srcStride, int srcCol, const int32_t* srcMap, void* dst, int dstBF16,
                        int dstStride, int dstCol, const int32_t* dstMap, int rows, int width);
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/moex-project/moex/kernels"
)

// Limits of the fused kernels.
const (
	MaxExperts = 1024
	MaxGroups  = 64
	MaxTopK    = 64
)

func f32p(v []float32) *C.float {
	if len(v) == 0 {
		return nil
	}
	return (*C.float)(unsafe.Pointer(&v[0]))
}

func i32p(v []int32) *C.int32_t {
	if len(v) == 0 {
		return nil
	}
	return (*C.int32_t)(unsafe.Pointer(&v[0]))
}

// Gate runs the gating kernel on logits [tokens, experts] with routing k
// (bias [experts] for noaux_tc, else nil): ids and weights [tokens, top_k],
// ids ascending.
func Gate(k kernels.GateArgs, logits, bias []float32) ([]int32, []float32, error) {
	E, K := int(k.Experts), int(k.TopK)
	if E < 1 || K < 1 || E > MaxExperts || K > MaxTopK || k.Groups > MaxGroups {
		return nil, nil, fmt.Errorf("cudaemu: gate: %d experts, top-%d, %d groups exceed the fused kernel's %d, %d, %d",
			E, K, k.Groups, MaxExperts, MaxTopK, MaxGroups)
	}
	if len(logits)%E != 0 {
		return nil, nil, fmt.Errorf("cudaemu: gate: %d logits are not rows of %d experts", len(logits), E)
	}
	if k.Method == kernels.GateNoAuxTC && len(bias) != E {
		return nil, nil, fmt.Errorf("cudaemu: gate: noaux_tc needs %d bias values, have %d", E, len(bias))
	}
	T := len(logits) / E
	ids := make([]int32, T*K)
	w := make([]float32, T*K)
	if T == 0 {
		return ids, w, nil
	}
	C.moex_emu_gate(f32p(logits), f32p(bias), C.int(T), C.int(k.Experts), C.int(k.TopK), C.int(k.Scoring), C.int(k.Method),
		C.int(k.Groups), C.int(k.TopKGroups), C.int(k.Norm), C.float(k.NormEps), C.float(k.Scaling), C.int(k.ChooseOnLogits),
		C.float(k.NormMin), i32p(ids), f32p(w))
	return ids, w, nil
}

// Align runs the dispatch-layout kernel on ids [tokens, top_k] (each row
// strictly ascending, each id ≥ 0) over the shard of experts lo …
// lo+experts-1 and returns the layout as kernels.NewLayout does, in the shard's
// numbering (Rows -1 for a pair whose expert is not in the shard), plus the
// shard's expert of each row block. lo = 0 and every expert: the whole layer.
func Align(ids []int32, tokens, topK, lo, experts, block int) (*kernels.Layout, []int32, error) {
	if lo < 0 || experts < 1 || experts > MaxExperts || block < 1 || topK < 1 || len(ids) != tokens*topK {
		return nil, nil, fmt.Errorf("cudaemu: align: %d ids for %d tokens × top-%d, %d experts from %d, block %d",
			len(ids), tokens, topK, experts, lo, block)
	}
	for i, e := range ids {
		if e < 0 {
			return nil, nil, fmt.Errorf("cudaemu: align: id %d at %d is negative", e, i)
		}
	}
	n := tokens * topK
	l := &kernels.Layout{Experts: experts, TopK: topK, Tokens: tokens, Block: block,
		Counts: make([]int32, experts), Offsets: make([]int32, experts+1), Rows: make([]int32, n)}
	maxRows := n + experts*(block-1)
	sorted := make([]int32, maxRows+1)
	blockExpert := make([]int32, maxRows/block+1)
	C.moex_emu_align(i32p(ids), C.int(n), C.int(lo), C.int(experts), C.int(block), C.int(len(blockExpert)), i32p(l.Counts),
		i32p(l.Offsets), i32p(sorted), i32p(blockExpert), i32p(l.Rows))
	total := int(l.Offsets[experts])
	for b, e := range blockExpert[total/block:] {
		if e != -1 {
			return nil, nil, fmt.Errorf("cudaemu: align: block %d past the layout's %d rows has expert %d, want -1", total/block+b, total, e)
		}
	}
	l.Pairs = sorted[:total]
	return l, blockExpert[:total/block], nil
}

// Combine runs the combine kernel: y [tokens, hidden] from expert outputs
// out [rows, hidden], rows [tokens·top_k] and shared [tokens, hidden] (or
// nil), as moe.Combine.
func Combine(y, out []float32, rows []int32, topK, hidden int, shared []float32) {
	T := len(rows) / topK
	if T == 0 {
		return
	}
	C.moex_emu_combine(f32p(out), i32p(rows), C.int(T), C.int(topK), C.int(hidden), f32p(shared), f32p(y))
}

// MaxDV bounds dv in the MLA decode kernel.
const MaxDV = 1024

// AttnShape is where a query head's key and value sit in a cached row of
// D values: Heads query heads over KVHeads key/value heads, keys of KeyDim
// from g·KeyDim, values of ValueDim from ValueOff + g·ValueDim for group
// g; Window > 0 attends to the last Window rows only.
type AttnShape struct {
	Heads, KVHeads, KeyDim, ValueDim, ValueOff, Window int
}

// MLADecode runs the MLA decode kernels (split-KV and merge) on q [batch,
// heads, D], a dense paged cache [blocks, blockSize, D] given as fp32
// (cacheF32) or bf16 bits (cacheBF16, the other nil), a block table
// [batch, maxBlocks] and lengths [batch]; it returns out [batch, heads, dv]
// and lse [batch, heads]. Inputs are the caller's to validate (attn.MLA
// checks the same contract).
func MLADecode(q []float32, cacheF32 []float32, cacheBF16 []uint16, blockSize, D int, blockTable []int32, maxBlocks int,
	seqlens []int32, heads, dv, splitRows int, scale float32) ([]float32, []float32, error) {
	return AttnDecode(q, cacheF32, cacheBF16, blockSize, D, blockTable, maxBlocks, seqlens,
		AttnShape{Heads: heads, KVHeads: 1, KeyDim: D, ValueDim: dv}, splitRows, scale, nil)
}

// AttnDecode is MLADecode for any shape (grouped-query attention: q
// [batch, heads, KeyDim]) and learned sinks, one a query head (nil: none).
func AttnDecode(q []float32, cacheF32 []float32, cacheBF16 []uint16, blockSize, D int, blockTable []int32, maxBlocks int,
	seqlens []int32, a AttnShape, splitRows int, scale float32, sinks []float32) ([]float32, []float32, error) {
	B, heads, dv := len(seqlens), a.Heads, a.ValueDim
	if dv < 1 || dv > MaxDV || a.KVHeads < 1 || heads%a.KVHeads != 0 || a.ValueOff+a.KVHeads*dv > D || a.KVHeads*a.KeyDim > D ||
		splitRows < 1 || len(q) != B*heads*a.KeyDim || len(blockTable) != B*maxBlocks || (sinks != nil && len(sinks) != heads) {
		return nil, nil, fmt.Errorf("cudaemu: attention decode: bad shapes (%+v, D %d, split %d)", a, D, splitRows)
	}
	maxLen := 0
	for _, l := range seqlens {
		maxLen = max(maxLen, int(l))
	}
	if a.Window > 0 {
		maxLen = min(maxLen, a.Window)
	}
	splits := max(1, (maxLen+splitRows-1)/splitRows)
	partO := make([]float32, B*heads*splits*dv)
	partL := make([]float32, B*heads*splits)
	out := make([]float32, B*heads*dv)
	lse := make([]float32, B*heads)
	if B == 0 {
		return out, lse, nil
	}
	bf16 := 0
	var cache unsafe.Pointer
	if cacheBF16 != nil {
		bf16 = 1
		cache = unsafe.Pointer(&cacheBF16[0])
	} else {
		cache = unsafe.Pointer(&cacheF32[0])
	}
	C.moex_emu_attn_decode(C.int(bf16), f32p(q), cache, i32p(blockTable), i32p(seqlens), C.int(B), C.int(heads), C.int(a.KVHeads),
		C.int(D), C.int(a.KeyDim), C.int(dv), C.int(a.ValueOff), C.int(a.Window), C.int(blockSize), C.int(maxBlocks),
		C.int(splitRows), C.int(splits), C.float(scale), f32p(sinks), f32p(partO), f32p(partL), f32p(out), f32p(lse))
	return out, lse, nil
}

// GemmBlock is the row block of the grouped GEMM kernel: layouts for it are
// padded to this many rows.
const GemmBlock = 64

// GroupedGEMMBF16 runs the tensor-core grouped GEMM: a [tokens, K] and w
// [experts, N, K] as bf16 bits, the layout (block GemmBlock) and its block
// experts, optional weights [tokens·topK]; returns c [padded rows, N] in
// layout order. K must be a multiple of 16.
func GroupedGEMMBF16(a, w []uint16, lay *kernels.Layout, blockExpert []int32, N, K int, weights []float32) ([]float32, error) {
	if lay.Block != GemmBlock || K%16 != 0 || N < 1 {
		return nil, fmt.Errorf("cudaemu: grouped gemm: layout block %d (want %d), K %d (a multiple of 16), N %d", lay.Block, GemmBlock, K, N)
	}
	rows := len(lay.Pairs)
	c := make([]float32, rows*N)
	if rows == 0 {
		return c, nil
	}
	C.moex_emu_grouped_gemm_bf16((*C.uint16_t)(unsafe.Pointer(&a[0])), (*C.uint16_t)(unsafe.Pointer(&w[0])),
		i32p(lay.Pairs), i32p(blockExpert), C.int(rows), C.int(lay.TopK), C.int(lay.Tokens*lay.TopK), 1, C.int(N), C.int(K),
		f32p(weights), nil, nil, 0, 0, 0, nil, f32p(c))
	return c, nil
}

// GroupedSwiGLUBF16 runs the fused first projection: h [padded rows, N] =
// silu(a·gateᵀ) · (a·upᵀ) per row's expert, gate and up [experts, N, K] bf16.
func GroupedSwiGLUBF16(a, gate, up []uint16, lay *kernels.Layout, blockExpert []int32, N, K int) ([]float32, error) {
	if lay.Block != GemmBlock || K%16 != 0 || N < 1 || len(gate) != len(up) {
		return nil, fmt.Errorf("cudaemu: grouped swiglu: layout block %d (want %d), K %d, N %d", lay.Block, GemmBlock, K, N)
	}
	rows := len(lay.Pairs)
	h := make([]float32, rows*N)
	if rows == 0 {
		return h, nil
	}
	C.moex_emu_grouped_gemm_swiglu_bf16((*C.uint16_t)(unsafe.Pointer(&a[0])), (*C.uint16_t)(unsafe.Pointer(&gate[0])),
		(*C.uint16_t)(unsafe.Pointer(&up[0])), i32p(lay.Pairs), i32p(blockExpert), C.int(rows), C.int(lay.TopK),
		C.int(lay.Tokens*lay.TopK), C.int(N), C.int(K), nil, nil, 0, 0, 0, nil, f32p(h))
	return h, nil
}

// Epilogue is a grouped GEMM's epilogue for the raw entry points (see
// kernels/cuda's Epilogue), in device-style pointers (nil for none): the
// biases [experts, N] of the products (the first projection's gate and up),
// the activation (a kernels.ActKind) with its constants, and the routing
// weights [pairs] that scale the first projection's products.
type Epilogue struct {
	Bias, Bias2  unsafe.Pointer
	Act          int
	Alpha, Limit float32
	InScale      unsafe.Pointer
}

// The raw entry points below take device-style pointers (here: host memory)
// for the launch code of package cuda, which drives the emulation as it
// drives a GPU.

// GateRaw launches the gating kernel.
func GateRaw(logits, bias unsafe.Pointer, tokens int, k kernels.GateArgs, ids, weights unsafe.Pointer) {
	C.moex_emu_gate((*C.float)(logits), (*C.float)(bias), C.int(tokens), C.int(k.Experts), C.int(k.TopK), C.int(k.Scoring),
		C.int(k.Method), C.int(k.Groups), C.int(k.TopKGroups), C.int(k.Norm), C.float(k.NormEps), C.float(k.Scaling),
		C.int(k.ChooseOnLogits), C.float(k.NormMin), (*C.int32_t)(ids), (*C.float)(weights))
}

// AlignRaw launches the dispatch-layout kernel over the shard of experts
// lo … lo+experts-1; blockExpert holds maxBlocks entries.
func AlignRaw(ids unsafe.Pointer, n, lo, experts, block, maxBlocks int, counts, offsets, sorted, blockExpert, rows unsafe.Pointer) {
	C.moex_emu_align((*C.int32_t)(ids), C.int(n), C.int(lo), C.int(experts), C.int(block), C.int(maxBlocks), (*C.int32_t)(counts),
		(*C.int32_t)(offsets), (*C.int32_t)(sorted), (*C.int32_t)(blockExpert), (*C.int32_t)(rows))
}

// CombineRaw launches the combine kernel.
func CombineRaw(out, rows unsafe.Pointer, tokens, topK, hidden int, shared, y unsafe.Pointer) {
	C.moex_emu_combine((*C.float)(out), (*C.int32_t)(rows), C.int(tokens), C.int(topK), C.int(hidden), (*C.float)(shared),
		(*C.float)(y))
}

// GroupedGEMMRaw launches the grouped GEMM.
func GroupedGEMMRaw(a, w, sorted, blockExpert unsafe.Pointer, paddedRows, topK, pairs int, gatherA bool, N, K int, weights unsafe.Pointer, ep Epilogue, c unsafe.Pointer) {
	g := 0
	if gatherA {
		g = 1
	}
	C.moex_emu_grouped_gemm_bf16((*C.uint16_t)(a), (*C.uint16_t)(w), (*C.int32_t)(sorted), (*C.int32_t)(blockExpert),
		C.int(paddedRows), C.int(topK), C.int(pairs), C.int(g), C.int(N), C.int(K), (*C.float)(weights), (*C.float)(ep.Bias), (*C.float)(ep.Bias2), C.int(ep.Act), C.float(ep.Alpha), C.float(ep.Limit), (*C.float)(ep.InScale), (*C.float)(c))
}

// GroupedGEMMFP8Raw launches the grouped GEMM on FP8 weights w with block
// scales ws in blocks of [br, bc].
func GroupedGEMMFP8Raw(a, w, ws unsafe.Pointer, br, bc int, sorted, blockExpert unsafe.Pointer, paddedRows, topK, pairs int,
	gatherA bool, N, K int, weights unsafe.Pointer, ep Epilogue, c unsafe.Pointer) {
	g := 0
	if gatherA {
		g = 1
	}
	C.moex_emu_grouped_gemm_fp8((*C.uint16_t)(a), (*C.uint8_t)(w), (*C.float)(ws), C.int(br), C.int(bc), (*C.int32_t)(sorted),
		(*C.int32_t)(blockExpert), C.int(paddedRows), C.int(topK), C.int(pairs), C.int(g), C.int(N), C.int(K),
		(*C.float)(weights), (*C.float)(ep.Bias), (*C.float)(ep.Bias2), C.int(ep.Act), C.float(ep.Alpha), C.float(ep.Limit), (*C.float)(ep.InScale), (*C.float)(c))
}

// GroupedSwiGLUFP8Raw launches the fused first projection on FP8 gate and
// up weights with their block scales.
func GroupedSwiGLUFP8Raw(a, gate, gs, up, us unsafe.Pointer, br, bc int, sorted, blockExpert unsafe.Pointer, paddedRows, topK,
	pairs, N, K int, ep Epilogue, h unsafe.Pointer) {
	C.moex_emu_grouped_gemm_swiglu_fp8((*C.uint16_t)(a), (*C.uint8_t)(gate), (*C.float)(gs), (*C.uint8_t)(up), (*C.float)(us),
		C.int(br), C.int(bc), (*C.int32_t)(sorted), (*C.int32_t)(blockExpert), C.int(paddedRows), C.int(topK), C.int(pairs),
		C.int(N), C.int(K), (*C.float)(ep.Bias), (*C.float)(ep.Bias2), C.int(ep.Act), C.float(ep.Alpha), C.float(ep.Limit), (*C.float)(ep.InScale), (*C.float)(h))
}

// GroupedGEMMCodesRaw launches the grouped GEMM on integer-code weights w
// with a scale (and, wo not nil, an offset) per group of k, or with
// K-quant factors wf (per > 0: see grouped_gemm.cu's CodeWeights); kind:
// 0 MXFP4, 1 INT4, 2 UINT4, 3 INT8, 4–6 5- and 6-bit codes, plus 16 for
// E8M0 scale bytes, 32 for fp16 scales and offsets.
func GroupedGEMMCodesRaw(a, w, ws, wo unsafe.Pointer, group, kind int, wf unsafe.Pointer, per int, sorted, blockExpert unsafe.Pointer, paddedRows, topK, pairs int,
	gatherA bool, N, K int, weights unsafe.Pointer, ep Epilogue, c unsafe.Pointer) {
	g := 0
	if gatherA {
		g = 1
	}
	C.moex_emu_grouped_gemm_codes((*C.uint16_t)(a), (*C.uint8_t)(w), (*C.float)(ws), (*C.float)(wo), C.int(group), C.int(kind),
		(*C.int8_t)(wf), C.int(per), (*C.int32_t)(sorted),
		(*C.int32_t)(blockExpert), C.int(paddedRows), C.int(topK), C.int(pairs), C.int(g), C.int(N), C.int(K),
		(*C.float)(weights), (*C.float)(ep.Bias), (*C.float)(ep.Bias2), C.int(ep.Act), C.float(ep.Alpha), C.float(ep.Limit), (*C.float)(ep.InScale), (*C.float)(c))
}

// GroupedSwiGLUCodesRaw launches the fused first projection on
// integer-code gate and up weights with their scales and offsets (or nil)
// and factors (per > 0).
func GroupedSwiGLUCodesRaw(a, gate, gs, gOff, up, us, uOff unsafe.Pointer, group, kind int, gf, uf unsafe.Pointer, per int, sorted, blockExpert unsafe.Pointer, paddedRows, topK,
	pairs, N, K int, ep Epilogue, h unsafe.Pointer) {
	C.moex_emu_grouped_gemm_swiglu_codes((*C.uint16_t)(a), (*C.uint8_t)(gate), (*C.float)(gs), (*C.float)(gOff), (*C.uint8_t)(up), (*C.float)(us), (*C.float)(uOff),
		C.int(group), C.int(kind), (*C.int8_t)(gf), (*C.int8_t)(uf), C.int(per), (*C.int32_t)(sorted), (*C.int32_t)(blockExpert), C.int(paddedRows), C.int(topK), C.int(pairs),
		C.int(N), C.int(K), (*C.float)(ep.Bias), (*C.float)(ep.Bias2), C.int(ep.Act), C.float(ep.Alpha), C.float(ep.Limit), (*C.float)(ep.InScale), (*C.float)(h))
}

// GroupedSwiGLURaw launches the fused first projection.
func GroupedSwiGLURaw(a, gate, up, sorted, blockExpert unsafe.Pointer, paddedRows, topK, pairs, N, K int, ep Epilogue, h unsafe.Pointer) {
	C.moex_emu_grouped_gemm_swiglu_bf16((*C.uint16_t)(a), (*C.uint16_t)(gate), (*C.uint16_t)(up), (*C.int32_t)(sorted),
		(*C.int32_t)(blockExpert), C.int(paddedRows), C.int(topK), C.int(pairs), C.int(N), C.int(K), (*C.float)(ep.Bias), (*C.float)(ep.Bias2), C.int(ep.Act), C.float(ep.Alpha), C.float(ep.Limit), (*C.float)(ep.InScale), (*C.float)(h))
}

// F32ToBF16Raw launches the conversion kernel.
func F32ToBF16Raw(src, dst unsafe.Pointer, n int) {
	C.moex_emu_f32_to_bf16((*C.float)(src), (*C.uint16_t)(dst), C.int(n))
}

// AttnDecodeRaw launches decode attention (MLA's or grouped-query's: see
// kernels/cuda/mla_decode.cu) and its merge; sinks may be nil.
func AttnDecodeRaw(bf16 bool, q, cache, blockTable, seqlens unsafe.Pointer, batch, heads, kvHeads, D, dk, dv, voff, window,
	blockSize, maxBlocks, splitRows, splits int, scale float32, sinks, partO, partL, out, lse unsafe.Pointer) {
	b := 0
	if bf16 {
		b = 1
	}
	C.moex_emu_attn_decode(C.int(b), (*C.float)(q), cache, (*C.int32_t)(blockTable), (*C.int32_t)(seqlens), C.int(batch),
		C.int(heads), C.int(kvHeads), C.int(D), C.int(dk), C.int(dv), C.int(voff), C.int(window), C.int(blockSize),
		C.int(maxBlocks), C.int(splitRows), C.int(splits), C.float(scale), (*C.float)(sinks), (*C.float)(partO),
		(*C.float)(partL), (*C.float)(out), (*C.float)(lse))
}

// RMSNormRaw launches the RMSNorm kernel over rows of x.
func RMSNormRaw(x unsafe.Pointer, rows, stride, col, width int, w unsafe.Pointer, eps float64) {
	C.moex_emu_rmsnorm((*C.float)(x), C.int(rows), C.int(stride), C.int(col), C.int(width), (*C.float)(w), C.double(eps))
}

// RopeRaw launches the rotary-embedding kernel over rows of x.
func RopeRaw(x unsafe.Pointer, rows, stride, col, width, perPos int, pos, freq unsafe.Pointer) {
	C.moex_emu_rope((*C.float)(x), C.int(rows), C.int(stride), C.int(col), C.int(width), C.int(perPos), (*C.int32_t)(pos),
		(*C.double)(freq))
}

// CopyRowsRaw launches the row-copy kernel.
func CopyRowsRaw(src unsafe.Pointer, srcStride, srcCol int, srcMap, dst unsafe.Pointer, dstBF16 bool, dstStride, dstCol int,
	dstMap unsafe.Pointer, rows, width int) {
	b := 0
	if dstBF16 {
		b = 1
	}
	C.moex_emu_copy_rows((*C.float)(src), C.int(srcStride), C.int(srcCol), (*C.int32_t)(srcMap), dst, C.int(b),
		C.int(dstStride), C.int(dstCol), (*C.int32_t)(dstMap), C.int(rows), C.int(width))
}
