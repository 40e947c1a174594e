//go:build cudaemu

// The CUDA kernels of kernels/cuda compiled for the CPU emulation, with C
// entry points that launch them as a GPU launcher would.
#include "../emu/cuda_emu.h"
#include "../cuda/moex.cu"

#include <mutex>

// Launches share the emulation's static __shared__ storage: one at a time.
static std::mutex launchMu;

extern "C" {

void moex_emu_gate(const float* logits, const float* bias, int tokens, int experts, int topK, int scoring, int method,
                   int groups, int topkGroups, int norm, float normEps, float scaling, int chooseOnLogits, float normMin,
                   int32_t* ids, float* weights) {
  std::lock_guard<std::mutex> lock(launchMu);
  moex::GateParams p{experts, topK, scoring, method, groups, topkGroups, norm, normEps, scaling, chooseOnLogits, normMin};
  emu::launch(dim3(tokens), dim3(moex::kGateThreads), moex::moex_gate, logits, bias, p, ids, weights);
}

void moex_emu_align(const int32_t* ids, int n, int lo, int experts, int block, int maxBlocks, int32_t* counts,
                    int32_t* offsets, int32_t* sorted, int32_t* blockExpert, int32_t* rows) {
  std::lock_guard<std::mutex> lock(launchMu);
  emu::launch(dim3(1), dim3(moex::kAlignThreads), moex::moex_align, ids, n, lo, experts, block, maxBlocks, counts, offsets,
              sorted, blockExpert, rows);
}

void moex_emu_combine(const float* out, const int32_t* rows, int tokens, int topK, int hidden, const float* shared,
                      float* y) {
  std::lock_guard<std::mutex> lock(launchMu);
  emu::launch(dim3(tokens), dim3(64), moex::moex_combine, out, rows, topK, hidden, shared, y);
}

void moex_emu_attn_decode(int bf16, const float* q, const void* cache, const int32_t* blockTable, const int32_t* seqlens,
                          int batch, int heads, int kvHeads, int D, int dk, int dv, int voff, int window, int blockSize,
                          int maxBlocks, int splitRows, int splits, float scale, const float* sinks, float* partO,
                          float* partL, float* out, float* lse) {
  std::lock_guard<std::mutex> lock(launchMu);
  dim3 grid(batch * heads, splits);
  moex::AttnShape a{heads, kvHeads, D, dk, dv, voff, window};
  if (bf16)
    emu::launch(grid, dim3(moex::kMLAThreads), moex::moex_attn_decode_bf16, q, (const uint16_t*)cache, blockTable,
                seqlens, a, blockSize, maxBlocks, splitRows, splits, scale, partO, partL);
  else
    emu::launch(grid, dim3(moex::kMLAThreads), moex::moex_attn_decode_f32, q, (const float*)cache, blockTable, seqlens,
                a, blockSize, maxBlocks, splitRows, splits, scale, partO, partL);
  emu::launch(dim3(batch * heads), dim3(128), moex::moex_attn_merge, (const float*)partO, (const float*)partL, splits,
              dv, sinks, heads, out, lse);
}

void moex_emu_grouped_gemm_bf16(const uint16_t* a, const uint16_t* w, const int32_t* sorted, const int32_t* blockExpert,
                                int paddedRows, int topK, int pairs, int gatherA, int N, int K, const float* weights,
                                const float* bias, const float* bias2, int act, float alpha, float limit, const float* inScale, float* c) {
  std::lock_guard<std::mutex> lock(launchMu);
  dim3 grid(paddedRows / moex::kGemmBM, (N + moex::kGemmBN - 1) / moex::kGemmBN);
  emu::launch(grid, dim3(moex::kGemmThreads), moex::moex_grouped_gemm_bf16, a, w, sorted, blockExpert, topK, pairs,
              gatherA, N, K, weights, bias, bias2, act, alpha, limit, inScale, c);
}

void moex_emu_grouped_gemm_fp8(const uint16_t* a, const uint8_t* w, const float* ws, int br, int bc,
                               const int32_t* sorted, const int32_t* blockExpert, int paddedRows, int topK, int pairs,
                               int gatherA, int N, int K, const float* weights, const float* bias, const float* bias2, int act, float alpha, float limit, const float* inScale, float* c) {
  std::lock_guard<std::mutex> lock(launchMu);
  dim3 grid(paddedRows / moex::kGemmBM, (N + moex::kGemmBN - 1) / moex::kGemmBN);
  emu::launch(grid, dim3(moex::kGemmThreads), moex::moex_grouped_gemm_fp8, a, w, ws, br, bc, sorted, blockExpert, topK,
              pairs, gatherA, N, K, weights, bias, bias2, act, alpha, limit, inScale, c);
}

void moex_emu_grouped_gemm_swiglu_fp8(const uint16_t* a, const uint8_t* gate, const float* gs, const uint8_t* up,
                                      const float* us, int br, int bc, const int32_t* sorted,
                                      const int32_t* blockExpert, int paddedRows, int topK, int pairs, int N, int K,
                                      const float* bias, const float* bias2, int act, float alpha, float limit, const float* inScale, float* h) {
  std::lock_guard<std::mutex> lock(launchMu);
  dim3 grid(paddedRows / moex::kGemmBM, (N + moex::kGemmBN - 1) / moex::kGemmBN);
  emu::launch(grid, dim3(moex::kGemmThreads), moex::moex_grouped_gemm_swiglu_fp8, a, gate, gs, up, us, br, bc, sorted,
              blockExpert, topK, pairs, N, K, bias, bias2, act, alpha, limit, inScale, h);
}

void moex_emu_grouped_gemm_codes(const uint16_t* a, const uint8_t* w, const float* ws, const float* wo, int group, int kind,
                              const int8_t* wf, int per, const int32_t* sorted, const int32_t* blockExpert, int paddedRows, int topK, int pairs,
                              int gatherA, int N, int K, const float* weights, const float* bias, const float* bias2, int act, float alpha, float limit, const float* inScale, float* c) {
  std::lock_guard<std::mutex> lock(launchMu);
  dim3 grid(paddedRows / moex::kGemmBM, (N + moex::kGemmBN - 1) / moex::kGemmBN);
  emu::launch(grid, dim3(moex::kGemmThreads), moex::moex_grouped_gemm_codes, a, w, ws, wo, group, kind, wf, per, sorted, blockExpert,
              topK, pairs, gatherA, N, K, weights, bias, bias2, act, alpha, limit, inScale, c);
}

void moex_emu_grouped_gemm_swiglu_codes(const uint16_t* a, const uint8_t* gate, const float* gs, const float* go,
                                        const uint8_t* up, const float* us, const float* uo, int group, int kind,
                                        const int8_t* gf, const int8_t* uf, int per, const int32_t* sorted,
                                     const int32_t* blockExpert, int paddedRows, int topK, int pairs, int N, int K,
                                     const float* bias, const float* bias2, int act, float alpha, float limit, const float* inScale, float* h) {
  std::lock_guard<std::mutex> lock(launchMu);
  dim3 grid(paddedRows / moex::kGemmBM, (N + moex::kGemmBN - 1) / moex::kGemmBN);
  emu::launch(grid, dim3(moex::kGemmThreads), moex::moex_grouped_gemm_swiglu_codes, a, gate, gs, go, up, us, uo, group, kind, gf, uf, per,
              sorted, blockExpert, topK, pairs, N, K, bias, bias2, act, alpha, limit, inScale, h);
}

void moex_emu_f32_to_bf16(const float* src, uint16_t* dst, int n) {
  std::lock_guard<std::mutex> lock(launchMu);
  emu::launch(dim3(4), dim3(64), moex::moex_f32_to_bf16, src, dst, n);
}

void moex_emu_grouped_gemm_swiglu_bf16(const uint16_t* a, const uint16_t* gate, const uint16_t* up, const int32_t* sorted,
                                       const int32_t* blockExpert, int paddedRows, int topK, int pairs, int N, int K,
                                       const float* bias, const float* bias2, int act, float alpha, float limit, const float* inScale, float* h) {
  std::lock_guard<std::mutex> lock(launchMu);
  dim3 grid(paddedRows / moex::kGemmBM, (N + moex::kGemmBN - 1) / moex::kGemmBN);
  emu::launch(grid, dim3(moex::kGemmThreads), moex::moex_grouped_gemm_swiglu_bf16, a, gate, up, sorted, blockExpert, topK,
              pairs, N, K, bias, bias2, act, alpha, limit, inScale, h);
}

void moex_emu_rmsnorm(float* x, int rows, int stride, int col, int width, const float* w, double eps) {
  std::lock_guard<std::mutex> lock(launchMu);
  emu::launch(dim3(rows), dim3(moex::kNormThreads), moex::moex_rmsnorm, x, stride, col, width, w, eps);
}

void moex_emu_rope(float* x, int rows, int stride, int col, int width, int perPos, const int32_t* pos, const double* freq) {
  std::lock_guard<std::mutex> lock(launchMu);
  emu::launch(dim3(rows), dim3(moex::kRopeThreads), moex::moex_rope, x, stride, col, width, perPos, pos, freq);
}

void moex_emu_copy_rows(const float* src, int srcStride, int srcCol, const int32_t* srcMap, void* dst, int dstBF16,
                        int dstStride, int dstCol, const int32_t* dstMap, int rows, int width) {
  std::lock_guard<std::mutex> lock(launchMu);
  emu::launch(dim3(rows), dim3(moex::kCopyThreads), moex::moex_copy_rows, src, srcStride, srcCol, srcMap, dst, dstBF16,
              dstStride, dstCol, dstMap, width);
}
}  // extern "C"
