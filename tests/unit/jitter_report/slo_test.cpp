#include <gtest/gtest.h>

#include "jitter_report/slo.hpp"
#include "sample_report.hpp"

using namespace qrt::jitter;

TEST(slo_parse, reads_targets_in_order_with_units) {
    auto s = parse_slo("p99=10us,max=100us,p50=2.5us,p99.9=1ms,stddev=800ns,mean=3 us");
    ASSERT_TRUE(s) << s.err().message;
    ASSERT_EQ(s->targets.size(), 6U);
    EXPECT_EQ(s->targets[0], (slo_target{"p99", 10'000}));
    EXPECT_EQ(s->targets[1], (slo_target{"max", 100'000}));
    EXPECT_EQ(s->targets[2], (slo_target{"p50", 2'500}));
    EXPECT_EQ(s->targets[3], (slo_target{"p99.9", 1'000'000}));
    EXPECT_EQ(s->targets[4], (slo_target{"stddev", 800}));
    EXPECT_EQ(s->targets[5], (slo_target{"mean", 3'000}));
    EXPECT_EQ(s->to_string(), "p99=10us,max=100us,p50=2500ns,p99.9=1ms,stddev=800ns,mean=3us");
}

TEST(slo_parse, accepts_p999_and_micro_sign_spellings) {
    auto s = parse_slo(" p999 = 20\xc2\xb5s ");
    ASSERT_TRUE(s) << s.err().message;
    EXPECT_EQ(s->targets.at(0), (slo_target{"p99.9", 20'000}));
}

TEST(slo_parse, rejects_each_malformed_term_naming_it) {
    struct bad {
        const char* text;
        const char* says;
    };
    for (const bad& b : {bad{"", "empty"}, bad{"p99", "expected <stat>=<limit>"},
                         bad{"p98=10us", "unknown statistic 'p98'"}, bad{"p99=10", "missing unit"},
                         bad{"p99=10furlongs", "unknown unit 'furlongs'"},
                         bad{"p99=ten us", "expected a number"}, bad{"p99=0us", "greater than 0"},
                         bad{"p99=10us,p99=20us", "given twice"}, bad{"p99=10us,", "empty term"},
                         bad{"p99=1.us", "no digit after '.'"}, bad{"max=2m", "unknown unit 'm'"}}) {
        auto s = parse_slo(b.text);
        ASSERT_FALSE(s) << "'" << b.text << "' was accepted";
        EXPECT_NE(s.err().message.find(b.says), std::string::npos)
            << "'" << b.text << "' -> " << s.err().message << " (expected: " << b.says << ")";
    }
}

TEST(slo_parse, duration_allows_minutes_only_when_asked) {
    EXPECT_EQ(parse_duration_ns("2m", true).value_or(0), 120'000'000'000);
    EXPECT_EQ(parse_duration_ns("1min", true).value_or(0), 60'000'000'000);
    EXPECT_FALSE(parse_duration_ns("2m", false));
    EXPECT_EQ(parse_duration_ns("1.5ms").value_or(0), 1'500'000);
    EXPECT_FALSE(parse_duration_ns("99999999999999999999s"));
}

TEST(slo_format, values_fit_seven_columns) {
    for (double v : {0.0, 999.0, 1'000.0, 9'994.0, 99'940.0, 999'400.0, 999'600.0, 12'345'678.0,
                     999'999'999.0, 12e9, 999e9}) {
        EXPECT_LE(format_ns(v).size(), 7U) << v << " -> " << format_ns(v);
    }
    EXPECT_EQ(format_ns(4'210.0), "4.21us");
    EXPECT_EQ(format_ns(12'100.0), "12.1us");
    EXPECT_EQ(format_ns(1'230'000.0), "1.23ms");
}

TEST(slo_check, is_met_only_when_every_primary_series_meets_every_target) {
    const auto r = jitter_test::sample_report();
    const auto& cpu1 = r.series_list[0].stats;
    const auto& cpu3 = r.series_list[1].stats;
    // Between the two CPUs' p50: cpu1 meets it, cpu3 does not.
    const std::int64_t limit = (cpu1.p50_ns + cpu3.p50_ns) / 2;
    auto spec = parse_slo("p50=" + std::to_string(limit) + "ns");
    ASSERT_TRUE(spec);
    auto v = check_slo(*spec, r);
    ASSERT_TRUE(v) << v.err().message;
    EXPECT_FALSE(v->met);
    ASSERT_EQ(v->checks.size(), 2U);  // the probe series is not primary
    EXPECT_TRUE(v->checks[0].met);
    EXPECT_EQ(v->checks[0].series, "cpu1");
    EXPECT_FALSE(v->checks[1].met);
    EXPECT_EQ(v->checks[1].measured_ns, static_cast<double>(cpu3.p50_ns));

    auto loose = check_slo(*parse_slo("max=1s"), r);
    ASSERT_TRUE(loose);
    EXPECT_TRUE(loose->met);
}

TEST(slo_check, without_samples_is_an_error_not_a_pass) {
    auto r = jitter_test::sample_report();
    r.series_list.erase(r.series_list.begin(), r.series_list.begin() + 2);
    auto v = check_slo(*parse_slo("p99=10us"), r);
    ASSERT_FALSE(v);
    EXPECT_NE(v.err().message.find("nothing to check"), std::string::npos) << v.err().message;
}
