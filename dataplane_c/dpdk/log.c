/* SPDX-License-Identifier: Apache-2.0 */
/* log.c - registers homagg-switch's rte_log type (see log.h). */
#include "log.h"

RTE_LOG_REGISTER(hg_switch_logtype, homagg.switch, NOTICE);
