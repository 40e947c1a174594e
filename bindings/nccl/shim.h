// A thin shim over NCCL loaded with dlopen: the few prototypes moex uses,
// declared here (no NCCL headers, no link-time dependency).
#ifndef MOEX_NCCL_SHIM_H
#define MOEX_NCCL_SHIM_H

#include <stddef.h>
#include <stdint.h>

typedef struct { char internal[128]; } moexNcclUniqueId;
typedef void* moexNcclComm;
typedef void* moexStream;

// Data types and reductions, with NCCL's values.
enum { MOEX_NCCL_INT8 = 0, MOEX_NCCL_INT32 = 2, MOEX_NCCL_INT64 = 4, MOEX_NCCL_FLOAT16 = 6, MOEX_NCCL_FLOAT32 = 7, MOEX_NCCL_BFLOAT16 = 9 };
enum { MOEX_NCCL_SUM = 0, MOEX_NCCL_PROD = 1, MOEX_NCCL_MAX = 2, MOEX_NCCL_MIN = 3 };

// moex_nccl_open loads the library at path; 0 on success, else -1 with
// the loader's message in err (errLen bytes).
int moex_nccl_open(const char* path, char* err, size_t errLen);

// ncclInProgress: a non-blocking communicator's call goes on in the
// background (ncclCommGetAsyncError reports when it is done).
enum { MOEX_NCCL_IN_PROGRESS = 7 };
// MOEX_NCCL_NO_CONFIG: the library predates ncclCommInitRankConfig (2.14).
enum { MOEX_NCCL_NO_CONFIG = -1 };

// Each returns NCCL's ncclResult_t (0: success).
int moex_nccl_get_unique_id(moexNcclUniqueId* id);
int moex_nccl_comm_init_rank(moexNcclComm* comm, int nranks, moexNcclUniqueId id, int rank);
// ncclCommInitRankConfig with a config that sets only blocking, or
// MOEX_NCCL_NO_CONFIG.
int moex_nccl_comm_init_rank_config(moexNcclComm* comm, int nranks, moexNcclUniqueId id, int rank, int blocking);
int moex_nccl_comm_destroy(moexNcclComm comm);
int moex_nccl_comm_abort(moexNcclComm comm);
int moex_nccl_comm_get_async_error(moexNcclComm comm, int* asyncError);
// Device buffers and streams travel as integers (addresses the GPU owns).
int moex_nccl_all_reduce(uintptr_t send, uintptr_t recv, size_t count, int dtype, int op, moexNcclComm comm, uintptr_t s);
int moex_nccl_all_gather(uintptr_t send, uintptr_t recv, size_t count, int dtype, moexNcclComm comm, uintptr_t s);
int moex_nccl_reduce_scatter(uintptr_t send, uintptr_t recv, size_t count, int dtype, int op, moexNcclComm comm, uintptr_t s);
int moex_nccl_send(uintptr_t buf, size_t count, int dtype, int peer, moexNcclComm comm, uintptr_t s);
int moex_nccl_recv(uintptr_t buf, size_t count, int dtype, int peer, moexNcclComm comm, uintptr_t s);
int moex_nccl_group_start(void);
int moex_nccl_group_end(void);
const char* moex_nccl_error_string(int result);

#endif
