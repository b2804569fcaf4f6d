/* Shared between wakeup_trace.bpf.c and wakeup_trace.cpp (qrt-wakeup-trace). */
#pragma once

#define QRT_WT_MAX_CPUS 64
#define QRT_WT_COMM_LEN 16

/* Per (CPU the event ran on, task that ran it). */
struct qrt_wt_key {
	__u32 cpu;
	char comm[QRT_WT_COMM_LEN];
};

struct qrt_wt_sender {
	__u64 waking_remote;       /* sched_waking of a task last on another CPU */
	__u64 waking_local;        /* sched_waking of a task last on this CPU */
	__u64 wake_idle_no_ipi;    /* sched_wake_idle_without_ipi: target polling, no IPI */
	__u64 ipi_sent;            /* ipi_send_cpu + ipi_send_cpumask */
	__u64 ttwu_count;          /* try_to_wake_up calls timed (fentry/fexit) */
	__u64 ttwu_total_ns;
	__u64 ttwu_max_ns;
	__u64 ttwu_ge_2us;         /* ttwu calls of 2 us or more */
};

/* Per CPU that received something. */
struct qrt_wt_receiver {
	__u64 resched_ipi;         /* reschedule_entry */
	__u64 call_function_ipi;   /* call_function_entry + call_function_single_entry */
	__u64 net_rx;              /* NET_RX softirq runs */
	__u64 net_rx_ns;
};
