/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* Probe 1, dispatch wakeup latency: layout shared by wakeup.bpf.c and the
 * C++ loader (bpf/src/wakeup_probe.cpp static_asserts it).  Includes nothing:
 * the BPF side gets __u32/__u64 from vmlinux.h, the C++ side from
 * <linux/types.h>.
 *
 * Histogram: log2 buckets with QRT_WAKEUP_SUBS linear sub-buckets each
 * (HdrHistogram-like, relative error <= 1/QRT_WAKEUP_SUBS).
 *   v < SUBS:        bucket v (exact, 0..7 ns)
 *   2^p <= v < 2^p+1: bucket (p - SUB_BITS + 1) * SUBS + ((v >> (p - SUB_BITS)) & (SUBS - 1))
 * Values >= 2^QRT_WAKEUP_MAX_POW ns (~68.7 s) land in the last bucket. */
#ifndef QRT_BPF_WAKEUP_H
#define QRT_BPF_WAKEUP_H

#define QRT_WAKEUP_SUB_BITS 3
#define QRT_WAKEUP_SUBS 8
#define QRT_WAKEUP_MAX_POW 36
#define QRT_WAKEUP_BUCKETS ((QRT_WAKEUP_MAX_POW - QRT_WAKEUP_SUB_BITS + 1) * QRT_WAKEUP_SUBS)
#define QRT_MAX_DISPATCH_TIDS 256

struct qrt_wakeup_hist {
	__u64 bucket_count[QRT_WAKEUP_BUCKETS];
	__u64 count;
	__u64 sum_ns;
	__u64 max_ns;
};

/* floor(log2(v)) for v > 0, 0 for v == 0; branchy but verifier friendly. */
static inline __u32 qrt_log2_u64(__u64 v)
{
	__u32 r = 0;

	if (v >> 32) { v >>= 32; r += 32; }
	if (v >> 16) { v >>= 16; r += 16; }
	if (v >> 8) { v >>= 8; r += 8; }
	if (v >> 4) { v >>= 4; r += 4; }
	if (v >> 2) { v >>= 2; r += 2; }
	if (v >> 1) { r += 1; }
	return r;
}

static inline __u32 qrt_wakeup_bucket(__u64 v_ns)
{
	__u32 p, sub;

	if (v_ns < QRT_WAKEUP_SUBS)
		return (__u32)v_ns;
	p = qrt_log2_u64(v_ns);
	if (p >= QRT_WAKEUP_MAX_POW)
		return QRT_WAKEUP_BUCKETS - 1;
	sub = (__u32)((v_ns >> (p - QRT_WAKEUP_SUB_BITS)) & (QRT_WAKEUP_SUBS - 1));
	return (p - QRT_WAKEUP_SUB_BITS + 1) * QRT_WAKEUP_SUBS + sub;
}

#endif /* QRT_BPF_WAKEUP_H */
