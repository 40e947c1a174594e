// Grouped expert GEMM on tensor cores (mma.sync m16n8k16, bf16 in, fp32
// accumulate) over the dispatch layout: for each 64-row block of the sorted
// (token, slot) pairs, whose rows all belong to one expert (blockExpert),
// C[rows, n] = Σ_k A[token(row), k] · W_expert[n, k], A rows gathered
// through the layout (no permuted copy), times the row's routing weight when
// weights is given (after the epilogue's bias). Padding rows (the sentinel)
// give zeros.
//
// 64×64 tiles, k steps of 16 staged through shared memory by cp.async in
// two buffers (the next step loads while this one computes), four warps
// each computing a 16×64 strip as eight m16n8 tiles.
#ifndef MOEX_EMU
#include <cstdint>
#include <cstring>
#endif

namespace moex {

constexpr int kGemmBM = 64, kGemmBN = 64, kGemmBK = 16, kGemmThreads = 128;

__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#ifdef MOEX_EMU
  emuMma16816(d, a, b);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

__device__ __forceinline__ uint32_t pack2(uint16_t lo, uint16_t hi) { return uint32_t(lo) | (uint32_t(hi) << 16); }

// cpAsync16 copies 16 bytes from global to shared memory asynchronously,
// or writes zeros when !valid (cp.async's zero-fill form).
__device__ __forceinline__ void cpAsync16(void* smem, const void* gmem, bool valid) {
#ifdef MOEX_EMU
  if (valid) memcpy(smem, gmem, 16); else memset(smem, 0, 16);
#else
  unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
#endif
}

__device__ __forceinline__ void cpAsyncCommit() {
#ifndef MOEX_EMU
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// cpAsyncWait waits until at most n committed groups are still in flight.
template <int n>
__device__ __forceinline__ void cpAsyncWait() {
#ifndef MOEX_EMU
  asm volatile("cp.async.wait_group %0;\n" ::"n"(n));
#endif
}

// e4m3ToFloat is an FP8 e4m3fn byte's value: sign-extended and shifted up
// by 20, its sign lands at bit 31, its exponent and mantissa at 20…26 under
// copies of the sign the mask clears: an fp32 of the value times 2^-120
// (subnormals included), scaled back exactly.
__device__ __forceinline__ float e4m3ToFloat(uint8_t b) {
  uint32_t u = (uint32_t(int32_t(int8_t(b))) << 20) & 0x87F00000u;
  float f;
  memcpy(&f, &u, 4);
  return f * 0x1p120f;
}

// bf16Round rounds to the nearest bf16, ties to even (no NaN reaches it).
__device__ __forceinline__ uint16_t bf16Round(float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}

// Fp8Weights are a stack of FP8 weights [experts, N, K] (bytes) with their
// block scales [experts, ceil(N/br), ceil(K/bc)]: weight = e4m3 × scale.
struct Fp8Weights {
  const uint8_t* w;
  const float* scales;
  int br, bc;
};

// loadFp8 dequantizes 8 weights of row n (k … k+7) of expert e's FP8 matrix
// [N, K] to bf16 into dst (zeros past N): the fp32 dequantized weight,
// rounded once to bf16, as the bf16 path would hold it.
__device__ __forceinline__ void loadFp8(uint16_t* dst, const Fp8Weights& q, int e, int n, int k, int N, int K) {
  if (n >= N) {
    for (int i = 0; i < 8; i++) dst[i] = 0;
    return;
  }
  const int gr = (N + q.br - 1) / q.br, gc = (K + q.bc - 1) / q.bc;
  const uint8_t* src = q.w + (size_t)e * N * K + (size_t)n * K + k;
  const float* srow = q.scales + ((size_t)e * gr + n / q.br) * gc;
  for (int i = 0; i < 8; i++) dst[i] = bf16Round(e4m3ToFloat(src[i]) * srow[(k + i) / q.bc]);
}

// CodeWeights are a stack of integer-code weights [experts, N, K]: 4-bit
// nibbles (two a byte, the even k in the low nibble) or int8 bytes, with a
// scale per group of k, [experts, N, K/group], and for some an offset
// likewise (offsets null: none). kind: 0 MXFP4 (e2m1 nibbles), 1 INT4 (the
// nibble minus 8), 2 UINT4 (the nibble), 3 INT8 (the byte as an int8); 4,
// 5 and 6 codes of 5 or 6 bits (GGUF's Q5_x and Q6_K, see narrowCode): a
// row's K/2 bytes of low nibbles, then for each high bit a plane of K/8
// bytes (bit k%8 of byte k/8), the code stored plus 16 (4: 5 bits, signed),
// as it is (5: 5 bits, unsigned) or plus 32 (6: 6 bits, signed). A
// weight is code × scale + offset rounded once to fp32 (without offsets,
// code × scale), the CPU kernels' value, then rounded to bf16. With
// factors (per > 0, GGUF's K-quants), scales and offsets hold d and −dmin
// for each run of per groups along a row, [experts, N, K/(group·per)], and
// factors each group's int8 sc (and m, interleaved, with offsets),
// [experts, N, K/group(, 2)]: the group's scale is d·sc and its offset
// −dmin·m, both exact in fp32, the same values as the CPU's. kind's bits
// from 4 on say how the scales (and offsets) are held: 0 fp32; 1 an E8M0
// byte a group (MXFP4's, scales then points at bytes), the scale
// 2^(E−127); 2 fp16 (GGUF's Q8_0, Q4_0, Q4_1 and Q5_x, scales and offsets
// then point at halves); all exact in fp32.
struct CodeWeights {
  const uint8_t* w;
  const float* scales;
  const float* offsets;
  int group, kind;
  const int8_t* factors;
  int per;
};

// halfToFloat is the value of the fp16 h (finite), exact.
__device__ __forceinline__ float halfToFloat(uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  float v;
  if (e == 0) {
    v = float(m) * 5.9604644775390625e-8f;  // m·2^−24
  } else {
    const uint32_t b = uint32_t(e - 15 + 127) << 23 | uint32_t(m) << 13;
    memcpy(&v, &b, 4);
  }
  return h & 0x8000 ? -v : v;
}

__device__ __forceinline__ float nibbleValue(uint8_t n, int kind) {
  if (kind == 1) return float(int(n) - 8);
  if (kind == 2) return float(n);
  const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  return n & 8 ? -mag[n & 7] : mag[n & 7];
}

// narrowCode is the code at k of a row of kind 4, 5 or 6 (see CodeWeights)
// whose bytes start at r.
__device__ __forceinline__ int narrowCode(const uint8_t* r, int k, int K, int kind) {
  int c = (r[k / 2] >> (4 * (k & 1))) & 15;
  const int planes = kind == 6 ? 2 : 1;
  for (int p = 0; p < planes; p++) c |= ((r[K / 2 + p * (K / 8) + k / 8] >> (k & 7)) & 1) << (4 + p);
  return c - (kind == 4 ? 16 : kind == 6 ? 32 : 0);
}

// loadCodes dequantizes 8 weights of row n (k … k+7, k even) of expert e's
// code matrix to bf16 into dst (zeros past N).
__device__ __forceinline__ void loadCodes(uint16_t* dst, const CodeWeights& q, int e, int n, int k, int N, int K) {
  if (n >= N) {
    for (int i = 0; i < 8; i++) dst[i] = 0;
    return;
  }
  const size_t row = (size_t)e * N + n;
  const bool offsets = q.offsets != nullptr;
  const int groups = K / q.group, fpg = offsets ? 2 : 1;  // factors a group
  const int sgroups = q.per > 0 ? groups / q.per : groups;
  const int kind = q.kind & 15, form = q.kind >> 4;  // the codes', the scales'
  // Each form's rows (the others null): fp32 (scales, or the factors' d
  // and −dmin), E8M0 bytes, fp16.
  const float* srow = form == 0 ? q.scales + row * sgroups : nullptr;
  const float* orow = form == 0 && offsets ? q.offsets + row * sgroups : nullptr;
  const int8_t* frow = q.per > 0 ? q.factors + row * groups * fpg : nullptr;
  const uint8_t* erow = form == 1 ? (const uint8_t*)q.scales + row * groups : nullptr;
  const uint16_t* hrow = form == 2 ? (const uint16_t*)q.scales + row * groups : nullptr;
  const uint16_t* horow = form == 2 && offsets ? (const uint16_t*)q.offsets + row * groups : nullptr;
  for (int i = 0; i < 8; i++) {
    float c;
    if (kind == 3) {
      c = float((int8_t)q.w[row * K + k + i]);
    } else if (kind >= 4) {
      c = float(narrowCode(q.w + row * (size_t)(K / 8) * (kind == 6 ? 6 : 5), k + i, K, kind));
    } else {
      c = nibbleValue((q.w[(row * K + k) / 2 + i / 2] >> (4 * (i & 1))) & 15, kind);
    }
    const int g = (k + i) / q.group;
    float sc, off = 0.0f;
    if (frow) {
      sc = srow[g / q.per] * float(frow[g * fpg]);
      if (orow) off = orow[g / q.per] * float(frow[g * fpg + 1]);
    } else if (erow) {
      sc = ldexpf(1.0f, int(erow[g]) - 127);
    } else if (hrow) {
      sc = halfToFloat(hrow[g]);
      if (horow) off = halfToFloat(horow[g]);
    } else {
      sc = srow[g];
      if (orow) off = orow[g];
    }
    dst[i] = bf16Round(offsets ? fmaf(c, sc, off) : c * sc);
  }
}

// Epilogue is what a grouped GEMM computes around its products, each part
// optional (null / 0): bias and bias2 [experts, N] fp32 added to the
// products (the first projection: the gate's and the up's); act the first
// projection's activation (kernels.ActKind: 0 SiLU, 1 gpt-oss's clamped
// SwiGLU with alpha and limit, 2 GeGLU with GELU's tanh form, 3
// DeepSeek-V4's clamped SiLU with limit); inScale [pairs] multiplies the
// first projection's products (a routing weight on the expert's input).
struct Epilogue {
  const float* bias;
  const float* bias2;
  int act;
  float alpha, limit;
  const float* inScale;
};

// activate is the gated activation of a column's gate and up products.
__device__ __forceinline__ float activate(const Epilogue& e, float g, float u) {
  switch (e.act) {
    case 1:  // g = min(g, L), u = clamp(u, ±L), g·σ(αg)·(u + 1)
      g = fminf(g, e.limit);
      u = fmaxf(-e.limit, fminf(u, e.limit));
      return g / (1.0f + expf(-e.alpha * g)) * (u + 1.0f);
    case 2: {  // gelu_tanh(g)·u as g·σ(2z), z = √(2/π)(g + 0.044715g³)
      const float z = 1.5957691216057308f * (g + 0.044715f * g * g * g);
      return g / (1.0f + expf(-z)) * u;
    }
    case 3:  // g = min(g, L), u = clamp(u, ±L), silu(g)·u
      g = fminf(g, e.limit);
      u = fmaxf(-e.limit, fminf(u, e.limit));
      break;
  }
  return g / (1.0f + expf(-g)) * u;
}

// groupedGemm is the body of the entry points. With SWIGLU, w2 is the up
// projection and the tile writes silu(a·w) · (a·w2) (the first expert
// projection, gate and up in one pass over A); without, a·w times the
// routing weight (the second). With FP8 the weights are q and q2, with
// 4-bit ones r and r2 (w and w2 unused): each B tile is dequantized to bf16
// as it is loaded into shared memory, and the same mma.sync path runs.
template <bool SWIGLU, int FMT>  // FMT: 0 bf16, 1 FP8, 2 integer codes
__device__ void groupedGemm(const uint16_t* __restrict__ a, const uint16_t* __restrict__ w,
                            const uint16_t* __restrict__ w2, Fp8Weights q, Fp8Weights q2, CodeWeights r, CodeWeights r2,
                            const int32_t* __restrict__ sorted, const int32_t* __restrict__ blockExpert, int topK,
                            int pairs, int gatherA, int N, int K, const float* __restrict__ weights,
                            Epilogue ep, float* __restrict__ c) {
  __shared__ __align__(16) uint16_t As[2][kGemmBM][kGemmBK];
  __shared__ __align__(16) uint16_t Bs[2][kGemmBN][kGemmBK];
  __shared__ __align__(16) uint16_t B2s[2][SWIGLU ? kGemmBN : 1][kGemmBK];
  __shared__ int tokenOf[kGemmBM];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int row0 = blockIdx.x * kGemmBM, n0 = blockIdx.y * kGemmBN;
  if (blockExpert[blockIdx.x] < 0) return;  // past the layout's rows (a fixed grid)
  const int expert = blockExpert[blockIdx.x];
  const size_t eoff = (size_t)expert * N * K;
  if (tid < kGemmBM) {
    int p = sorted[row0 + tid];
    tokenOf[tid] = p < pairs ? (gatherA ? p / topK : row0 + tid) : -1;
  }
  float acc[8][4], acc2[SWIGLU ? 8 : 1][4];
  for (int j = 0; j < 8; j++)
    for (int i = 0; i < 4; i++) acc[j][i] = 0;
  for (int j = 0; j < (SWIGLU ? 8 : 1); j++)
    for (int i = 0; i < 4; i++) acc2[j][i] = 0;
  __syncthreads();
  // Each thread moves one 16-byte chunk (8 values) of each tile per k step:
  // row tid/2, half tid%2.
  const int lr = tid / 2, lc = (tid % 2) * 8;
  const int tok = tokenOf[lr], ln = n0 + lr;
  auto load = [&](int buf, int k0) {
    cpAsync16(&As[buf][lr][lc], tok >= 0 ? a + (size_t)tok * K + k0 + lc : a, tok >= 0);
    if (FMT == 1) {  // visible to the other threads after the step's __syncthreads
      loadFp8(&Bs[buf][lr][lc], q, expert, ln, k0 + lc, N, K);
      if (SWIGLU) loadFp8(&B2s[buf][SWIGLU ? lr : 0][lc], q2, expert, ln, k0 + lc, N, K);
    } else if (FMT == 2) {
      loadCodes(&Bs[buf][lr][lc], r, expert, ln, k0 + lc, N, K);
      if (SWIGLU) loadCodes(&B2s[buf][SWIGLU ? lr : 0][lc], r2, expert, ln, k0 + lc, N, K);
    } else {
      cpAsync16(&Bs[buf][lr][lc], ln < N ? w + eoff + (size_t)ln * K + k0 + lc : w, ln < N);
      if (SWIGLU) cpAsync16(&B2s[buf][SWIGLU ? lr : 0][lc], ln < N ? w2 + eoff + (size_t)ln * K + k0 + lc : w2, ln < N);
    }
    cpAsyncCommit();
  };
  const int g = lane >> 2, t = lane % 4, m = warp * 16;
  load(0, 0);
  for (int k0 = 0, buf = 0; k0 < K; k0 += kGemmBK, buf ^= 1) {
    if (k0 + kGemmBK < K) {
      load(buf ^ 1, k0 + kGemmBK);
      cpAsyncWait<1>();
    } else {
      cpAsyncWait<0>();
    }
    __syncthreads();
    uint16_t(*A)[kGemmBK] = As[buf];
    uint16_t(*B)[kGemmBK] = Bs[buf];
    uint32_t af[4] = {pack2(A[m + g][2 * t], A[m + g][2 * t + 1]), pack2(A[m + g + 8][2 * t], A[m + g + 8][2 * t + 1]),
                      pack2(A[m + g][2 * t + 8], A[m + g][2 * t + 9]),
                      pack2(A[m + g + 8][2 * t + 8], A[m + g + 8][2 * t + 9])};
    for (int j = 0; j < 8; j++) {
      const int n = j * 8 + g;
      uint32_t bf[2] = {pack2(B[n][2 * t], B[n][2 * t + 1]), pack2(B[n][2 * t + 8], B[n][2 * t + 9])};
      mma16816(acc[j], af, bf);
      if (SWIGLU) {
        uint16_t(*B2)[kGemmBK] = B2s[buf];
        uint32_t bf2[2] = {pack2(B2[n][2 * t], B2[n][2 * t + 1]), pack2(B2[n][2 * t + 8], B2[n][2 * t + 9])};
        mma16816(acc2[SWIGLU ? j : 0], af, bf2);
      }
    }
    __syncthreads();  // the buffer is refilled by the next step's load
  }
  for (int j = 0; j < 8; j++)
    for (int i = 0; i < 4; i++) {
      const int r = m + g + (i >= 2 ? 8 : 0), n = n0 + j * 8 + 2 * t + (i & 1);
      if (n >= N) continue;
      const int p = sorted[row0 + r];
      float v = 0;
      if (p < pairs) {
        const size_t bi = (size_t)expert * N + n;
        if (SWIGLU) {
          float gt = acc[j][i], ut = acc2[SWIGLU ? j : 0][i];
          if (ep.inScale != nullptr) gt *= ep.inScale[p], ut *= ep.inScale[p];
          if (ep.bias != nullptr) gt += ep.bias[bi];
          if (ep.bias2 != nullptr) ut += ep.bias2[bi];
          v = activate(ep, gt, ut);
        } else {
          v = acc[j][i];
          if (ep.bias != nullptr) v += ep.bias[bi];
          if (weights != nullptr) v *= weights[p];
        }
      }
      c[(size_t)(row0 + r) * N + n] = v;
    }
}

// grid (paddedRows / kGemmBM, ceil(N / kGemmBN)), kGemmThreads threads.
// a [tokens, K] bf16 (gatherA: row = token of the pair), or [paddedRows, K]
// already in layout order (!gatherA); w [experts, N, K] bf16; sorted,
// blockExpert: the layout (block size kGemmBM); pairs = tokens·topK is the
// sentinel; weights [pairs] or null; c [paddedRows, N] fp32. K must be a
// multiple of 16.
extern "C" __global__ void moex_grouped_gemm_bf16(const uint16_t* a, const uint16_t* w, const int32_t* sorted,
                                                  const int32_t* blockExpert, int topK, int pairs, int gatherA, int N,
                                                  int K, const float* weights, const float* bias, const float* bias2, int act, float alpha, float limit, const float* inScale, float* c) {
  groupedGemm<false, 0>(a, w, nullptr, Fp8Weights{}, Fp8Weights{}, CodeWeights{}, CodeWeights{}, sorted, blockExpert, topK, pairs, gatherA, N, K,
                            weights, Epilogue{bias, bias2, act, alpha, limit, inScale}, c);
}

// moex_grouped_gemm_fp8 is moex_grouped_gemm_bf16 on FP8 weights w
// [experts, N, K] with block scales ws [experts, ceil(N/br), ceil(K/bc)].
extern "C" __global__ void moex_grouped_gemm_fp8(const uint16_t* a, const uint8_t* w, const float* ws, int br, int bc,
                                                 const int32_t* sorted, const int32_t* blockExpert, int topK, int pairs,
                                                 int gatherA, int N, int K, const float* weights, const float* bias, const float* bias2, int act, float alpha, float limit, const float* inScale, float* c) {
  groupedGemm<false, 1>(a, nullptr, nullptr, Fp8Weights{w, ws, br, bc}, Fp8Weights{}, CodeWeights{}, CodeWeights{}, sorted,
                        blockExpert, topK, pairs, gatherA, N, K, weights, Epilogue{bias, bias2, act, alpha, limit, inScale}, c);
}

// moex_grouped_gemm_codes is moex_grouped_gemm_bf16 on integer-code
// weights w ([experts, N, K/2] bytes of nibbles or [experts, N, K] int8)
// with scales ws and offsets wo (or null) [experts, N, K/group], or with
// factors wf (per > 0) as CodeWeights'; kind as CodeWeights'.
extern "C" __global__ void moex_grouped_gemm_codes(const uint16_t* a, const uint8_t* w, const float* ws, const float* wo, int group, int kind,
                                                const int8_t* wf, int per, const int32_t* sorted, const int32_t* blockExpert, int topK, int pairs,
                                                int gatherA, int N, int K, const float* weights, const float* bias, const float* bias2, int act, float alpha, float limit, const float* inScale, float* c) {
  groupedGemm<false, 2>(a, nullptr, nullptr, Fp8Weights{}, Fp8Weights{}, CodeWeights{w, ws, wo, group, kind, wf, per}, CodeWeights{},
                        sorted, blockExpert, topK, pairs, gatherA, N, K, weights, Epilogue{bias, bias2, act, alpha, limit, inScale}, c);
}

// The first projection: gate and up [experts, N, K] → h = silu(gate)·up
// [paddedRows, N]; same launch shape.
extern "C" __global__ void moex_grouped_gemm_swiglu_bf16(const uint16_t* a, const uint16_t* gate, const uint16_t* up,
                                                         const int32_t* sorted, const int32_t* blockExpert, int topK,
                                                         int pairs, int N, int K, const float* bias, const float* bias2, int act, float alpha, float limit, const float* inScale, float* h) {
  groupedGemm<true, 0>(a, gate, up, Fp8Weights{}, Fp8Weights{}, CodeWeights{}, CodeWeights{}, sorted, blockExpert, topK, pairs, 1, N, K, nullptr,
                           Epilogue{bias, bias2, act, alpha, limit, inScale}, h);
}

// moex_grouped_gemm_swiglu_fp8 is moex_grouped_gemm_swiglu_bf16 on FP8
// gate and up weights with their block scales.
extern "C" __global__ void moex_grouped_gemm_swiglu_fp8(const uint16_t* a, const uint8_t* gate, const float* gs,
                                                        const uint8_t* up, const float* us, int br, int bc,
                                                        const int32_t* sorted, const int32_t* blockExpert, int topK,
                                                        int pairs, int N, int K, const float* bias, const float* bias2, int act, float alpha, float limit, const float* inScale, float* h) {
  groupedGemm<true, 1>(a, nullptr, nullptr, Fp8Weights{gate, gs, br, bc}, Fp8Weights{up, us, br, bc}, CodeWeights{},
                       CodeWeights{}, sorted, blockExpert, topK, pairs, 1, N, K, nullptr, Epilogue{bias, bias2, act, alpha, limit, inScale}, h);
}

// moex_grouped_gemm_swiglu_codes is moex_grouped_gemm_swiglu_bf16 on
// integer-code gate and up weights with their scales and offsets (or null)
// and factors (per > 0).
extern "C" __global__ void moex_grouped_gemm_swiglu_codes(const uint16_t* a, const uint8_t* gate, const float* gs, const float* go,
                                                          const uint8_t* up, const float* us, const float* uo, int group, int kind,
                                                          const int8_t* gf, const int8_t* uf, int per, const int32_t* sorted, const int32_t* blockExpert, int topK,
                                                       int pairs, int N, int K, const float* bias, const float* bias2, int act, float alpha, float limit, const float* inScale, float* h) {
  groupedGemm<true, 2>(a, nullptr, nullptr, Fp8Weights{}, Fp8Weights{}, CodeWeights{gate, gs, go, group, kind, gf, per},
                       CodeWeights{up, us, uo, group, kind, uf, per}, sorted, blockExpert, topK, pairs, 1, N, K, nullptr, Epilogue{bias, bias2, act, alpha, limit, inScale}, h);
}

// moex_f32_to_bf16: dst[i] = bf16(src[i]), rounding to nearest even (NaN
// kept quiet); grid-stride over n.
extern "C" __global__ void moex_f32_to_bf16(const float* __restrict__ src, uint16_t* __restrict__ dst, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    uint32_t u;
    memcpy(&u, &src[i], 4);
    if ((u & 0x7fffffff) > 0x7f800000) {
      dst[i] = uint16_t((u >> 16) | 0x40);
    } else {
      u += 0x7fff + ((u >> 16) & 1);
      dst[i] = uint16_t(u >> 16);
    }
  }
}

}  // namespace moex
