/* SPDX-License-Identifier: Apache-2.0 */
/*
 * homagg/wire.h - the HomAgg packet: Ethernet / IPv4 / UDP / HomAgg header /
 * payload lanes.  Every multi-byte field is big-endian (network order).
 * docs/PROTOCOL.md describes every byte; this header is its C form.
 *
 *   off size field
 *    0   1   version      HG_PROTOCOL_VERSION
 *    1   1   op           enum hg_op
 *    2   2   flags        HG_FLAG_*
 *    4   4   job          job id
 *    8   4   token        job token (a shared secret of the job's members)
 *   12   2   worker       worker id, 0..W-1
 *   14   2   slot         seq mod S
 *   16   4   seq          chunk sequence number of the job
 *   20   2   lanes        payload lanes (payload bytes = lanes * in-lane size)
 *   22   1   exp          signed; the NC8 "top" shift, 0 for other ops
 *   23   1   reserved     0
 *   24   ..  payload
 */
#ifndef HOMAGG_WIRE_H
#define HOMAGG_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cdef-begin */
#define HG_UDP_PORT 48879
#define HG_HDR_LEN 24
#define HG_ETH_IP_UDP_LEN 42
/* Default and largest payload: 1024 bytes = 256 int32 lanes. */
#define HG_DEFAULT_PAYLOAD 1024
#define HG_MAX_PAYLOAD 8192

#define HG_FLAG_RESULT 1
#define HG_FLAG_RETRANS 2
#define HG_FLAG_SHADOW 4
#define HG_FLAG_OVERFLOW 8
/* Aggregator -> worker: the slot is incomplete; payload = worker bitmap. */
#define HG_FLAG_STATUS 16

struct hg_hdr {
	uint8_t version;
	uint8_t op;
	uint16_t flags;
	uint32_t job;
	uint32_t token;
	uint16_t worker;
	uint16_t slot;
	uint32_t seq;
	uint16_t lanes;
	int8_t exp;
	uint8_t reserved;
};
/* cdef-end */

#ifdef __cplusplus
}
#endif

#endif /* HOMAGG_WIRE_H */
