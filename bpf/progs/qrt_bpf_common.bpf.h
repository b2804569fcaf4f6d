/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Helpers shared by the qrtd BPF programs (BPF side only). */
#ifndef QRT_BPF_COMMON_BPF_H
#define QRT_BPF_COMMON_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

/* Each tracepoint handler exists twice: SEC("tp_btf/x") named tp_btf_<x> and
 * SEC("raw_tp/x") named raw_tp_<x>.  The loader probes tp_btf support and
 * turns autoload off for the flavour it does not use.  Both read kernel
 * memory with BPF_CORE_READ so that one handler body serves both. */

/* The dispatch threads, filled by the agent: TID -> 1. */
#define QRT_DISPATCH_TID_MAP(max)                                              \
	struct {                                                               \
		__uint(type, BPF_MAP_TYPE_HASH);                               \
		__uint(max_entries, max);                                      \
		__type(key, __u32);                                            \
		__type(value, __u8);                                           \
	} dispatch_tids SEC(".maps")

static __always_inline bool qrt_is_dispatch_tid(void *map, __u32 tid)
{
	return tid != 0 && bpf_map_lookup_elem(map, &tid) != NULL;
}

/* TASK_RUNNING is 0 on every kernel. */
#define QRT_TASK_RUNNING 0

#endif /* QRT_BPF_COMMON_BPF_H */
