// CPU emulation of the CUDA subset moex's kernels use, so that the same .cu
// sources compile with g++ (-std=c++20) and run on CPU threads:
//
//   - every CUDA thread of a block is a real std::thread; blocks run one
//     after another, so `__shared__` (static storage here) is the block's;
//   - __syncthreads() is a barrier over the block's threads;
//   - warp shuffles and votes synchronise the 32 threads of a warp through a
//     per-warp exchange buffer and barrier (a block's size must be a
//     multiple of 32 when they are used).
//
// It is for correctness checks on machines without a GPU, not for speed.
#pragma once

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#define MOEX_EMU 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __restrict__
#define __align__(n) __attribute__((aligned(n)))

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3() = default;
  dim3(unsigned x_, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace emu {

struct Block {
  std::unique_ptr<std::barrier<>> all;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<uint64_t> exchange;  // one slot per thread, for warp shuffles
  std::vector<uint32_t> mma;       // ten words per thread, for mma.sync fragments
};

inline thread_local dim3 tThreadIdx;
inline thread_local dim3 tBlockIdx;
inline thread_local Block* tBlock = nullptr;
inline dim3 gBlockDim, gGridDim;

inline unsigned linearThread() {
  return tThreadIdx.x + gBlockDim.x * (tThreadIdx.y + gBlockDim.y * tThreadIdx.z);
}

// launch runs kernel(args...) over grid × block, one block at a time.
template <typename... Params, typename... Args>
void launch(dim3 grid, dim3 block, void (*kernel)(Params...), Args... args) {
  gGridDim = grid;
  gBlockDim = block;
  const unsigned n = block.x * block.y * block.z;
  for (unsigned bz = 0; bz < grid.z; bz++)
    for (unsigned by = 0; by < grid.y; by++)
      for (unsigned bx = 0; bx < grid.x; bx++) {
        Block b;
        b.all = std::make_unique<std::barrier<>>(n);
        for (unsigned w = 0; w < (n + 31) / 32; w++)
          b.warps.push_back(std::make_unique<std::barrier<>>(std::min(32u, n - 32 * w)));
        b.exchange.assign(n, 0);
        b.mma.assign(10 * n, 0);
        std::vector<std::thread> threads;
        threads.reserve(n);
        for (unsigned t = 0; t < n; t++) {
          threads.emplace_back([&, t] {
            tBlock = &b;
            tBlockIdx = dim3(bx, by, bz);
            tThreadIdx = dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
            kernel(args...);
          });
        }
        for (auto& th : threads) th.join();
      }
}

}  // namespace emu

#define threadIdx (emu::tThreadIdx)
#define blockIdx (emu::tBlockIdx)
#define blockDim (emu::gBlockDim)
#define gridDim (emu::gGridDim)

inline void __syncthreads() { emu::tBlock->all->arrive_and_wait(); }

// Warp shuffles: every lane publishes its value, the warp meets, each lane
// reads its source, the warp meets again before the slots are reused.
template <typename T>
inline T emuShuffle(T v, unsigned srcLane) {
  static_assert(sizeof(T) <= 8, "shuffle of a value wider than 8 bytes");
  unsigned me = emu::linearThread(), warp = me / 32;
  uint64_t slot = 0;
  std::memcpy(&slot, &v, sizeof(T));
  emu::tBlock->exchange[me] = slot;
  emu::tBlock->warps[warp]->arrive_and_wait();
  uint64_t got = emu::tBlock->exchange[warp * 32 + (srcLane & 31)];
  emu::tBlock->warps[warp]->arrive_and_wait();
  T out;
  std::memcpy(&out, &got, sizeof(T));
  return out;
}

template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int laneMask, int = 32) {
  return emuShuffle(v, (emu::linearThread() % 32) ^ unsigned(laneMask));
}
template <typename T>
inline T __shfl_sync(unsigned, T v, int srcLane, int = 32) {
  return emuShuffle(v, unsigned(srcLane));
}
inline unsigned __ballot_sync(unsigned, int pred) {
  unsigned me = emu::linearThread(), warp = me / 32;
  emu::tBlock->exchange[me] = pred ? 1 : 0;
  emu::tBlock->warps[warp]->arrive_and_wait();
  unsigned bits = 0;
  unsigned lanes = std::min(32u, unsigned(emu::tBlock->exchange.size()) - warp * 32);
  for (unsigned l = 0; l < lanes; l++)
    if (emu::tBlock->exchange[warp * 32 + l]) bits |= 1u << l;
  emu::tBlock->warps[warp]->arrive_and_wait();
  return bits;
}

// Atomics on block-shared or global memory.
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline float atomicAdd(float* p, float v) {
  float old = *p, want;
  do {
    want = old + v;
  } while (!__atomic_compare_exchange(p, &old, &want, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
  return old;
}

using std::max;
using std::min;

inline float __expf(float x) { return std::exp(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 for one warp, with the
// fragment layouts of the PTX ISA ("Matrix Fragments for mma.m16n8k16 with
// floating point type"): groupID = lane>>2, t = lane%4;
//   A (16×16, row-major, bf16x2 registers a[0..3] holding a0..a7):
//     a[0] = (g, 2t..2t+1), a[1] = (g+8, 2t..), a[2] = (g, 2t+8..), a[3] = (g+8, 2t+8..)
//   B (16×8, "col": element (k, n)), b[0] = (k 2t..2t+1, n g), b[1] = (k 2t+8.., n g)
//   C/D (16×8 fp32): d[0..1] = (g, 2t..2t+1), d[2..3] = (g+8, 2t..2t+1)
// The low half of a register holds the lower-index element. Each output is
// c + Σ_k a·b summed in fp32 in ascending k.
inline float emuBF16(uint32_t reg, int hi) {
  uint32_t bits = (hi ? (reg >> 16) : (reg & 0xffff)) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline void emuMma16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  unsigned me = emu::linearThread(), warp = me / 32, lane = me % 32;
  uint32_t* slot = &emu::tBlock->mma[10 * me];
  for (int i = 0; i < 4; i++) slot[i] = a[i];
  for (int i = 0; i < 2; i++) slot[4 + i] = b[i];
  for (int i = 0; i < 4; i++) std::memcpy(&slot[6 + i], &d[i], 4);
  emu::tBlock->warps[warp]->arrive_and_wait();
  float A[16][16], B[16][8];
  for (unsigned l = 0; l < 32; l++) {
    const uint32_t* s = &emu::tBlock->mma[10 * (warp * 32 + l)];
    unsigned g = l >> 2, t = l % 4;
    for (int h = 0; h < 2; h++) {
      A[g][2 * t + h] = emuBF16(s[0], h);
      A[g + 8][2 * t + h] = emuBF16(s[1], h);
      A[g][2 * t + 8 + h] = emuBF16(s[2], h);
      A[g + 8][2 * t + 8 + h] = emuBF16(s[3], h);
      B[2 * t + h][g] = emuBF16(s[4], h);
      B[2 * t + 8 + h][g] = emuBF16(s[5], h);
    }
  }
  emu::tBlock->warps[warp]->arrive_and_wait();
  unsigned g = lane >> 2, t = lane % 4;
  for (int i = 0; i < 4; i++) {
    unsigned row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
    float acc = 0;
    for (int k = 0; k < 16; k++) acc += A[row][k] * B[k][col];
    d[i] += acc;
  }
}
