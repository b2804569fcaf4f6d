/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Probe 3, outliers: a dispatch thread whose wakeup latency exceeds
 * threshold_ns produces one ring buffer event holding the last
 * QRT_OUTLIER_HISTORY things that ran on its CPU (hardirqs, softirqs, task
 * run segments), so each spike comes with its cause.  Shared by
 * outliers.bpf.c and bpf/src/outlier_probe.cpp (which static_asserts it). */
#ifndef QRT_BPF_OUTLIERS_H
#define QRT_BPF_OUTLIERS_H

#define QRT_OUTLIER_HISTORY 16 /* power of two */
#define QRT_OUTLIER_NAME_LEN 32
#define QRT_OUTLIER_RINGBUF_BYTES (256 * 1024)

enum qrt_outlier_record_kind {
	QRT_OUTLIER_HARDIRQ = 1,     /* id: IRQ number, name: irqaction name */
	QRT_OUTLIER_SOFTIRQ = 2,     /* id: vector */
	QRT_OUTLIER_TASK = 3,        /* id: TID, name: comm; a run segment */
	QRT_OUTLIER_LOCAL_TIMER = 4, /* id: vector */
};

struct qrt_outlier_record {
	__u64 start_ns;
	__u64 duration_ns;
	__u32 kind; /* 0: empty slot */
	__u32 id;
	char name[QRT_OUTLIER_NAME_LEN];
};

struct qrt_outlier_event {
	__u64 wakeup_ns; /* bpf_ktime_get_ns() at sched_wakeup (CLOCK_MONOTONIC) */
	__u64 switch_ns; /* ... at the sched_switch onto the dispatch thread */
	__u64 latency_ns;
	__u32 tid;
	__u32 cpu;
	__u32 waker_cpu;
	__u32 record_count; /* valid entries in records[], oldest first */
	char comm[16];
	struct qrt_outlier_record records[QRT_OUTLIER_HISTORY];
};

#endif /* QRT_BPF_OUTLIERS_H */
