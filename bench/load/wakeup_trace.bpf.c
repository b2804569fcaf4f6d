// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* qrt-wakeup-trace: who wakes whom across CPUs, and what it costs the waker.
 * Counts, per (CPU, task), the cross-CPU wake-ups it issues (sched_waking),
 * the IPIs it sends (ipi_send_cpu/cpumask), the wake-ups that needed no IPI
 * because the target CPU was polling (sched_wake_idle_without_ipi) and, where
 * the kernel has BPF trampolines, the time spent in try_to_wake_up.  Per CPU
 * it counts the IPIs received and the NET_RX softirq time.  A bench tool for
 * bench/README.md "load": not part of the daemon. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "wakeup_trace.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct qrt_wt_key);
	__type(value, struct qrt_wt_sender);
} senders SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, QRT_WT_MAX_CPUS);
	__type(key, __u32);
	__type(value, struct qrt_wt_receiver);
} receivers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} start_ns SEC(".maps"); /* [0] ttwu entry, [1] NET_RX entry */

static __always_inline struct qrt_wt_sender *sender(void)
{
	struct qrt_wt_key k = {};
	struct qrt_wt_sender zero = {};
	struct qrt_wt_sender *s;

	k.cpu = bpf_get_smp_processor_id();
	bpf_get_current_comm(k.comm, sizeof(k.comm));
	s = bpf_map_lookup_elem(&senders, &k);
	if (s)
		return s;
	bpf_map_update_elem(&senders, &k, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&senders, &k);
}

static __always_inline struct qrt_wt_receiver *receiver(void)
{
	__u32 cpu = bpf_get_smp_processor_id();

	return bpf_map_lookup_elem(&receivers, &cpu);
}

SEC("tp_btf/sched_waking")
int BPF_PROG(wt_waking, struct task_struct *p)
{
	struct qrt_wt_sender *s = sender();
	__u32 target = BPF_CORE_READ(p, thread_info.cpu);

	if (!s)
		return 0;
	if (target != bpf_get_smp_processor_id())
		__sync_fetch_and_add(&s->waking_remote, 1);
	else
		__sync_fetch_and_add(&s->waking_local, 1);
	return 0;
}

SEC("tp_btf/sched_wake_idle_without_ipi")
int BPF_PROG(wt_wake_idle, int cpu)
{
	struct qrt_wt_sender *s = sender();

	if (s)
		__sync_fetch_and_add(&s->wake_idle_no_ipi, 1);
	return 0;
}

SEC("tp_btf/ipi_send_cpu")
int BPF_PROG(wt_ipi_cpu, unsigned int cpu, unsigned long callsite, void *callback)
{
	struct qrt_wt_sender *s = sender();

	if (s)
		__sync_fetch_and_add(&s->ipi_sent, 1);
	return 0;
}

SEC("tp_btf/ipi_send_cpumask")
int BPF_PROG(wt_ipi_mask, const struct cpumask *mask, unsigned long callsite, void *callback)
{
	struct qrt_wt_sender *s = sender();

	if (s)
		__sync_fetch_and_add(&s->ipi_sent, 1);
	return 0;
}

SEC("tp_btf/reschedule_entry")
int BPF_PROG(wt_resched, int vector)
{
	struct qrt_wt_receiver *r = receiver();

	if (r)
		__sync_fetch_and_add(&r->resched_ipi, 1);
	return 0;
}

SEC("tp_btf/call_function_single_entry")
int BPF_PROG(wt_cfs, int vector)
{
	struct qrt_wt_receiver *r = receiver();

	if (r)
		__sync_fetch_and_add(&r->call_function_ipi, 1);
	return 0;
}

SEC("tp_btf/call_function_entry")
int BPF_PROG(wt_cf, int vector)
{
	struct qrt_wt_receiver *r = receiver();

	if (r)
		__sync_fetch_and_add(&r->call_function_ipi, 1);
	return 0;
}

SEC("tp_btf/softirq_entry")
int BPF_PROG(wt_softirq_in, unsigned int vec)
{
	__u32 k = 1;
	__u64 *t;

	if (vec != 3 /* NET_RX_SOFTIRQ */)
		return 0;
	t = bpf_map_lookup_elem(&start_ns, &k);
	if (t)
		*t = bpf_ktime_get_ns();
	return 0;
}

SEC("tp_btf/softirq_exit")
int BPF_PROG(wt_softirq_out, unsigned int vec)
{
	__u32 k = 1;
	__u64 *t;
	struct qrt_wt_receiver *r;

	if (vec != 3)
		return 0;
	t = bpf_map_lookup_elem(&start_ns, &k);
	r = receiver();
	if (!t || !r || *t == 0)
		return 0;
	__sync_fetch_and_add(&r->net_rx, 1);
	__sync_fetch_and_add(&r->net_rx_ns, bpf_ktime_get_ns() - *t);
	*t = 0;
	return 0;
}

/* Optional (the loader drops them where the kernel has no trampolines). */
SEC("fentry/try_to_wake_up")
int BPF_PROG(wt_ttwu_in)
{
	__u32 k = 0;
	__u64 *t = bpf_map_lookup_elem(&start_ns, &k);

	if (t)
		*t = bpf_ktime_get_ns();
	return 0;
}

SEC("fexit/try_to_wake_up")
int BPF_PROG(wt_ttwu_out)
{
	__u32 k = 0;
	__u64 *t = bpf_map_lookup_elem(&start_ns, &k);
	struct qrt_wt_sender *s;
	__u64 d;

	if (!t || *t == 0)
		return 0;
	d = bpf_ktime_get_ns() - *t;
	*t = 0;
	s = sender();
	if (!s)
		return 0;
	__sync_fetch_and_add(&s->ttwu_count, 1);
	__sync_fetch_and_add(&s->ttwu_total_ns, d);
	if (d > s->ttwu_max_ns)
		s->ttwu_max_ns = d;
	if (d >= 2000)
		__sync_fetch_and_add(&s->ttwu_ge_2us, 1);
	return 0;
}
