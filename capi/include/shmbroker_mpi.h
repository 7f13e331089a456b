/* shmbroker_mpi.h: shmbroker's collectives for an MPI program whose job spans nodes. Shared
 * memory carries everything inside each node; the program's own MPI carries what goes between
 * nodes. Header only: it is compiled into the program with its MPI (mpicc, or CMake's
 * find_package(MPI)), so libshmbroker itself never depends on an MPI.
 *
 *     #include <shmbroker_mpi.h>
 *     shmbroker_mpi *m;
 *     shmbroker_mpi_init(MPI_COMM_WORLD, 30000, &m);     // collective over the communicator
 *     shmbroker_mpi_all_reduce(m, data, n, SHMBROKER_DTYPE_F32, SHMBROKER_OP_SUM);
 *     shmbroker_mpi_free(m);
 *
 * Where each rank stands: its node is SHMBROKER_NODE when set (so that tests on one machine can
 * form several nodes), otherwise the host's name and boot id. The ranks of one node, in the
 * communicator's order, share one shmbroker session on a broker the node's first rank hosts in
 * a fresh private directory; its path goes to the others over MPI.
 *
 * The MPI legs: `leaders` (the first rank of every node), and `rail` (when every node has the
 * same number L > 1 of ranks: the j-th rank of every node).
 *
 * - all_reduce, up to SHMBROKER_MPI_RAILS_MIN_BYTES or on an uneven layout: reduce to the node's
 *   first rank, MPI_Allreduce among leaders, broadcast in the node. Above it: reduce_scatter in
 *   the node, MPI_Allreduce of each slice on its rail, all_gather in the node.
 * - barrier: in the node, among leaders, in the node.
 * - broadcast: in the root's node, among leaders, in every other node.
 * - all_gather: in the node, node blocks among leaders, a broadcast in the node.
 *
 * Floats combine in the node in rank order, then between nodes in MPI's order: every rank gets
 * the same bits for a fixed layout and MPI. Types MPI lacks (F16, BF16) are SHMBROKER_E_MISUSE.
 * AVG is a sum divided by the size (floats only).
 *
 * Errors: shmbroker's codes. A failure inside a node (a peer's death, a deadline) returns its
 * code on that node's ranks only; the other nodes then wait in MPI, which has no deadline. So
 * end the job on any error, as MPI programs do for MPI's own (MPI_Abort): the examples do.
 * shmbroker_mpi_last_error_rank() names the communicator's rank a failure inside a node was
 * about. Between nodes, the communicator's MPI error handler rules. Calls take the
 * communicator's turn: make them in the same order on every rank, from one thread at a time.
 * Counts and byte lengths above INT_MAX are SHMBROKER_E_MISUSE (MPI's `int`).
 */
#ifndef SHMBROKER_MPI_H
#define SHMBROKER_MPI_H

#include <mpi.h>
#include <shmbroker.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* All-reduces of more bytes than this, on a layout with the same number of ranks on every node,
 * run on every rail at once (multi-leader); smaller ones through the node's first rank. */
#define SHMBROKER_MPI_RAILS_MIN_BYTES (256u * 1024u)

/* How long a node's name may be (SHMBROKER_NODE, or host name and boot id). */
#define SHMBROKER_MPI_NAME_MAX 256

typedef struct shmbroker_mpi {
  MPI_Comm comm;     /* a duplicate of the program's communicator */
  MPI_Comm node;     /* the ranks of this node */
  MPI_Comm leaders;  /* the first rank of every node (MPI_COMM_NULL elsewhere) */
  MPI_Comm rail;     /* the j-th rank of every node, when balanced (else MPI_COMM_NULL) */
  struct shmbroker_session *session; /* this node's ranks (NULL for a node of one) */
  int rank, size;                    /* in `comm` */
  int local_rank, local_size;        /* in this node */
  int nodes, widest, balanced;
  int *node_of;     /* per rank of `comm`: its node, numbered by first rank */
  int *local_of;    /* per rank of `comm`: its index in its node */
  char dir[SHMBROKER_MPI_NAME_MAX]; /* the socket's directory, on the node's first rank */
  /* Why this header refused the last call on `m` itself (NULL: the call failed in the library,
   * whose shmbroker_last_error says why, or did not fail). */
  const char *why;
} shmbroker_mpi;

/* Records that this header refuses a call on `m` for `why`, and returns `code`. */
static inline int shmbroker_mpi_refuse_(shmbroker_mpi *m, int code, const char *why) {
  m->why = why;
  return code;
}

/* The element size of a shmbroker element type, or 0. */
static inline size_t shmbroker_mpi_elem_size_(int dtype) {
  switch (dtype) {
    case SHMBROKER_DTYPE_U8: case SHMBROKER_DTYPE_I8: return 1;
    case SHMBROKER_DTYPE_U16: case SHMBROKER_DTYPE_I16:
    case SHMBROKER_DTYPE_F16: case SHMBROKER_DTYPE_BF16: return 2;
    case SHMBROKER_DTYPE_U32: case SHMBROKER_DTYPE_I32: case SHMBROKER_DTYPE_F32: return 4;
    case SHMBROKER_DTYPE_U64: case SHMBROKER_DTYPE_I64: case SHMBROKER_DTYPE_F64: return 8;
    default: return 0;
  }
}

/* MPI's type for a shmbroker element type; MPI_DATATYPE_NULL where MPI has none. */
static inline MPI_Datatype shmbroker_mpi_type_(int dtype) {
  switch (dtype) {
    case SHMBROKER_DTYPE_U8: return MPI_UINT8_T;
    case SHMBROKER_DTYPE_I8: return MPI_INT8_T;
    case SHMBROKER_DTYPE_U16: return MPI_UINT16_T;
    case SHMBROKER_DTYPE_I16: return MPI_INT16_T;
    case SHMBROKER_DTYPE_U32: return MPI_UINT32_T;
    case SHMBROKER_DTYPE_I32: return MPI_INT32_T;
    case SHMBROKER_DTYPE_U64: return MPI_UINT64_T;
    case SHMBROKER_DTYPE_I64: return MPI_INT64_T;
    case SHMBROKER_DTYPE_F32: return MPI_FLOAT;
    case SHMBROKER_DTYPE_F64: return MPI_DOUBLE;
    default: return MPI_DATATYPE_NULL;
  }
}

/* MPI's operation for a shmbroker operation (AVG: a sum); MPI_OP_NULL for an unknown one. */
static inline MPI_Op shmbroker_mpi_op_(int op) {
  switch (op) {
    case SHMBROKER_OP_SUM: case SHMBROKER_OP_AVG: return MPI_SUM;
    case SHMBROKER_OP_PROD: return MPI_PROD;
    case SHMBROKER_OP_MIN: return MPI_MIN;
    case SHMBROKER_OP_MAX: return MPI_MAX;
    case SHMBROKER_OP_BIT_AND: return MPI_BAND;
    case SHMBROKER_OP_BIT_OR: return MPI_BOR;
    case SHMBROKER_OP_BIT_XOR: return MPI_BXOR;
    default: return MPI_OP_NULL;
  }
}

/* This process's node: `named` when given, else SHMBROKER_NODE, else "host/boot id". */
static inline void shmbroker_mpi_node_name_(const char *named, char name[SHMBROKER_MPI_NAME_MAX]) {
  if (named == NULL) named = getenv("SHMBROKER_NODE");
  memset(name, 0, SHMBROKER_MPI_NAME_MAX);
  if (named != NULL && named[0] != '\0') {
    snprintf(name, SHMBROKER_MPI_NAME_MAX, "%s", named);
    return;
  }
  char host[128] = {0};
  char boot[64] = {0};
  gethostname(host, sizeof host - 1);
  FILE *file = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (file != NULL) {
    if (fgets(boot, sizeof boot, file) == NULL) boot[0] = '\0';
    fclose(file);
    boot[strcspn(boot, "\n")] = '\0';
  }
  snprintf(name, SHMBROKER_MPI_NAME_MAX, "%s/%s", host, boot);
}

/* Sets `name` to `value` (NULL: unsets it), keeping what it was in `old` (NULL when unset). */
static inline void shmbroker_mpi_swap_env_(const char *name, const char *value, char **old) {
  const char *was = getenv(name);
  *old = was != NULL ? strdup(was) : NULL;
  if (value != NULL) {
    setenv(name, value, 1);
  } else {
    unsetenv(name);
  }
}

/* Joins this node's session: the node's first rank hosts its broker in a fresh directory and
 * tells the others its socket's path. The three variables shmbroker_from_env reads are set
 * for the call and put back after it. */
static inline int shmbroker_mpi_join_(shmbroker_mpi *m, uint64_t timeout_ms) {
  char path[SHMBROKER_MPI_NAME_MAX + 16] = {0};
  int made = 1;
  if (m->local_rank == 0) {
    const char *base = getenv("TMPDIR");
    snprintf(m->dir, sizeof m->dir, "%s/shmbroker-mpi-XXXXXX", base ? base : "/tmp");
    made = mkdtemp(m->dir) != NULL;
    if (made) snprintf(path, sizeof path, "%s/broker.sock", m->dir);
  }
  MPI_Bcast(&made, 1, MPI_INT, 0, m->node);
  if (!made) return SHMBROKER_E_IO;
  MPI_Bcast(path, (int)sizeof path, MPI_CHAR, 0, m->node);
  char rank[16], size[16];
  snprintf(rank, sizeof rank, "%d", m->local_rank);
  snprintf(size, sizeof size, "%d", m->local_size);
  char *old[3];
  shmbroker_mpi_swap_env_("SHMBROKER_RANK", rank, &old[0]);
  shmbroker_mpi_swap_env_("SHMBROKER_WORLD_SIZE", size, &old[1]);
  shmbroker_mpi_swap_env_("SHMBROKER_SOCKET", path, &old[2]);
  int rc = shmbroker_from_env(timeout_ms, &m->session);
  const char *names[3] = {"SHMBROKER_RANK", "SHMBROKER_WORLD_SIZE", "SHMBROKER_SOCKET"};
  for (int i = 0; i < 3; i++) {
    char *unused;
    shmbroker_mpi_swap_env_(names[i], old[i], &unused);
    free(unused);
    free(old[i]);
  }
  /* Every rank of the node learns whether all joined. */
  int worst = rc;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MIN, m->node);
  return worst;
}

/* Releases `m` (NULL: nothing): its session, communicators and the broker's directory.
 * Collective, as MPI_Comm_free is. */
static inline void shmbroker_mpi_free(shmbroker_mpi *m) {
  if (m == NULL) return;
  if (m->session != NULL) shmbroker_close(m->session);
  if (m->local_rank == 0 && m->dir[0] != '\0') {
    char path[SHMBROKER_MPI_NAME_MAX + 16];
    snprintf(path, sizeof path, "%s/broker.sock", m->dir);
    unlink(path);
    rmdir(m->dir);
  }
  MPI_Comm *comms[4] = {&m->rail, &m->leaders, &m->node, &m->comm};
  for (int i = 0; i < 4; i++) {
    if (*comms[i] != MPI_COMM_NULL) MPI_Comm_free(comms[i]);
  }
  free(m->node_of);
  free(m->local_of);
  free(m);
}

/* As shmbroker_mpi_init, with this rank's node named by the caller (what its launcher says)
 * instead of SHMBROKER_NODE or the host's identity (NULL: those). Ranks that pass the same
 * name are on one node. */
static inline int shmbroker_mpi_init_on(MPI_Comm comm, const char *name, uint64_t timeout_ms,
                                        shmbroker_mpi **out) {
  *out = NULL;
  shmbroker_mpi *m = (shmbroker_mpi *)calloc(1, sizeof *m);
  if (m == NULL) return SHMBROKER_E_INTERNAL;
  m->comm = m->node = m->leaders = m->rail = MPI_COMM_NULL;
  MPI_Comm_dup(comm, &m->comm);
  MPI_Comm_rank(m->comm, &m->rank);
  MPI_Comm_size(m->comm, &m->size);
  /* Every rank's node name; a node is numbered by its first rank. */
  char *names = (char *)calloc((size_t)m->size, SHMBROKER_MPI_NAME_MAX);
  m->node_of = (int *)calloc((size_t)m->size, sizeof(int));
  m->local_of = (int *)calloc((size_t)m->size, sizeof(int));
  int *first = (int *)calloc((size_t)m->size, sizeof(int));
  int *count = (int *)calloc((size_t)m->size, sizeof(int));
  if (names == NULL || m->node_of == NULL || m->local_of == NULL || first == NULL ||
      count == NULL) {
    free(names), free(first), free(count);
    shmbroker_mpi_free(m);
    return SHMBROKER_E_INTERNAL;
  }
  char mine[SHMBROKER_MPI_NAME_MAX];
  shmbroker_mpi_node_name_(name, mine);
  MPI_Allgather(mine, SHMBROKER_MPI_NAME_MAX, MPI_CHAR, names, SHMBROKER_MPI_NAME_MAX, MPI_CHAR,
                m->comm);
  m->nodes = 0;
  for (int r = 0; r < m->size; r++) {
    int n = 0;
    while (n < m->nodes &&
           strncmp(names + (size_t)first[n] * SHMBROKER_MPI_NAME_MAX,
                   names + (size_t)r * SHMBROKER_MPI_NAME_MAX, SHMBROKER_MPI_NAME_MAX) != 0) {
      n++;
    }
    if (n == m->nodes) first[m->nodes++] = r;
    m->node_of[r] = n;
    m->local_of[r] = count[n]++;
  }
  m->widest = 0;
  m->balanced = 1;
  for (int n = 0; n < m->nodes; n++) {
    if (count[n] > m->widest) m->widest = count[n];
    if (count[n] != count[0]) m->balanced = 0;
  }
  int node = m->node_of[m->rank];
  m->local_rank = m->local_of[m->rank];
  m->local_size = count[node];
  m->balanced = m->balanced && m->local_size > 1;
  free(names), free(first), free(count);
  MPI_Comm_split(m->comm, node, m->rank, &m->node);
  MPI_Comm_split(m->comm, m->local_rank == 0 ? 0 : MPI_UNDEFINED, m->rank, &m->leaders);
  if (m->balanced) MPI_Comm_split(m->comm, m->local_rank, m->rank, &m->rail);
  int rc = SHMBROKER_OK;
  if (m->local_size > 1) rc = shmbroker_mpi_join_(m, timeout_ms);
  /* Every rank learns whether every node joined: none goes on alone. */
  int worst = rc;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MIN, m->comm);
  if (worst != SHMBROKER_OK) {
    shmbroker_mpi_free(m);
    return worst;
  }
  *out = m;
  return SHMBROKER_OK;
}

/* Makes `*out` for the ranks of `comm`, collectively: every rank of `comm` calls it. Within
 * `timeout_ms` for the node's session, which is also every later call's deadline inside a
 * node. SHMBROKER_OK on every rank, or on every rank the worst code of any rank (another
 * node's failure too: this rank's shmbroker_last_error then says nothing of it). */
static inline int shmbroker_mpi_init(MPI_Comm comm, uint64_t timeout_ms, shmbroker_mpi **out) {
  return shmbroker_mpi_init_on(comm, NULL, timeout_ms, out);
}

/* Why the last failed call on `m` failed: this header's reason when it refused the call itself,
 * else the library's (shmbroker_last_error, of this thread). */
static inline const char *shmbroker_mpi_last_error(const shmbroker_mpi *m) {
  return m->why != NULL ? m->why : shmbroker_last_error();
}

/* The communicator's rank that the last failed call on `m` named inside this node
 * (shmbroker_last_error_rank, renumbered), or -1: also when this header refused the call
 * itself, which names no rank. */
static inline int64_t shmbroker_mpi_last_error_rank(const shmbroker_mpi *m) {
  if (m->why != NULL) return -1;
  int64_t local = shmbroker_last_error_rank();
  if (local < 0) return -1;
  int node = m->node_of[m->rank];
  for (int r = 0; r < m->size; r++) {
    if (m->node_of[r] == node && m->local_of[r] == local) return r;
  }
  return -1;
}

/* A barrier over every rank of the communicator. */
static inline int shmbroker_mpi_barrier(shmbroker_mpi *m) {
  m->why = NULL;
  int rc = SHMBROKER_OK;
  if (m->session != NULL && (rc = shmbroker_barrier(m->session)) != SHMBROKER_OK) return rc;
  if (m->leaders != MPI_COMM_NULL) MPI_Barrier(m->leaders);
  if (m->session != NULL) rc = shmbroker_barrier(m->session);
  return rc;
}

/* Divides `count` elements of `dtype` (F32 or F64, as the caller checked) by `by`, in place. */
static inline void shmbroker_mpi_divide_(void *data, size_t count, int dtype, int by) {
  if (dtype == SHMBROKER_DTYPE_F32) {
    float *x = (float *)data;
    for (size_t i = 0; i < count; i++) x[i] /= (float)by;
  } else {
    double *x = (double *)data;
    for (size_t i = 0; i < count; i++) x[i] /= (double)by;
  }
}

/* Multi-leader: reduce_scatter in the node, each slice on its rail, all_gather in the node. */
static inline int shmbroker_mpi_rails_(shmbroker_mpi *m, void *data, size_t count, int dtype,
                                       int op) {
  size_t size = shmbroker_mpi_elem_size_(dtype);
  size_t parts = (size_t)m->local_size;
  size_t slice = (count + parts - 1) / parts;
  char *padded = (char *)calloc(slice * parts, size);
  char *mine = (char *)malloc(slice * size);
  int rc = shmbroker_mpi_refuse_(m, SHMBROKER_E_INTERNAL, "out of memory");
  if (padded != NULL && mine != NULL) {
    m->why = NULL;
    memcpy(padded, data, count * size);
    rc = shmbroker_reduce_scatter(m->session, padded, mine, slice, dtype, op);
    if (rc == SHMBROKER_OK) {
      MPI_Allreduce(MPI_IN_PLACE, mine, (int)slice, shmbroker_mpi_type_(dtype),
                    shmbroker_mpi_op_(op), m->rail);
      rc = shmbroker_all_gather(m->session, mine, slice * size, padded);
    }
    if (rc == SHMBROKER_OK) memcpy(data, padded, count * size);
  }
  free(padded);
  free(mine);
  return rc;
}

/* Combines every rank's `count` elements of `dtype` in `data` with `op`, into every rank's
 * `data`. SHMBROKER_E_MISUSE for a type MPI lacks (F16, BF16) or AVG of integers. */
static inline int shmbroker_mpi_all_reduce(shmbroker_mpi *m, void *data, size_t count, int dtype,
                                           int op) {
  m->why = NULL;
  if (shmbroker_mpi_type_(dtype) == MPI_DATATYPE_NULL) {
    return shmbroker_mpi_refuse_(m, SHMBROKER_E_MISUSE, "MPI has no type for this dtype");
  }
  if (shmbroker_mpi_op_(op) == MPI_OP_NULL) {
    return shmbroker_mpi_refuse_(m, SHMBROKER_E_MISUSE, "no such operation");
  }
  if (op == SHMBROKER_OP_AVG && dtype != SHMBROKER_DTYPE_F32 && dtype != SHMBROKER_DTYPE_F64) {
    return shmbroker_mpi_refuse_(m, SHMBROKER_E_MISUSE, "AVG across nodes is of F32 and F64");
  }
  if (count > (size_t)INT_MAX) {
    return shmbroker_mpi_refuse_(m, SHMBROKER_E_MISUSE, "a count above INT_MAX (MPI's int)");
  }
  int local_op = op == SHMBROKER_OP_AVG ? SHMBROKER_OP_SUM : op;
  size_t bytes = count * shmbroker_mpi_elem_size_(dtype);
  int rc = SHMBROKER_OK;
  if (m->balanced && bytes > SHMBROKER_MPI_RAILS_MIN_BYTES) {
    rc = shmbroker_mpi_rails_(m, data, count, dtype, local_op);
  } else {
    if (m->session != NULL) rc = shmbroker_reduce(m->session, 0, data, count, dtype, local_op);
    if (rc == SHMBROKER_OK && m->leaders != MPI_COMM_NULL) {
      MPI_Allreduce(MPI_IN_PLACE, data, (int)count, shmbroker_mpi_type_(dtype),
                    shmbroker_mpi_op_(op), m->leaders);
    }
    if (rc == SHMBROKER_OK && m->session != NULL) {
      rc = shmbroker_broadcast(m->session, 0, data, bytes);
    }
  }
  if (rc == SHMBROKER_OK && op == SHMBROKER_OP_AVG) {
    shmbroker_mpi_divide_(data, count, dtype, m->size);
  }
  return rc;
}

/* Rank `root`'s `len` bytes into every rank's `buf`. */
static inline int shmbroker_mpi_broadcast(shmbroker_mpi *m, int root, void *buf, size_t len) {
  m->why = NULL;
  if (root < 0 || root >= m->size) {
    return shmbroker_mpi_refuse_(m, SHMBROKER_E_MISUSE, "a root outside the communicator");
  }
  if (len > (size_t)INT_MAX) {
    return shmbroker_mpi_refuse_(m, SHMBROKER_E_MISUSE, "a length above INT_MAX (MPI's int)");
  }
  int root_node = m->node_of[root];
  int here = m->node_of[m->rank] == root_node;
  int rc = SHMBROKER_OK;
  if (here && m->session != NULL) {
    rc = shmbroker_broadcast(m->session, (uint32_t)m->local_of[root], buf, len);
  }
  if (rc == SHMBROKER_OK && m->leaders != MPI_COMM_NULL) {
    MPI_Bcast(buf, (int)len, MPI_BYTE, root_node, m->leaders);
  }
  if (rc == SHMBROKER_OK && !here && m->session != NULL) {
    rc = shmbroker_broadcast(m->session, 0, buf, len);
  }
  return rc;
}

/* Every rank's `len` bytes, in the communicator's rank order, into `out` (`len * size`). */
static inline int shmbroker_mpi_all_gather(shmbroker_mpi *m, const void *data, size_t len,
                                           void *out) {
  m->why = NULL;
  size_t block = (size_t)m->widest * len;
  if (block > (size_t)INT_MAX) {
    return shmbroker_mpi_refuse_(m, SHMBROKER_E_MISUSE, "a node's block above INT_MAX bytes");
  }
  char *mine = (char *)calloc(block ? block : 1, 1);
  char *all = (char *)malloc((size_t)m->nodes * block + 1);
  int rc = shmbroker_mpi_refuse_(m, SHMBROKER_E_INTERNAL, "out of memory");
  if (mine != NULL && all != NULL) {
    m->why = NULL;
    rc = SHMBROKER_OK;
    if (m->session != NULL) {
      rc = shmbroker_all_gather(m->session, data, len, mine);
    } else if (len > 0) {
      memcpy(mine, data, len);
    }
    if (rc == SHMBROKER_OK && m->leaders != MPI_COMM_NULL) {
      MPI_Allgather(mine, (int)block, MPI_BYTE, all, (int)block, MPI_BYTE, m->leaders);
    }
    if (rc == SHMBROKER_OK && m->session != NULL) {
      rc = shmbroker_broadcast(m->session, 0, all, (size_t)m->nodes * block);
    }
    for (int r = 0; rc == SHMBROKER_OK && r < m->size && len > 0; r++) {
      size_t at = (size_t)m->node_of[r] * block + (size_t)m->local_of[r] * len;
      memcpy((char *)out + (size_t)r * len, all + at, len);
    }
  }
  free(mine);
  free(all);
  return rc;
}

#endif /* SHMBROKER_MPI_H */
