// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* Probe 2: intrusions on the isolated CPUs.  On a CPU in isolated_mask it
 * accounts, per source, the count, total and max duration of
 *   - hardirqs        irq_handler_entry/exit      (key: IRQ number + name)
 *   - local timer     local_timer_entry/exit      (x86 LOC, key: vector)
 *   - softirqs        softirq_entry/exit          (key: vector)
 *   - foreign tasks   sched_switch                (key: TID + comm)
 * A foreign task is any task but the idle task and the dispatch threads. */
#include "qrt_bpf_common.bpf.h"
#include "intrusions.h"

/* The isolated CPUs, a bitmap set by the loader between open and load. */
const volatile __u64 isolated_mask[QRT_INTRUSION_MASK_WORDS] = {};

QRT_DISPATCH_TID_MAP(256);

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, QRT_INTRUSION_MAX_KEYS);
	__type(key, struct qrt_intrusion_key);
	__type(value, struct qrt_intrusion_value);
} intrusions SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct qrt_intrusion_stats);
} intrusion_stats SEC(".maps");

/* What is in progress on this CPU (BPF private). */
struct cpu_state {
	__u64 irq_start_ns;
	__u64 timer_start_ns;
	__u64 softirq_start_ns;
	__u64 task_start_ns;
	__u32 task_tid; /* 0: no foreign task running */
	__u32 softirq_vec;
	char task_comm[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cpu_state);
} cpu_states SEC(".maps");

_Static_assert((QRT_INTRUSION_MASK_WORDS & (QRT_INTRUSION_MASK_WORDS - 1)) == 0,
	       "the word index is masked, so the mask has a power-of-two length");

static __always_inline bool cpu_is_isolated(__u32 cpu)
{
	__u64 word, bit;

	if (cpu >= QRT_INTRUSION_MAX_CPUS)
		return false;
	/* The 6.1 verifier does not carry the bound just checked over to the
	 * copy clang indexes with (a 32-bit move gets no register id there:
	 * "R1 max value is outside of the allowed memory range"), and clang
	 * drops a mask it can prove redundant.  So the word index is masked
	 * after a barrier, in the register the access uses. */
	word = cpu / 64;
	bit = cpu % 64;
	barrier_var(word);
	word &= QRT_INTRUSION_MASK_WORDS - 1;
	return (isolated_mask[word] >> bit) & 1;
}

static __always_inline struct cpu_state *this_cpu_state(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&cpu_states, &zero);
}

static __always_inline void count_stat(bool map_full)
{
	struct qrt_intrusion_stats *stats;
	__u32 zero = 0;

	stats = bpf_map_lookup_elem(&intrusion_stats, &zero);
	if (!stats)
		return;
	if (map_full)
		stats->map_full++;
	else
		stats->unmatched_exit++;
}

/* Account one intrusion of duration_ns on key. */
static __always_inline void account(struct qrt_intrusion_key *key, __u64 duration_ns, __u64 now_ns)
{
	struct qrt_intrusion_value *val, init = {};

	val = bpf_map_lookup_elem(&intrusions, key);
	if (!val) {
		/* EEXIST from a racing insert is fine; E2BIG is not. */
		bpf_map_update_elem(&intrusions, key, &init, BPF_NOEXIST);
		val = bpf_map_lookup_elem(&intrusions, key);
		if (!val) {
			count_stat(true);
			return;
		}
	}
	/* Keys carry the CPU, so only this CPU writes this value; atomics
	 * anyway, since a hardirq can interrupt a softirq's update. */
	__sync_fetch_and_add(&val->count, 1);
	__sync_fetch_and_add(&val->total_ns, duration_ns);
	if (duration_ns > val->max_ns)
		val->max_ns = duration_ns;
	val->last_ns = now_ns;
}

static __always_inline void init_key(struct qrt_intrusion_key *key, __u32 kind, __u32 cpu, __u32 id)
{
	__builtin_memset(key, 0, sizeof(*key));
	key->kind = kind;
	key->cpu = cpu;
	key->id = id;
}

static __always_inline int on_irq_entry(void)
{
	__u32 cpu = bpf_get_smp_processor_id();
	struct cpu_state *st;

	if (!cpu_is_isolated(cpu))
		return 0;
	st = this_cpu_state();
	if (st)
		st->irq_start_ns = bpf_ktime_get_ns();
	return 0;
}

static __always_inline int on_irq_exit(int irq, struct irqaction *action)
{
	__u32 cpu = bpf_get_smp_processor_id();
	struct qrt_intrusion_key key;
	struct cpu_state *st;
	__u64 now_ns;

	if (!cpu_is_isolated(cpu))
		return 0;
	st = this_cpu_state();
	if (!st)
		return 0;
	if (!st->irq_start_ns) {
		count_stat(false);
		return 0;
	}
	now_ns = bpf_ktime_get_ns();
	init_key(&key, QRT_INTRUSION_HARDIRQ, cpu, (__u32)irq);
	bpf_probe_read_kernel_str(key.name, sizeof(key.name), BPF_CORE_READ(action, name));
	account(&key, now_ns - st->irq_start_ns, now_ns);
	st->irq_start_ns = 0;
	return 0;
}

static __always_inline int on_timer_entry(void)
{
	__u32 cpu = bpf_get_smp_processor_id();
	struct cpu_state *st;

	if (!cpu_is_isolated(cpu))
		return 0;
	st = this_cpu_state();
	if (st)
		st->timer_start_ns = bpf_ktime_get_ns();
	return 0;
}

static __always_inline int on_timer_exit(int vector)
{
	__u32 cpu = bpf_get_smp_processor_id();
	struct qrt_intrusion_key key;
	struct cpu_state *st;
	__u64 now_ns;

	if (!cpu_is_isolated(cpu))
		return 0;
	st = this_cpu_state();
	if (!st)
		return 0;
	if (!st->timer_start_ns) {
		count_stat(false);
		return 0;
	}
	now_ns = bpf_ktime_get_ns();
	init_key(&key, QRT_INTRUSION_LOCAL_TIMER, cpu, (__u32)vector);
	account(&key, now_ns - st->timer_start_ns, now_ns);
	st->timer_start_ns = 0;
	return 0;
}

static __always_inline int on_softirq_entry(unsigned int vec)
{
	__u32 cpu = bpf_get_smp_processor_id();
	struct cpu_state *st;

	if (!cpu_is_isolated(cpu))
		return 0;
	st = this_cpu_state();
	if (st) {
		st->softirq_start_ns = bpf_ktime_get_ns();
		st->softirq_vec = vec;
	}
	return 0;
}

static __always_inline int on_softirq_exit(unsigned int vec)
{
	__u32 cpu = bpf_get_smp_processor_id();
	struct qrt_intrusion_key key;
	struct cpu_state *st;
	__u64 now_ns;

	if (!cpu_is_isolated(cpu))
		return 0;
	st = this_cpu_state();
	if (!st)
		return 0;
	if (!st->softirq_start_ns || st->softirq_vec != vec) {
		count_stat(false);
		st->softirq_start_ns = 0;
		return 0;
	}
	now_ns = bpf_ktime_get_ns();
	init_key(&key, QRT_INTRUSION_SOFTIRQ, cpu, vec);
	account(&key, now_ns - st->softirq_start_ns, now_ns);
	st->softirq_start_ns = 0;
	return 0;
}

static __always_inline int on_switch(struct task_struct *prev, struct task_struct *next)
{
	__u32 cpu = bpf_get_smp_processor_id();
	__u32 next_tid = BPF_CORE_READ(next, pid);
	struct qrt_intrusion_key key;
	struct cpu_state *st;
	__u64 now_ns;

	if (!cpu_is_isolated(cpu))
		return 0;
	st = this_cpu_state();
	if (!st)
		return 0;
	now_ns = bpf_ktime_get_ns();

	/* The foreign task that was running (prev) leaves the CPU. */
	if (st->task_tid) {
		init_key(&key, QRT_INTRUSION_TASK, cpu, st->task_tid);
		__builtin_memcpy(key.name, st->task_comm, sizeof(st->task_comm));
		account(&key, now_ns - st->task_start_ns, now_ns);
		st->task_tid = 0;
	}

	if (next_tid == 0 || qrt_is_dispatch_tid(&dispatch_tids, next_tid))
		return 0;
	st->task_tid = next_tid;
	st->task_start_ns = now_ns;
	/* Zero first: the comm is part of the key, bytes after its NUL too. */
	__builtin_memset(st->task_comm, 0, sizeof(st->task_comm));
	BPF_CORE_READ_STR_INTO(&st->task_comm, next, comm);
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
	return on_softirq_entry(vec);
}

SEC("tp_btf/softirq_exit")
int BPF_PROG(tp_btf_softirq_exit, unsigned int vec)
{
	return on_softirq_exit(vec);
}

SEC("tp_btf/sched_switch")
int BPF_PROG(tp_btf_sched_switch, bool preempt, struct task_struct *prev,
	     struct task_struct *next, unsigned int prev_state)
{
	return on_switch(prev, next);
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
	return on_softirq_entry(vec);
}

SEC("raw_tp/softirq_exit")
int BPF_PROG(raw_tp_softirq_exit, unsigned int vec)
{
	return on_softirq_exit(vec);
}

SEC("raw_tp/sched_switch")
int BPF_PROG(raw_tp_sched_switch, bool preempt, struct task_struct *prev,
	     struct task_struct *next, unsigned int prev_state)
{
	return on_switch(prev, next);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
