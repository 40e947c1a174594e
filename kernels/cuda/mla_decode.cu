// MLA decode attention in the absorbed form over a paged latent cache, the
// contract of `moex exec mla-decode`: for sequence b and head h, with K the
// first seqlens[b] cached rows (through the block table) and V their first
// dv columns, out = softmax(scale·q·Kᵀ)·V and lse = ln Σ exp(scale·q·Kᵀ).
// Split-KV: moex_mla_decode_* computes each split's normalised partial and
// its lse, moex_mla_merge combines the splits. fp32 accumulation; the cache
// is fp32 or bf16. A first, simple version: one block per (sequence, head,
// split), a block-wide reduction per cached row.
#ifndef MOEX_EMU
#include <cstdint>
#include <cstring>
#endif

namespace moex {

constexpr int kMLAThreads = 128;
constexpr int kMaxDV = 1024;

__device__ __forceinline__ float loadCache(const float* p) { return *p; }
__device__ __forceinline__ float loadCache(const uint16_t* p) {
  uint32_t bits = uint32_t(*p) << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

template <typename T>
__device__ void mlaDecode(const float* __restrict__ q, const T* __restrict__ cache, const int32_t* __restrict__ blockTable,
                          const int32_t* __restrict__ seqlens, int heads, int D, int dv, int blockSize, int maxBlocks,
                          int splitRows, int splits, float scale, float* __restrict__ partO, float* __restrict__ partL) {
  __shared__ float red[kMLAThreads];
  __shared__ float acc[kMaxDV];
  __shared__ float stat[2];  // running max, running sum
  const int bh = blockIdx.x, split = blockIdx.y, tid = threadIdx.x;
  const int b = bh / heads;
  const int len = seqlens[b];
  const int r0 = split * splitRows, r1 = min(len, r0 + splitRows);
  float* po = partO + ((size_t)bh * splits + split) * dv;
  float* pl = partL + (size_t)bh * splits + split;
  const float* qh = q + (size_t)bh * D;
  for (int x = tid; x < dv; x += kMLAThreads) acc[x] = 0;
  if (tid == 0) { stat[0] = -INFINITY; stat[1] = 0; }
  __syncthreads();
  for (int r = r0; r < r1; r++) {
    const T* row = cache + ((size_t)blockTable[b * maxBlocks + r / blockSize] * blockSize + r % blockSize) * D;
    float s = 0;
    for (int x = tid; x < D; x += kMLAThreads) s += qh[x] * loadCache(row + x);
    red[tid] = s;
    __syncthreads();
    for (int w = kMLAThreads / 2; w > 0; w >>= 1) {
      if (tid < w) red[tid] += red[tid + w];
      __syncthreads();
    }
    const float sc = red[0] * scale;
    const float m = stat[0];
    const float mNew = fmaxf(m, sc);
    const float rescale = expf(m - mNew);  // 0 for the first row
    const float pr = expf(sc - mNew);
    for (int x = tid; x < dv; x += kMLAThreads) acc[x] = acc[x] * rescale + pr * loadCache(row + x);
    __syncthreads();
    if (tid == 0) { stat[0] = mNew; stat[1] = stat[1] * rescale + pr; }
    __syncthreads();
  }
  if (r1 <= r0) {  // a split past the end of this sequence
    for (int x = tid; x < dv; x += kMLAThreads) po[x] = 0;
    if (tid == 0) *pl = -INFINITY;
    return;
  }
  const float inv = 1.0f / stat[1];
  for (int x = tid; x < dv; x += kMLAThreads) po[x] = acc[x] * inv;
  if (tid == 0) *pl = stat[0] + logf(stat[1]);
}

// grid (batch·heads, splits), kMLAThreads threads; q [batch, heads, D],
// cache [blocks, blockSize, D], blockTable [batch, maxBlocks], seqlens
// [batch]; partO [batch·heads, splits, dv], partL [batch·heads, splits].
extern "C" __global__ void moex_mla_decode_f32(const float* q, const float* cache, const int32_t* blockTable,
                                               const int32_t* seqlens, int heads, int D, int dv, int blockSize,
                                               int maxBlocks, int splitRows, int splits, float scale, float* partO,
                                               float* partL) {
  mlaDecode(q, cache, blockTable, seqlens, heads, D, dv, blockSize, maxBlocks, splitRows, splits, scale, partO, partL);
}

extern "C" __global__ void moex_mla_decode_bf16(const float* q, const uint16_t* cache, const int32_t* blockTable,
                                                const int32_t* seqlens, int heads, int D, int dv, int blockSize,
                                                int maxBlocks, int splitRows, int splits, float scale, float* partO,
                                                float* partL) {
  mlaDecode(q, cache, blockTable, seqlens, heads, D, dv, blockSize, maxBlocks, splitRows, splits, scale, partO, partL);
}

// moex_mla_merge: grid batch·heads, threads over dv; combines the splits by
// log-sum-exp into out [batch·heads, dv] and lse [batch·heads].
extern "C" __global__ void moex_mla_merge(const float* partO, const float* partL, int splits, int dv, float* out,
                                          float* lse) {
  const int bh = blockIdx.x;
  const float* pl = partL + (size_t)bh * splits;
  float m = -INFINITY;
  for (int s = 0; s < splits; s++) m = fmaxf(m, pl[s]);
  float sum = 0;
  for (int s = 0; s < splits; s++) sum += expf(pl[s] - m);
  const float total = m + logf(sum);
  for (int x = threadIdx.x; x < dv; x += blockDim.x) {
    float o = 0;
    for (int s = 0; s < splits; s++) o += expf(pl[s] - total) * partO[((size_t)bh * splits + s) * dv + x];
    out[(size_t)bh * dv + x] = o;
  }
  if (threadIdx.x == 0) lse[bh] = total;
}

}  // namespace moex
