/* SPDX-License-Identifier: Apache-2.0 */
/* Return-code strings and the ABI version (homagg/errors.h). */
#include <errno.h>
#include <string.h>

#include "homagg/errors.h"

int hg_abi_version(void)
{
	return HG_ABI_VERSION;
}

const char *hg_strerror(int rc)
{
	switch (-rc) {
	case 0:
		return "success";
	case EINVAL:
		return "invalid argument";
	case EDOM:
		return "value is NaN or infinite";
	case ERANGE:
		return "value out of range";
	case ENOMEM:
		return "out of memory";
	case ENOSPC:
		return "buffer too small";
	case EPROTO:
		return "protocol error";
	case ETIMEDOUT:
		return "timed out";
	case EEXIST:
		return "already exists";
	case ENOENT:
		return "no such entry";
	case ENOTSUP:
		return "not supported by this CPU or port";
	case EAGAIN:
		return "try again";
	case EBUSY:
		return "busy";
	case ECONNREFUSED:
		return "connection refused";
	case EIO:
		return "I/O error";
	case ECONNRESET:
		return "the peer restarted (connection reset)";
	case EMSGSIZE:
		return "frame larger than the port's MTU";
	default:
		return rc < 0 ? strerror(-rc) : "unknown error";
	}
}
