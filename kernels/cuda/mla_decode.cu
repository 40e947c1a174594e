// Decode attention over a paged cache, MLA's and grouped-query attention's
// alike: for sequence b and query head h of group g = h / (heads/kvHeads),
// with K the dk columns from g·dk and V the dv columns from voff + g·dv of
// the cached rows [lo, seqlens[b]) (lo = len − window with a window, else
// 0; through the block table), out = softmax(scale·q·Kᵀ ∪ sink[h])·V and
// lse = ln(Σ exp(scale·q·Kᵀ) + exp(sink[h])). MLA is one group whose key is
// the whole row (dk = D) and whose value is a view of its first dv columns
// (voff = 0): `moex exec mla-decode`'s contract. Split-KV:
// moex_attn_decode_* computes each split's normalised partial and its lse,
// moex_attn_merge combines the splits and the sinks. fp32 accumulation; the
// cache is fp32 or bf16. A first, simple version: one block per (sequence,
// head, split), a block-wide reduction per cached row.
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

// AttnShape is where a head's key and value sit in a cached row.
struct AttnShape {
  int heads, kvHeads;  // query heads, key/value heads (MLA: 1)
  int D, dk, dv, voff;  // row width; key and value widths; values' offset
  int window;           // > 0: the last window rows only
};

template <typename T>
__device__ void attnDecode(const float* __restrict__ q, const T* __restrict__ cache, const int32_t* __restrict__ blockTable,
                           const int32_t* __restrict__ seqlens, AttnShape a, int blockSize, int maxBlocks,
                           int splitRows, int splits, float scale, float* __restrict__ partO, float* __restrict__ partL) {
  const int heads = a.heads, D = a.D, dv = a.dv;
  __shared__ float red[kMLAThreads];
  __shared__ float acc[kMaxDV];
  __shared__ float stat[2];  // running max, running sum
  const int bh = blockIdx.x, split = blockIdx.y, tid = threadIdx.x;
  const int b = bh / heads, g = (bh % heads) / (heads / a.kvHeads);
  const int len = seqlens[b];
  const int lo = a.window > 0 ? max(0, len - a.window) : 0;
  const int r0 = lo + split * splitRows, r1 = min(len, r0 + splitRows);
  float* po = partO + ((size_t)bh * splits + split) * dv;
  float* pl = partL + (size_t)bh * splits + split;
  const float* qh = q + (size_t)bh * a.dk;
  const int koff = g * a.dk, voff = a.voff + g * dv;
  for (int x = tid; x < dv; x += kMLAThreads) acc[x] = 0;
  if (tid == 0) { stat[0] = -INFINITY; stat[1] = 0; }
  __syncthreads();
  for (int r = r0; r < r1; r++) {
    const T* row = cache + ((size_t)blockTable[b * maxBlocks + r / blockSize] * blockSize + r % blockSize) * D;
    float s = 0;
    for (int x = tid; x < a.dk; x += kMLAThreads) s += qh[x] * loadCache(row + koff + x);
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
    for (int x = tid; x < dv; x += kMLAThreads) acc[x] = acc[x] * rescale + pr * loadCache(row + voff + x);
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

// grid (batch·heads, splits), kMLAThreads threads; q [batch, heads, dk],
// cache [blocks, blockSize, D], blockTable [batch, maxBlocks], seqlens
// [batch]; partO [batch·heads, splits, dv], partL [batch·heads, splits].
extern "C" __global__ void moex_attn_decode_f32(const float* q, const float* cache, const int32_t* blockTable,
                                                const int32_t* seqlens, AttnShape a, int blockSize, int maxBlocks,
                                                int splitRows, int splits, float scale, float* partO, float* partL) {
  attnDecode(q, cache, blockTable, seqlens, a, blockSize, maxBlocks, splitRows, splits, scale, partO, partL);
}

extern "C" __global__ void moex_attn_decode_bf16(const float* q, const uint16_t* cache, const int32_t* blockTable,
                                                 const int32_t* seqlens, AttnShape a, int blockSize, int maxBlocks,
                                                 int splitRows, int splits, float scale, float* partO, float* partL) {
  attnDecode(q, cache, blockTable, seqlens, a, blockSize, maxBlocks, splitRows, splits, scale, partO, partL);
}

// moex_attn_merge: grid batch·heads, threads over dv; combines the splits
// by log-sum-exp, and head bh % heads's sink when sinks is not null, into
// out [batch·heads, dv] and lse [batch·heads].
extern "C" __global__ void moex_attn_merge(const float* partO, const float* partL, int splits, int dv, const float* sinks,
                                           int heads, float* out, float* lse) {
  const int bh = blockIdx.x;
  const float* pl = partL + (size_t)bh * splits;
  float m = -INFINITY;
  for (int s = 0; s < splits; s++) m = fmaxf(m, pl[s]);
  if (sinks) m = fmaxf(m, sinks[bh % heads]);
  float sum = 0;
  for (int s = 0; s < splits; s++) sum += expf(pl[s] - m);
  if (sinks) sum += expf(sinks[bh % heads] - m);
  const float total = m + logf(sum);
  for (int x = threadIdx.x; x < dv; x += blockDim.x) {
    float o = 0;
    for (int s = 0; s < splits; s++) o += expf(pl[s] - total) * partO[((size_t)bh * splits + s) * dv + x];
    out[(size_t)bh * dv + x] = o;
  }
  if (threadIdx.x == 0) lse[bh] = total;
}

}  // namespace moex
