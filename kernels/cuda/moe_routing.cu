// MoE routing kernels: gating (router logits → top-k ids and weights), the
// dispatch layout (vLLM's moe_align_block_size, deterministic) and combine.
// The same source compiles with nvcc for the GPU and with g++ against
// kernels/emu/cuda_emu.h for the CPU emulation. Kernels have C linkage, so
// that a launcher finds them in the fatbin by these names.
#ifndef MOEX_EMU
#include <cstdint>
#endif

namespace moex {

// Routing methods and scoring functions, as in package moe.
enum { SCORE_SOFTMAX = 1, SCORE_SIGMOID = 2, SCORE_SQRT_SOFTPLUS = 3 };
enum { TOPK_GREEDY = 1, TOPK_GROUP_LIMITED = 2, TOPK_NOAUX_TC = 3 };

constexpr int kGateThreads = 256;   // threads of a gating block
constexpr int kMaxExperts = 1024;   // experts one gating block holds in shared memory
constexpr int kMaxGroups = 64;
constexpr int kMaxTopK = 64;

// GateParams: chooseOnLogits ranks the experts by their logits rather than
// their scores (llama4); the renormalisation's denominator is at least
// normMin (ernie4_5_moe).
struct GateParams {
  int experts, topK, scoring, method, groups, topkGroups, norm;
  float normEps, scaling;
  int chooseOnLogits;
  float normMin;
};

// better orders experts (or groups) for a top-k: higher value first, the
// lower index on ties; invalid entries (index < 0) last.
__device__ __forceinline__ bool better(float va, int ia, float vb, int ib) {
  if (ib < 0) return ia >= 0;
  if (ia < 0) return false;
  return va > vb || (va == vb && ia < ib);
}

// moex_gate: one block of kGateThreads threads per token. logits [T, E] fp32,
// bias [E] or null (noaux_tc); writes ids [T, K] (ascending) and weights
// [T, K]. Requires E ≤ kMaxExperts, groups ≤ kMaxGroups, K ≤ kMaxTopK.
extern "C" __global__ void moex_gate(const float* __restrict__ logits, const float* __restrict__ bias, GateParams p,
                     int32_t* __restrict__ ids, float* __restrict__ weights) {
  __shared__ float score[kMaxExperts];
  __shared__ float choice[kMaxExperts];
  __shared__ unsigned char allowed[kMaxExperts];
  __shared__ float redV[kGateThreads];
  __shared__ int redI[kGateThreads];
  __shared__ float groupScore[kMaxGroups];
  __shared__ int picked[kMaxTopK];
  const int t = blockIdx.x, tid = threadIdx.x, E = p.experts;
  const float* row = logits + (size_t)t * E;

  // Scores.
  float m = -INFINITY;
  for (int e = tid; e < E; e += kGateThreads) m = fmaxf(m, row[e]);
  redV[tid] = m;
  __syncthreads();
  for (int s = kGateThreads / 2; s > 0; s >>= 1) {
    if (tid < s) redV[tid] = fmaxf(redV[tid], redV[tid + s]);
    __syncthreads();
  }
  const float mx = redV[0];
  __syncthreads();
  float sum = 0;
  for (int e = tid; e < E; e += kGateThreads) {
    const float l = row[e];
    float v = p.scoring == SCORE_SOFTMAX ? expf(l - mx)
              : p.scoring == SCORE_SQRT_SOFTPLUS ? sqrtf(fmaxf(l, 0.0f) + log1pf(expf(-fabsf(l))))
                                                 : 1.0f / (1.0f + expf(-l));
    score[e] = v;
    sum += v;
  }
  redV[tid] = sum;
  __syncthreads();
  for (int s = kGateThreads / 2; s > 0; s >>= 1) {
    if (tid < s) redV[tid] += redV[tid + s];
    __syncthreads();
  }
  const float total = redV[0];
  __syncthreads();
  for (int e = tid; e < E; e += kGateThreads) {
    if (p.scoring == SCORE_SOFTMAX) score[e] /= total;
    choice[e] = (p.chooseOnLogits ? row[e] : score[e]) + (bias != nullptr && p.method == TOPK_NOAUX_TC ? bias[e] : 0.0f);
    allowed[e] = 1;
  }
  __syncthreads();

  // Group limit: each group's score, then the topkGroups best groups.
  if (p.method != TOPK_GREEDY) {
    const int per = E / p.groups;
    if (tid < p.groups) {
      float a = -INFINITY, b = -INFINITY;
      for (int e = tid * per; e < (tid + 1) * per; e++) {
        float v = choice[e];
        if (v > a) { b = a; a = v; } else if (v > b) { b = v; }
      }
      groupScore[tid] = p.method == TOPK_GROUP_LIMITED ? a : (per == 1 ? a : a + b);
    }
    __syncthreads();
    if (tid == 0) {
      bool keep[kMaxGroups];
      for (int g = 0; g < p.groups; g++) keep[g] = false;
      for (int k = 0; k < p.topkGroups; k++) {
        int best = -1;
        for (int g = 0; g < p.groups; g++)
          if (!keep[g] && better(groupScore[g], g, best < 0 ? 0.0f : groupScore[best], best)) best = g;
        keep[best] = true;
      }
      for (int g = 0; g < p.groups; g++)
        for (int e = g * per; e < (g + 1) * per; e++) allowed[e] = keep[g];
    }
    __syncthreads();
  }

  // Top-k: k rounds of a block-wide argmax over the allowed experts.
  for (int k = 0; k < p.topK; k++) {
    float bv = 0;
    int bi = -1;
    for (int e = tid; e < E; e += kGateThreads)
      if (allowed[e] && better(choice[e], e, bv, bi)) { bv = choice[e]; bi = e; }
    redV[tid] = bv;
    redI[tid] = bi;
    __syncthreads();
    for (int s = kGateThreads / 2; s > 0; s >>= 1) {
      if (tid < s && better(redV[tid + s], redI[tid + s], redV[tid], redI[tid])) {
        redV[tid] = redV[tid + s];
        redI[tid] = redI[tid + s];
      }
      __syncthreads();
    }
    if (tid == 0) {
      picked[k] = redI[0];
      allowed[redI[0]] = 0;
    }
    __syncthreads();
  }

  // Ascending ids, their weights normalised and scaled.
  if (tid == 0) {
    for (int i = 1; i < p.topK; i++)
      for (int j = i; j > 0 && picked[j] < picked[j - 1]; j--) {
        int x = picked[j]; picked[j] = picked[j - 1]; picked[j - 1] = x;
      }
    float s = 0;
    for (int k = 0; k < p.topK; k++) s += score[picked[k]];
    float den = p.norm ? fmaxf(s + p.normEps, p.normMin) : 1.0f;
    for (int k = 0; k < p.topK; k++) {
      ids[(size_t)t * p.topK + k] = picked[k];
      weights[(size_t)t * p.topK + k] = score[picked[k]] / den * p.scaling;
    }
  }
}

constexpr int kAlignThreads = 256;

// moex_align: the dispatch layout of ids [n = T·K] over the E ≤ kMaxExperts
// experts lo … lo+E-1 (a rank's shard; lo = 0 and E = all: the whole layer),
// padded to multiples of block: counts [E], offsets [E+1], sorted [padded
// total] (token·K + slot, sentinel n in the padding), blockExpert [maxBlocks]
// (the shard's expert of each block of the padded total, -1 beyond it: the
// GEMMs of a fixed grid, as a captured graph has, skip those blocks), rows
// [n] (the inverse; -1 for a pair whose expert is not in the shard). One
// block; within an expert the pairs keep their order, as on the CPU.
extern "C" __global__ void moex_align(const int32_t* __restrict__ ids, int n, int lo, int E, int block, int maxBlocks,
                      int32_t* __restrict__ counts,
                      int32_t* __restrict__ offsets, int32_t* __restrict__ sorted, int32_t* __restrict__ blockExpert,
                      int32_t* __restrict__ rows) {
  __shared__ int cnt[kMaxExperts];
  __shared__ int off[kMaxExperts + 1];
  const int tid = threadIdx.x;
  for (int e = tid; e < E; e += kAlignThreads) cnt[e] = 0;
  __syncthreads();
  for (int i = tid; i < n; i += kAlignThreads) {
    const unsigned e = unsigned(ids[i] - lo);
    if (e < unsigned(E)) atomicAdd(&cnt[e], 1);
    else rows[i] = -1;
  }
  __syncthreads();
  if (tid == 0) {
    off[0] = 0;
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + (cnt[e] + block - 1) / block * block;
  }
  __syncthreads();
  for (int e = tid; e < E; e += kAlignThreads) counts[e] = cnt[e];
  for (int e = tid; e <= E; e += kAlignThreads) offsets[e] = off[e];
  for (int i = tid; i < off[E]; i += kAlignThreads) sorted[i] = n;
  for (int b = tid; b < off[E] / block; b += kAlignThreads) {
    int first = 0, last = E;  // the expert whose range holds row b·block
    while (last - first > 1) {
      int mid = (first + last) / 2;
      if (off[mid] <= b * block) first = mid; else last = mid;
    }
    blockExpert[b] = first;
  }
  for (int b = off[E] / block + tid; b < maxBlocks; b += kAlignThreads) blockExpert[b] = -1;
  __syncthreads();
  // Each thread places its experts' pairs in pair order (deterministic).
  for (int e = tid; e < E; e += kAlignThreads) {
    int next = off[e];
    for (int i = 0; i < n; i++)
      if (ids[i] - lo == e) {
        sorted[next] = i;
        rows[i] = next;
        next++;
      }
  }
}

// moex_combine: y[t] = Σ_j out[rows[t·K+j]] in j order (ascending experts),
// skipping rows of -1 (experts of other ranks; none at all: 0), then +
// shared[t] (null for none). One block per token, threads over hidden.
// The order, and so the bits, are those of the CPU path.
extern "C" __global__ void moex_combine(const float* __restrict__ out, const int32_t* __restrict__ rows, int topK, int hidden,
                        const float* __restrict__ shared, float* __restrict__ y) {
  const int t = blockIdx.x;
  for (int h = threadIdx.x; h < hidden; h += blockDim.x) {
    float acc = 0.0f;
    bool any = false;
    for (int j = 0; j < topK; j++) {
      const int r = rows[t * topK + j];
      if (r < 0) continue;
      const float v = out[(size_t)r * hidden + h];
      acc = any ? acc + v : v;
      any = true;
    }
    if (shared != nullptr) acc = acc + shared[(size_t)t * hidden + h];
    y[(size_t)t * hidden + h] = acc;
  }
}

}  // namespace moex
