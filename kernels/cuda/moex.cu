// All of moex's CUDA kernels, one translation unit: nvcc builds it into one
// fatbin (sm_80, sm_90 and PTX); the CPU emulation includes it too.
#include "mla_decode.cu"
#include "moe_routing.cu"
#include "grouped_gemm.cu"
#include "mla_prep.cu"
