/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Probe 2, intrusions on isolated CPUs: layout shared by intrusions.bpf.c and
 * the C++ loader (bpf/src/intrusion_probe.cpp static_asserts it).  Includes
 * nothing; __u32/__u64 come from vmlinux.h or <linux/types.h>. */
#ifndef QRT_BPF_INTRUSIONS_H
#define QRT_BPF_INTRUSIONS_H

#define QRT_INTRUSION_NAME_LEN 32
#define QRT_INTRUSION_MAX_CPUS 1024
#define QRT_INTRUSION_MASK_WORDS (QRT_INTRUSION_MAX_CPUS / 64)
#define QRT_INTRUSION_MAX_KEYS 8192

enum qrt_intrusion_kind {
	QRT_INTRUSION_HARDIRQ = 1,     /* id: IRQ number, name: irqaction name */
	QRT_INTRUSION_SOFTIRQ = 2,     /* id: softirq vector, name: empty */
	QRT_INTRUSION_TASK = 3,        /* id: TID, name: comm */
	QRT_INTRUSION_LOCAL_TIMER = 4, /* id: vector, name: empty (x86 LOC) */
};

struct qrt_intrusion_key {
	__u32 kind;
	__u32 cpu;
	__u32 id;
	__u32 pad;
	char name[QRT_INTRUSION_NAME_LEN];
};

struct qrt_intrusion_value {
	__u64 count;
	__u64 total_ns;
	__u64 max_ns;
	__u64 last_ns; /* bpf_ktime_get_ns() at the end of the latest one */
};

/* Per-CPU counters of what the probe could not account for. */
struct qrt_intrusion_stats {
	__u64 map_full;      /* key dropped: QRT_INTRUSION_MAX_KEYS reached */
	__u64 unmatched_exit; /* an exit without its entry (probe attached mid-way) */
};

#endif /* QRT_BPF_INTRUSIONS_H */
