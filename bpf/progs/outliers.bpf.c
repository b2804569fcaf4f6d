// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* Probe 3: outliers.  Each CPU keeps its last QRT_OUTLIER_HISTORY hardirqs,
 * softirqs and task run segments.  When a dispatch thread is switched in more
 * than threshold_ns after its wakeup, one ring buffer event carries that
 * history, so the spike comes with what ran on the CPU just before (in the
 * spirit of rtla timerlat's auto-analysis). */
#include "qrt_bpf_common.bpf.h"
#include "outliers.h"

/* Set by the loader between open and load. */
const volatile __u64 threshold_ns = 100000;

QRT_DISPATCH_TID_MAP(256);

struct wakeup_info {
	__u64 wakeup_ns;
	__u32 waker_cpu;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, struct wakeup_info);
} wakeups SEC(".maps");

/* Per-CPU history ring and in-progress state (BPF private). */
struct cpu_history {
	__u64 head; /* next slot to write; total records ever written */
	__u64 irq_start_ns;
	__u64 timer_start_ns;
	__u64 softirq_start_ns;
	__u64 task_start_ns; /* when the current task was switched in */
	struct qrt_outlier_record records[QRT_OUTLIER_HISTORY];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cpu_history);
} histories SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, QRT_OUTLIER_RINGBUF_BYTES);
} events SEC(".maps");

/* Events lost because the ring buffer was full (per CPU). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} dropped_events SEC(".maps");

static __always_inline struct cpu_history *this_history(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&histories, &zero);
}

static __always_inline struct qrt_outlier_record *
push_record(struct cpu_history *h, __u32 kind, __u32 id, __u64 start_ns, __u64 end_ns)
{
	struct qrt_outlier_record *r;
	__u64 slot = h->head & (QRT_OUTLIER_HISTORY - 1);

	r = &h->records[slot];
	h->head++;
	r->kind = kind;
	r->id = id;
	r->start_ns = start_ns;
	r->duration_ns = end_ns - start_ns;
	r->name[0] = '\0';
	return r;
}

static __always_inline int on_irq_entry(void)
{
	struct cpu_history *h = this_history();

	if (h)
		h->irq_start_ns = bpf_ktime_get_ns();
	return 0;
}

static __always_inline int on_irq_exit(int irq, struct irqaction *action)
{
	struct cpu_history *h = this_history();
	struct qrt_outlier_record *r;

	if (!h || !h->irq_start_ns)
		return 0;
	r = push_record(h, QRT_OUTLIER_HARDIRQ, (__u32)irq, h->irq_start_ns, bpf_ktime_get_ns());
	bpf_probe_read_kernel_str(r->name, sizeof(r->name), BPF_CORE_READ(action, name));
	h->irq_start_ns = 0;
	return 0;
}

static __always_inline int on_timer_entry(void)
{
	struct cpu_history *h = this_history();

	if (h)
		h->timer_start_ns = bpf_ktime_get_ns();
	return 0;
}

static __always_inline int on_timer_exit(int vector)
{
	struct cpu_history *h = this_history();

	if (!h || !h->timer_start_ns)
		return 0;
	push_record(h, QRT_OUTLIER_LOCAL_TIMER, (__u32)vector, h->timer_start_ns, bpf_ktime_get_ns());
	h->timer_start_ns = 0;
	return 0;
}

static __always_inline int on_softirq_entry(void)
{
	struct cpu_history *h = this_history();

	if (h)
		h->softirq_start_ns = bpf_ktime_get_ns();
	return 0;
}

static __always_inline int on_softirq_exit(unsigned int vec)
{
	struct cpu_history *h = this_history();

	if (!h || !h->softirq_start_ns)
		return 0;
	push_record(h, QRT_OUTLIER_SOFTIRQ, vec, h->softirq_start_ns, bpf_ktime_get_ns());
	h->softirq_start_ns = 0;
	return 0;
}

static __always_inline int on_wakeup(struct task_struct *p)
{
	__u32 tid = BPF_CORE_READ(p, pid);
	struct wakeup_info info = {};

	if (!qrt_is_dispatch_tid(&dispatch_tids, tid))
		return 0;
	info.wakeup_ns = bpf_ktime_get_ns();
	info.waker_cpu = bpf_get_smp_processor_id();
	bpf_map_update_elem(&wakeups, &tid, &info, BPF_ANY);
	return 0;
}

static __always_inline void emit(struct cpu_history *h, struct task_struct *next, __u32 tid,
				 struct wakeup_info *info, __u64 now_ns)
{
	struct qrt_outlier_event *ev;
	__u32 zero = 0;
	__u64 *dropped;

	ev = bpf_ringbuf_reserve(&events, sizeof(*ev), 0);
	if (!ev) {
		dropped = bpf_map_lookup_elem(&dropped_events, &zero);
		if (dropped)
			(*dropped)++;
		return;
	}
	ev->wakeup_ns = info->wakeup_ns;
	ev->switch_ns = now_ns;
	ev->latency_ns = now_ns - info->wakeup_ns;
	ev->tid = tid;
	ev->cpu = bpf_get_smp_processor_id();
	ev->waker_cpu = info->waker_cpu;
	ev->record_count = h->head < QRT_OUTLIER_HISTORY ? (__u32)h->head : QRT_OUTLIER_HISTORY;
	BPF_CORE_READ_STR_INTO(&ev->comm, next, comm);
	/* The raw ring; slots with kind 0 are empty.  The loader orders the
	 * records by start_ns. */
	__builtin_memcpy(ev->records, h->records, sizeof(ev->records));
	bpf_ringbuf_submit(ev, 0);
}

static __always_inline int on_switch(struct task_struct *prev, struct task_struct *next,
				     unsigned int prev_state)
{
	__u32 prev_tid = BPF_CORE_READ(prev, pid);
	__u32 next_tid = BPF_CORE_READ(next, pid);
	struct cpu_history *h = this_history();
	struct qrt_outlier_record *r;
	struct wakeup_info *info, preempted = {};
	__u64 now_ns = bpf_ktime_get_ns();

	if (!h)
		return 0;
	/* prev's run segment ends now (the idle task is not a cause). */
	if (prev_tid != 0 && h->task_start_ns) {
		r = push_record(h, QRT_OUTLIER_TASK, prev_tid, h->task_start_ns, now_ns);
		BPF_CORE_READ_STR_INTO(&r->name, prev, comm);
	}
	h->task_start_ns = now_ns;

	/* A dispatch thread preempted while runnable waits again from now. */
	if (prev_state == QRT_TASK_RUNNING && qrt_is_dispatch_tid(&dispatch_tids, prev_tid)) {
		preempted.wakeup_ns = now_ns;
		preempted.waker_cpu = bpf_get_smp_processor_id();
		bpf_map_update_elem(&wakeups, &prev_tid, &preempted, BPF_ANY);
	}

	if (next_tid == 0)
		return 0;
	info = bpf_map_lookup_elem(&wakeups, &next_tid);
	if (!info)
		return 0;
	if (now_ns - info->wakeup_ns >= threshold_ns && now_ns > info->wakeup_ns)
		emit(h, next, next_tid, info, now_ns);
	bpf_map_delete_elem(&wakeups, &next_tid);
	return 0;
}

SEC("tp_btf/irq_handler_entry")
int BPF_PROG(tp_btf_irq_handler_entry, int irq, struct irqaction *action)
{
	return on_irq_entry();
}

SEC("tp_btf/irq_handler_exit")
int BPF_PROG(tp_btf_irq_handler_exit, int irq, struct irqaction *action, int ret)
{
	return on_irq_exit(irq, action);
}

SEC("tp_btf/local_timer_entry")
int BPF_PROG(tp_btf_local_timer_entry, int vector)
{
	return on_timer_entry();
}

SEC("tp_btf/local_timer_exit")
int BPF_PROG(tp_btf_local_timer_exit, int vector)
{
	return on_timer_exit(vector);
}

SEC("tp_btf/softirq_entry")
int BPF_PROG(tp_btf_softirq_entry, unsigned int vec)
{
	return on_softirq_entry();
}

SEC("tp_btf/softirq_exit")
int BPF_PROG(tp_btf_softirq_exit, unsigned int vec)
{
	return on_softirq_exit(vec);
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

SEC("raw_tp/irq_handler_entry")
int BPF_PROG(raw_tp_irq_handler_entry, int irq, struct irqaction *action)
{
	return on_irq_entry();
}

SEC("raw_tp/irq_handler_exit")
int BPF_PROG(raw_tp_irq_handler_exit, int irq, struct irqaction *action, int ret)
{
	return on_irq_exit(irq, action);
}

SEC("raw_tp/local_timer_entry")
int BPF_PROG(raw_tp_local_timer_entry, int vector)
{
	return on_timer_entry();
}

SEC("raw_tp/local_timer_exit")
int BPF_PROG(raw_tp_local_timer_exit, int vector)
{
	return on_timer_exit(vector);
}

SEC("raw_tp/softirq_entry")
int BPF_PROG(raw_tp_softirq_entry, unsigned int vec)
{
	return on_softirq_entry();
}

SEC("raw_tp/softirq_exit")
int BPF_PROG(raw_tp_softirq_exit, unsigned int vec)
{
	return on_softirq_exit(vec);
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
