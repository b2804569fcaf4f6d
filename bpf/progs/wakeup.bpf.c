// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* Probe 1: wakeup latency of the dispatch threads, from sched_wakeup /
 * sched_wakeup_new (or a preemption that leaves the thread runnable) to the
 * sched_switch that puts it on a CPU.  Same definition as libbpf-tools
 * runqlat, restricted to the TIDs in dispatch_tids.  The histogram is
 * per-CPU (the CPU the thread was switched in on); the loader sums CPUs. */
#include "qrt_bpf_common.bpf.h"
#include "wakeup.h"

/* Count a preemption that leaves a dispatch thread runnable as a new wait
 * (runqlat does).  Set by the loader between open and load. */
const volatile bool count_preempted = true;

QRT_DISPATCH_TID_MAP(QRT_MAX_DISPATCH_TIDS);

/* TID -> bpf_ktime_get_ns() when it became runnable. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, QRT_MAX_DISPATCH_TIDS);
	__type(key, __u32);
	__type(value, __u64);
} wakeup_start_ns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct qrt_wakeup_hist);
} wakeup_hist SEC(".maps");

static __always_inline int on_wakeup(struct task_struct *p)
{
	__u32 tid = BPF_CORE_READ(p, pid);
	__u64 now_ns;

	if (!qrt_is_dispatch_tid(&dispatch_tids, tid))
		return 0;
	now_ns = bpf_ktime_get_ns();
	bpf_map_update_elem(&wakeup_start_ns, &tid, &now_ns, BPF_ANY);
	return 0;
}

static __always_inline int on_switch(struct task_struct *prev, struct task_struct *next,
				     unsigned int prev_state)
{
	__u32 prev_tid = BPF_CORE_READ(prev, pid);
	__u32 next_tid = BPF_CORE_READ(next, pid);
	struct qrt_wakeup_hist *hist;
	__u64 *start_ns, delta_ns, now_ns, idx;
	__u32 zero = 0;

	now_ns = bpf_ktime_get_ns();
	if (count_preempted && prev_state == QRT_TASK_RUNNING &&
	    qrt_is_dispatch_tid(&dispatch_tids, prev_tid))
		bpf_map_update_elem(&wakeup_start_ns, &prev_tid, &now_ns, BPF_ANY);

	if (next_tid == 0)
		return 0;
	start_ns = bpf_map_lookup_elem(&wakeup_start_ns, &next_tid);
	if (!start_ns)
		return 0;
	delta_ns = now_ns - *start_ns;
	bpf_map_delete_elem(&wakeup_start_ns, &next_tid);
	if ((__s64)delta_ns < 0)
		return 0;

	hist = bpf_map_lookup_elem(&wakeup_hist, &zero);
	if (!hist)
		return 0;
	/* A 64-bit index clamped in the register that indexes: with a __u32,
	 * clang tested one zero-extended copy and indexed with another, whose
	 * bound the 6.1 verifier does not know ("R0 unbounded memory access"). */
	idx = qrt_wakeup_bucket(delta_ns);
	barrier_var(idx);
	if (idx >= QRT_WAKEUP_BUCKETS)
		idx = QRT_WAKEUP_BUCKETS - 1;
	barrier_var(idx);
	/* Per-CPU value and preemption disabled in the tracepoint: plain
	 * increments are race free. */
	hist->bucket_count[idx]++;
	hist->count++;
	hist->sum_ns += delta_ns;
	if (delta_ns > hist->max_ns)
		hist->max_ns = delta_ns;
	return 0;
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(tp_btf_sched_wakeup, struct task_struct *p)
{
	return on_wakeup(p);
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(tp_btf_sched_wakeup_new, struct task_struct *p)
{
	return on_wakeup(p);
}

SEC("tp_btf/sched_switch")
int BPF_PROG(tp_btf_sched_switch, bool preempt, struct task_struct *prev,
	     struct task_struct *next, unsigned int prev_state)
{
	return on_switch(prev, next, prev_state);
}

SEC("raw_tp/sched_wakeup")
int BPF_PROG(raw_tp_sched_wakeup, struct task_struct *p)
{
	return on_wakeup(p);
}

SEC("raw_tp/sched_wakeup_new")
int BPF_PROG(raw_tp_sched_wakeup_new, struct task_struct *p)
{
	return on_wakeup(p);
}

SEC("raw_tp/sched_switch")
int BPF_PROG(raw_tp_sched_switch, bool preempt, struct task_struct *prev,
	     struct task_struct *next, unsigned int prev_state)
{
	return on_switch(prev, next, prev_state);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
