// A stand-in for libnccl.so.2 that records every call, one line each, in
// the file NCCL_STUB_LOG, and fails the call named by NCCL_STUB_FAIL.
// Built by the tests (gcc -shared -fPIC; -DSTUB_NO_CONFIG leaves out
// ncclCommInitRankConfig, as in NCCL before 2.14); it touches no GPU.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef void* ncclComm_t;

static int record(const char* name, const char* fmt, ...);
#include <stdarg.h>

static int record(const char* name, const char* fmt, ...) {
  const char* path = getenv("NCCL_STUB_LOG");
  if (path) {
    FILE* f = fopen(path, "a");
    if (f) {
      va_list ap;
      va_start(ap, fmt);
      fprintf(f, "%s", name);
      vfprintf(f, fmt, ap);
      fprintf(f, "\n");
      va_end(ap);
      fclose(f);
    }
  }
  const char* fail = getenv("NCCL_STUB_FAIL");
  const char* code = getenv("NCCL_STUB_FAIL_CODE");  // default 3: ncclInternalError
  return fail && strcmp(fail, name) == 0 ? (code && *code ? atoi(code) : 3) : 0;
}

static char comm;  // the one communicator's handle

int ncclGetUniqueId(ncclUniqueId* id) {
  for (int i = 0; i < 128; i++) id->internal[i] = (char)(i * 3 + 1);
  return record("ncclGetUniqueId", "");
}
int ncclCommInitRank(ncclComm_t* c, int nranks, ncclUniqueId id, int rank) {
  *c = &comm;
  const char* wait = getenv("NCCL_STUB_INIT_SLEEP_MS");  // a peer that is late
  if (wait && *wait) usleep(1000 * atoi(wait));
  return record("ncclCommInitRank", " nranks=%d rank=%d id0=%d id127=%d", nranks, rank, id.internal[0], id.internal[127]);
}
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
} ncclConfig_t;
static int pending;  // polls of ncclCommGetAsyncError still to answer ncclInProgress (-1: forever)
#ifndef STUB_NO_CONFIG
int ncclCommInitRankConfig(ncclComm_t* c, int nranks, ncclUniqueId id, int rank, ncclConfig_t* cfg) {
  *c = &comm;
  const char* p = getenv("NCCL_STUB_PENDING");  // how long the ranks take to meet
  pending = p ? atoi(p) : 0;
  int r = record("ncclCommInitRankConfig", " nranks=%d rank=%d id0=%d size=%zu magic=%#x version=%u blocking=%d", nranks, rank,
                 id.internal[0], cfg->size, cfg->magic, cfg->version, cfg->blocking);
  return r == 0 && !cfg->blocking ? 7 : r;  // 7: ncclInProgress
}
#endif
int ncclCommDestroy(ncclComm_t c) { return record("ncclCommDestroy", " comm=%d", c == &comm); }
int ncclCommAbort(ncclComm_t c) { return record("ncclCommAbort", " comm=%d", c == &comm); }
int ncclCommGetAsyncError(ncclComm_t c, int* e) {
  const char* async = getenv("NCCL_STUB_ASYNC");  // the error in-flight work raised
  *e = async ? atoi(async) : 0;
  if (pending != 0) {
    *e = 7;  // ncclInProgress
    if (pending > 0) pending--;
  }
  return record("ncclCommGetAsyncError", " comm=%d", c == &comm);
}
int ncclAllReduce(const void* s, void* r, size_t n, int dt, int op, ncclComm_t c, void* st) {
  return record("ncclAllReduce", " send=%#lx recv=%#lx count=%zu dtype=%d op=%d comm=%d stream=%#lx", (unsigned long)(uintptr_t)s,
                (unsigned long)(uintptr_t)r, n, dt, op, c == &comm, (unsigned long)(uintptr_t)st);
}
int ncclAllGather(const void* s, void* r, size_t n, int dt, ncclComm_t c, void* st) {
  return record("ncclAllGather", " send=%#lx recv=%#lx count=%zu dtype=%d comm=%d stream=%#lx", (unsigned long)(uintptr_t)s,
                (unsigned long)(uintptr_t)r, n, dt, c == &comm, (unsigned long)(uintptr_t)st);
}
int ncclReduceScatter(const void* s, void* r, size_t n, int dt, int op, ncclComm_t c, void* st) {
  return record("ncclReduceScatter", " send=%#lx recv=%#lx count=%zu dtype=%d op=%d comm=%d stream=%#lx",
                (unsigned long)(uintptr_t)s, (unsigned long)(uintptr_t)r, n, dt, op, c == &comm, (unsigned long)(uintptr_t)st);
}
int ncclSend(const void* b, size_t n, int dt, int peer, ncclComm_t c, void* st) {
  return record("ncclSend", " buf=%#lx count=%zu dtype=%d peer=%d", (unsigned long)(uintptr_t)b, n, dt, peer);
}
int ncclRecv(void* b, size_t n, int dt, int peer, ncclComm_t c, void* st) {
  return record("ncclRecv", " buf=%#lx count=%zu dtype=%d peer=%d", (unsigned long)(uintptr_t)b, n, dt, peer);
}
int ncclGroupStart(void) { return record("ncclGroupStart", ""); }
int ncclGroupEnd(void) { return record("ncclGroupEnd", ""); }
const char* ncclGetErrorString(int r) { return r == 3 ? "stub internal error" : "stub: other"; }
