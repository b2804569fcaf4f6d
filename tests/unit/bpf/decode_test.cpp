#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "decode.hpp"
#include "qrt_bpf/intrusion.hpp"
#include "qrt_bpf/outlier.hpp"

using namespace qrt_bpf;

namespace {

qrt_intrusion_key make_key(__u32 kind, __u32 cpu, __u32 id, const char* name) {
    qrt_intrusion_key k{};
    k.kind = kind;
    k.cpu = cpu;
    k.id = id;
    std::strncpy(k.name, name, sizeof(k.name) - 1);
    return k;
}

qrt_outlier_record make_record(__u32 kind, __u32 id, const char* name, __u64 start_ns,
                               __u64 duration_ns) {
    qrt_outlier_record r{};
    r.kind = kind;
    r.id = id;
    r.start_ns = start_ns;
    r.duration_ns = duration_ns;
    std::strncpy(r.name, name, sizeof(r.name) - 1);
    return r;
}

}  // namespace

TEST(intrusion_decode, names_each_kind_of_source) {
    qrt_intrusion_value v{3, 3000, 1500, 99};
    const intrusion irq = detail::decode_intrusion(make_key(QRT_INTRUSION_HARDIRQ, 1, 36, "virtio1-req.0"), v);
    EXPECT_EQ(irq.kind, intrusion_kind::hardirq);
    EXPECT_EQ(irq.cpu, 1U);
    EXPECT_EQ(irq.count, 3U);
    EXPECT_EQ(irq.total_ns, 3000U);
    EXPECT_EQ(irq.max_ns, 1500U);
    EXPECT_EQ(irq.last_ns, 99U);
    EXPECT_EQ(irq.source(), "irq 36 (virtio1-req.0)");
    EXPECT_EQ(detail::decode_intrusion(make_key(QRT_INTRUSION_SOFTIRQ, 1, 3, ""), v).source(),
              "softirq NET_RX");
    EXPECT_EQ(detail::decode_intrusion(make_key(QRT_INTRUSION_TASK, 1, 4242, "stress-ng"), v).source(),
              "task stress-ng/4242");
    EXPECT_EQ(detail::decode_intrusion(make_key(QRT_INTRUSION_LOCAL_TIMER, 1, 236, ""), v).source(),
              "irq LOC (local timer)");
}

TEST(intrusion_decode, name_without_terminator_is_bounded) {
    qrt_intrusion_key k = make_key(QRT_INTRUSION_TASK, 0, 1, "");
    std::memset(k.name, 'x', sizeof(k.name));
    const intrusion i = detail::decode_intrusion(k, qrt_intrusion_value{});
    EXPECT_EQ(i.name.size(), sizeof(k.name));
}

TEST(intrusion_report, softirq_vector_names_follow_the_kernel) {
    EXPECT_EQ(softirq_name(0), "HI");
    EXPECT_EQ(softirq_name(1), "TIMER");
    EXPECT_EQ(softirq_name(3), "NET_RX");
    EXPECT_EQ(softirq_name(9), "RCU");
    EXPECT_EQ(softirq_name(10), "?");
}

TEST(intrusion_report, sort_puts_largest_total_first_and_merge_sums_cpus) {
    std::vector<intrusion> list;
    list.push_back({intrusion_kind::softirq, 1, 1, "", 10, 100, 20, 0});
    list.push_back({intrusion_kind::task, 1, 7, "kworker", 1, 900, 900, 0});
    list.push_back({intrusion_kind::softirq, 2, 1, "", 5, 50, 30, 0});
    sort_by_total(list);
    EXPECT_EQ(list[0].kind, intrusion_kind::task);
    EXPECT_EQ(list[2].cpu, 2U);
    const std::vector<intrusion> merged = merge_cpus(list);
    ASSERT_EQ(merged.size(), 2U);
    EXPECT_EQ(merged[1].kind, intrusion_kind::softirq);
    EXPECT_EQ(merged[1].count, 15U);
    EXPECT_EQ(merged[1].total_ns, 150U);
    EXPECT_EQ(merged[1].max_ns, 30U);
}

TEST(outlier_decode, orders_history_and_measures_overlap_with_the_latency_window) {
    qrt_outlier_event ev{};
    ev.wakeup_ns = 1000;
    ev.switch_ns = 2000;
    ev.latency_ns = 1000;
    ev.tid = 77;
    ev.cpu = 1;
    ev.waker_cpu = 0;
    std::strcpy(ev.comm, "qrt-dispatch");
    // The raw ring is in slot order, not time order; slot 3 is empty.
    ev.records[0] = make_record(QRT_OUTLIER_TASK, 555, "hog", 900, 1100);       // 900..2000
    ev.records[1] = make_record(QRT_OUTLIER_HARDIRQ, 36, "virtio1-req.0", 1200, 50);
    ev.records[2] = make_record(QRT_OUTLIER_SOFTIRQ, 1, "", 100, 200);          // before
    const outlier o = detail::decode_outlier(ev);
    EXPECT_EQ(o.tid, 77U);
    EXPECT_EQ(o.comm, "qrt-dispatch");
    ASSERT_EQ(o.causes.size(), 3U);
    EXPECT_EQ(o.causes[0].kind, intrusion_kind::softirq);
    EXPECT_EQ(o.causes[0].overlap_ns, 0U);
    EXPECT_EQ(o.causes[1].source(), "task hog/555");
    EXPECT_EQ(o.causes[1].overlap_ns, 1000U);
    EXPECT_EQ(o.causes[2].overlap_ns, 50U);
    const auto main = o.main_cause();
    ASSERT_TRUE(main.has_value());
    EXPECT_EQ(main->id, 555U);
    const std::string s = o.summary();
    EXPECT_NE(s.find("tid 77 (qrt-dispatch) on cpu 1: 1.0 us after wakeup"), std::string::npos) << s;
    EXPECT_NE(s.find("task hog/555 1.0 us"), std::string::npos) << s;
    EXPECT_NE(s.find("irq 36 (virtio1-req.0) 0.1 us"), std::string::npos) << s;
    EXPECT_EQ(s.find("softirq TIMER"), std::string::npos) << s;
}

TEST(outlier_decode, an_event_with_nothing_in_the_window_says_so) {
    qrt_outlier_event ev{};
    ev.wakeup_ns = 1000;
    ev.switch_ns = 5000;
    ev.latency_ns = 4000;
    const outlier o = detail::decode_outlier(ev);
    EXPECT_TRUE(o.causes.empty());
    EXPECT_FALSE(o.main_cause().has_value());
    EXPECT_NE(o.summary().find("nothing recorded ran in the window"), std::string::npos);
}

// Every new thread used to add a metric series (source "task kworker/1:7/10836")
// forever: tasks are keyed by command name, and per CPU the series are capped.
TEST(intrusion_report, metric_series_drop_the_tid_and_are_capped_per_cpu_with_the_rest_as_other) {
    std::vector<intrusion> list;
    for (std::uint32_t tid = 100; tid < 1100; ++tid) {
        intrusion i;
        i.kind = intrusion_kind::task;
        i.cpu = 3;
        i.id = tid;
        i.name = tid < 600 ? "kworker/3:1" : "thread-" + std::to_string(tid);
        i.count = 1;
        i.total_ns = 10;
        i.max_ns = tid;
        list.push_back(i);
    }
    intrusion irq;
    irq.kind = intrusion_kind::hardirq;
    irq.cpu = 3;
    irq.id = 36;
    irq.name = "eth0";
    irq.count = 2;
    irq.total_ns = 1'000'000;
    irq.max_ns = 600'000;
    list.push_back(irq);

    const auto rows = aggregate_for_metrics(list, 4);
    ASSERT_LE(rows.size(), 4u + 2u) << "4 own series, plus one 'other' per kind at most";
    ASSERT_FALSE(rows.empty());
    EXPECT_EQ(rows.front().source, "irq 36 (eth0)");
    std::uint64_t count = 0;
    std::uint64_t total = 0;
    bool kworker = false;
    bool other = false;
    for (const auto& r : rows) {
        EXPECT_EQ(r.source.find("/1"), std::string::npos) << "a TID in " << r.source;
        count += r.count;
        total += r.total_ns;
        if (r.source == "task kworker/3:1") {
            kworker = true;
            EXPECT_EQ(r.count, 500u);
            EXPECT_EQ(r.max_ns, 599u);
        }
        other = other || r.source == "other";
    }
    EXPECT_TRUE(kworker);
    EXPECT_TRUE(other);
    EXPECT_EQ(count, 1000u + 2u) << "nothing is lost by aggregating";
    EXPECT_EQ(total, 1000u * 10u + 1'000'000u);
}

// The ring buffer callback's decoder: a short record (an older or broken BPF
// side) is dropped without reading past it; a full one decodes wherever it
// sits in memory; a longer one (a newer BPF side) decodes its known prefix.
TEST(outlier_decode, ring_records_are_size_checked_and_alignment_free) {
    qrt_outlier_event ev{};
    ev.wakeup_ns = 1000;
    ev.switch_ns = 2000;
    ev.tid = 9;
    ev.records[0] = make_record(QRT_OUTLIER_TASK, 555, "hog", 900, 1100);
    std::vector<unsigned char> buf(sizeof(ev) + 64 + 1, 0xAB);
    std::memcpy(buf.data() + 1, &ev, sizeof(ev));  // deliberately misaligned
    EXPECT_FALSE(detail::decode_outlier_record(buf.data() + 1, sizeof(ev) - 1).has_value());
    EXPECT_FALSE(detail::decode_outlier_record(nullptr, sizeof(ev)).has_value());
    for (const std::size_t size : {sizeof(ev), sizeof(ev) + 64}) {
        const auto o = detail::decode_outlier_record(buf.data() + 1, size);
        ASSERT_TRUE(o.has_value()) << size;
        EXPECT_EQ(o->tid, 9U);
        ASSERT_EQ(o->causes.size(), 1U);
        EXPECT_EQ(o->causes[0].overlap_ns, 1000U);
    }
}
