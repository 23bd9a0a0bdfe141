/* SPDX-License-Identifier: Apache-2.0 */
/*
 * homagg/errors.h - return conventions and error strings.
 *
 * Actions return 0 or a negative errno value; predicates return bool;
 * burst functions return the number of items handled; constructors return a
 * pointer or NULL.  The errno values used across the library are:
 *
 *   -EINVAL  an argument is malformed (NULL pointer, zero block length, ...)
 *   -EDOM    a gradient holds NaN or Inf (the first bad index is reported)
 *   -ERANGE  a count is out of range (workers, lanes, slots, sizes)
 *   -ENOMEM  an allocation failed
 *   -ENOSPC  an output buffer is too small
 *   -EPROTO  a packet or a peer broke the protocol
 *   -ETIMEDOUT a peer or the aggregator did not answer in time
 *   -EEXIST / -ENOENT  a job already exists / does not exist
 *   -ENOTSUP the CPU or the port lacks a requested feature
 *   -ECONNRESET the aggregator restarted (its incarnation changed) during
 *            an allreduce
 */
#ifndef HOMAGG_ERRORS_H
#define HOMAGG_ERRORS_H

#include <errno.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cdef-begin */
#define HG_ABI_VERSION 2

/* Version of the compiled library; the Python bindings check it at import. */
int hg_abi_version(void);

/* Human-readable text for a return code (0 or a negative errno). */
const char *hg_strerror(int rc);
/* cdef-end */

#ifdef __cplusplus
}
#endif

#endif /* HOMAGG_ERRORS_H */
