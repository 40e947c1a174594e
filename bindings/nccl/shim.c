//go:build cgo

#include "shim.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static void* lib;

// ncclConfig_t as NCCL 2.14 introduced it. Later libraries copy the
// config's own size and reset the fields its version lacks to defaults.
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
} moexNcclConfig;
#define MOEX_NCCL_CONFIG_MAGIC 0xcafebeef
#define MOEX_NCCL_CONFIG_VERSION 21400  // NCCL_VERSION(2, 14, 0)

typedef int (*fnGetUniqueId)(moexNcclUniqueId*);
typedef int (*fnCommInitRankConfig)(moexNcclComm*, int, moexNcclUniqueId, int, moexNcclConfig*);
typedef int (*fnCommInitRank)(moexNcclComm*, int, moexNcclUniqueId, int);
typedef int (*fnComm)(moexNcclComm);
typedef int (*fnCommAsync)(moexNcclComm, int*);
typedef int (*fnAllReduce)(const void*, void*, size_t, int, int, moexNcclComm, moexStream);
typedef int (*fnAllGather)(const void*, void*, size_t, int, moexNcclComm, moexStream);
typedef int (*fnSend)(const void*, size_t, int, int, moexNcclComm, moexStream);
typedef int (*fnRecv)(void*, size_t, int, int, moexNcclComm, moexStream);
typedef int (*fnVoid)(void);
typedef const char* (*fnErrorString)(int);

static fnGetUniqueId pGetUniqueId;
static fnCommInitRank pCommInitRank;
static fnCommInitRankConfig pCommInitRankConfig;  // NULL before NCCL 2.14
static fnComm pCommDestroy, pCommAbort;
static fnCommAsync pCommGetAsyncError;
static fnAllReduce pAllReduce, pReduceScatter;
static fnAllGather pAllGather;
static fnSend pSend;
static fnRecv pRecv;
static fnVoid pGroupStart, pGroupEnd;
static fnErrorString pErrorString;

int moex_nccl_open(const char* path, char* err, size_t errLen) {
  dlerror();
  lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    const char* e = dlerror();
    snprintf(err, errLen, "%s", e ? e : "dlopen failed");
    return -1;
  }
#define LOAD(var, type, name)                                   \
  var = (type)dlsym(lib, name);                                 \
  if (var == NULL) {                                            \
    snprintf(err, errLen, "%s: symbol %s not found", path, name); \
    dlclose(lib);                                               \
    lib = NULL;                                                 \
    return -1;                                                  \
  }
  LOAD(pGetUniqueId, fnGetUniqueId, "ncclGetUniqueId");
  LOAD(pCommInitRank, fnCommInitRank, "ncclCommInitRank");
  LOAD(pCommDestroy, fnComm, "ncclCommDestroy");
  LOAD(pCommAbort, fnComm, "ncclCommAbort");
  LOAD(pCommGetAsyncError, fnCommAsync, "ncclCommGetAsyncError");
  LOAD(pAllReduce, fnAllReduce, "ncclAllReduce");
  LOAD(pAllGather, fnAllGather, "ncclAllGather");
  LOAD(pReduceScatter, fnAllReduce, "ncclReduceScatter");
  LOAD(pSend, fnSend, "ncclSend");
  LOAD(pRecv, fnRecv, "ncclRecv");
  LOAD(pGroupStart, fnVoid, "ncclGroupStart");
  LOAD(pGroupEnd, fnVoid, "ncclGroupEnd");
  LOAD(pErrorString, fnErrorString, "ncclGetErrorString");
#undef LOAD
  pCommInitRankConfig = (fnCommInitRankConfig)dlsym(lib, "ncclCommInitRankConfig");
  return 0;
}

int moex_nccl_get_unique_id(moexNcclUniqueId* id) { return pGetUniqueId(id); }
int moex_nccl_comm_init_rank(moexNcclComm* comm, int nranks, moexNcclUniqueId id, int rank) {
  return pCommInitRank(comm, nranks, id, rank);
}
int moex_nccl_comm_init_rank_config(moexNcclComm* comm, int nranks, moexNcclUniqueId id, int rank, int blocking) {
  if (pCommInitRankConfig == NULL) return MOEX_NCCL_NO_CONFIG;
  moexNcclConfig cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.size = sizeof cfg;
  cfg.magic = MOEX_NCCL_CONFIG_MAGIC;
  cfg.version = MOEX_NCCL_CONFIG_VERSION;
  cfg.blocking = blocking;
  return pCommInitRankConfig(comm, nranks, id, rank, &cfg);
}
int moex_nccl_comm_destroy(moexNcclComm comm) { return pCommDestroy(comm); }
int moex_nccl_comm_abort(moexNcclComm comm) { return pCommAbort(comm); }
int moex_nccl_comm_get_async_error(moexNcclComm comm, int* e) { return pCommGetAsyncError(comm, e); }
int moex_nccl_all_reduce(uintptr_t s, uintptr_t r, size_t n, int dt, int op, moexNcclComm c, uintptr_t st) {
  return pAllReduce((const void*)s, (void*)r, n, dt, op, c, (moexStream)st);
}
int moex_nccl_all_gather(uintptr_t s, uintptr_t r, size_t n, int dt, moexNcclComm c, uintptr_t st) {
  return pAllGather((const void*)s, (void*)r, n, dt, c, (moexStream)st);
}
int moex_nccl_reduce_scatter(uintptr_t s, uintptr_t r, size_t n, int dt, int op, moexNcclComm c, uintptr_t st) {
  return pReduceScatter((const void*)s, (void*)r, n, dt, op, c, (moexStream)st);
}
int moex_nccl_send(uintptr_t b, size_t n, int dt, int peer, moexNcclComm c, uintptr_t st) {
  return pSend((const void*)b, n, dt, peer, c, (moexStream)st);
}
int moex_nccl_recv(uintptr_t b, size_t n, int dt, int peer, moexNcclComm c, uintptr_t st) {
  return pRecv((void*)b, n, dt, peer, c, (moexStream)st);
}
int moex_nccl_group_start(void) { return pGroupStart(); }
int moex_nccl_group_end(void) { return pGroupEnd(); }
const char* moex_nccl_error_string(int r) { return pErrorString(r); }
