#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "qrt/dispatch/job.hpp"
#include "qrt/proto/wire_codec.hpp"

extern "C" size_t qrt_wire_c_header_size(void);
extern "C" size_t qrt_wire_c_tolerance_offset(void);

namespace wire = qrt::wire;

namespace {

wire::header sample_job() {
    wire::header h = wire::make_header(wire::frame_type::job);
    h.flags = QRT_WIRE_FLAG_NO_RESULT_DATA;
    h.job_id = 0x0102030405060708ULL;
    h.calibration_id = 42;
    h.scheduled_ns = 1'767'225'600'000'000'123;
    h.sent_ns = -5;
    h.window_start_ns = 1'767'225'600'000'000'000;
    h.window_end_ns = 1'767'225'601'000'000'000;
    h.duration_ns = 250'000;
    h.arrival_ns = 7;
    h.shots = 1000;
    h.tolerance_ns = 50'000;
    return h;
}

std::vector<std::uint8_t> encoded(const wire::header& h) {
    std::vector<std::uint8_t> b(wire::header_len);
    wire::encode_header(h, b.data());
    return b;
}

}  // namespace

TEST(wire, c_and_cpp_agree_on_the_layout) {
    EXPECT_EQ(qrt_wire_c_header_size(), sizeof(wire::header));
    EXPECT_EQ(qrt_wire_c_tolerance_offset(), offsetof(wire::header, tolerance_ns));
}

TEST(wire, header_round_trips_every_field) {
    const wire::header h = sample_job();
    const auto b = encoded(h);
    const wire::decoded d = wire::decode_header(b);
    ASSERT_EQ(d.status, wire::decode_status::ok) << wire::to_string(d.status);
    EXPECT_EQ(std::memcmp(&d.hdr, &h, sizeof(h)), 0);
}

TEST(wire, encoding_is_little_endian_on_the_wire) {
    const auto b = encoded(sample_job());
    EXPECT_EQ(b[0], 'Q');
    EXPECT_EQ(b[1], 'R');
    EXPECT_EQ(b[2], 'T');
    EXPECT_EQ(b[3], 'W');
    EXPECT_EQ(b[offsetof(wire::header, job_id)], 0x08);
    EXPECT_EQ(b[offsetof(wire::header, job_id) + 7], 0x01);
    EXPECT_EQ(b[offsetof(wire::header, sent_ns) + 7], 0xff);  // -5
}

TEST(wire, patch_sent_ns_changes_only_sent_ns) {
    wire::header h = sample_job();
    auto b = encoded(h);
    wire::patch_sent_ns(b.data(), 123456789);
    h.sent_ns = 123456789;
    const wire::decoded d = wire::decode_header(b);
    ASSERT_EQ(d.status, wire::decode_status::ok);
    EXPECT_EQ(std::memcmp(&d.hdr, &h, sizeof(h)), 0);
}

TEST(wire, short_input_needs_more_but_bad_magic_is_reported_early) {
    const auto b = encoded(sample_job());
    for (std::size_t n = 0; n < wire::header_len; ++n) {
        EXPECT_EQ(wire::decode_header({b.data(), n}).status, wire::decode_status::need_more) << n;
    }
    const std::uint8_t junk[5] = {'G', 'E', 'T', ' ', '/'};
    EXPECT_EQ(wire::decode_header(junk).status, wire::decode_status::bad_magic);
}

struct malformed_case {
    const char* name;
    void (*mutate)(wire::header&);
    wire::decode_status expected;
};

class wire_malformed : public ::testing::TestWithParam<malformed_case> {};

TEST_P(wire_malformed, is_rejected_with_its_reason) {
    wire::header h = sample_job();
    GetParam().mutate(h);
    const auto b = encoded(h);
    EXPECT_EQ(wire::decode_header(b).status, GetParam().expected)
        << GetParam().name << ": got " << wire::to_string(wire::decode_header(b).status);
}

INSTANTIATE_TEST_SUITE_P(
    every_field, wire_malformed,
    ::testing::Values(
        malformed_case{"magic", [](wire::header& h) { h.magic = 0x12345678; }, wire::decode_status::bad_magic},
        malformed_case{"version0", [](wire::header& h) { h.version = 0; }, wire::decode_status::bad_version},
        malformed_case{"version3", [](wire::header& h) { h.version = 3; }, wire::decode_status::bad_version},
        malformed_case{"version2_with_v1_header_len", [](wire::header& h) { h.version = 2; },
                       wire::decode_status::bad_header_len},
        malformed_case{"header_len_short", [](wire::header& h) { h.header_len = 64; },
                       wire::decode_status::bad_header_len},
        malformed_case{"header_len_long", [](wire::header& h) { h.header_len = 128; },
                       wire::decode_status::bad_header_len},
        malformed_case{"type0", [](wire::header& h) { h.type = 0; }, wire::decode_status::bad_type},
        malformed_case{"arm_in_version1", [](wire::header& h) { h.type = QRT_WIRE_ARM; },
                       wire::decode_status::bad_type},
        malformed_case{"fire_in_version1", [](wire::header& h) { h.type = QRT_WIRE_FIRE; },
                       wire::decode_status::bad_type},
        malformed_case{"type10", [](wire::header& h) { h.type = 10; }, wire::decode_status::bad_type},
        malformed_case{"v2_status_in_version1",
                       [](wire::header& h) {
                           h.type = QRT_WIRE_ERROR;
                           h.status = QRT_WIRE_ERR_PROGRAM_REFUSED;
                       },
                       wire::decode_status::bad_status},
        malformed_case{"type255", [](wire::header& h) { h.type = 255; }, wire::decode_status::bad_type},
        malformed_case{"unknown_flag", [](wire::header& h) { h.flags = 0x80; }, wire::decode_status::bad_flags},
        malformed_case{"status_on_job", [](wire::header& h) { h.status = QRT_WIRE_ERR_BUSY; },
                       wire::decode_status::bad_status},
        malformed_case{"error_without_status",
                       [](wire::header& h) {
                           h.type = QRT_WIRE_ERROR;
                           h.status = 0;
                       },
                       wire::decode_status::bad_status},
        malformed_case{"error_unknown_status",
                       [](wire::header& h) {
                           h.type = QRT_WIRE_ERROR;
                           h.status = 99;
                       },
                       wire::decode_status::bad_status},
        malformed_case{"reserved", [](wire::header& h) { h.reserved = 1; }, wire::decode_status::bad_reserved},
        malformed_case{"payload_too_large", [](wire::header& h) { h.payload_len = QRT_WIRE_MAX_PAYLOAD + 1; },
                       wire::decode_status::payload_too_large},
        malformed_case{"payload_huge", [](wire::header& h) { h.payload_len = 0xffffffffu; },
                       wire::decode_status::payload_too_large},
        malformed_case{"hello_payload_too_large",
                       [](wire::header& h) {
                           h.type = QRT_WIRE_HELLO;
                           h.payload_len = QRT_WIRE_V1_MAX_HELLO_PAYLOAD + 1;
                       },
                       wire::decode_status::payload_too_large}),
    [](const ::testing::TestParamInfo<malformed_case>& i) { return std::string(i.param.name); });

TEST(wire, error_frame_with_a_known_status_is_accepted) {
    wire::header h = wire::make_header(wire::frame_type::error);
    h.status = QRT_WIRE_ERR_OUT_OF_WINDOW;
    EXPECT_EQ(wire::decode_header(encoded(h)).status, wire::decode_status::ok);
}

TEST(frame_reader, reassembles_frames_fed_one_byte_at_a_time) {
    std::vector<std::uint8_t> stream;
    for (std::uint64_t id = 1; id <= 3; ++id) {
        wire::header h = sample_job();
        h.job_id = id;
        const auto f = wire::encode_frame(h, std::string(static_cast<std::size_t>(id * 10), 'x'));
        stream.insert(stream.end(), f.begin(), f.end());
    }
    wire::frame_reader r;
    std::vector<wire::frame> got;
    for (std::uint8_t byte : stream) {
        r.feed({&byte, 1});
        while (auto f = r.next()) {
            got.push_back(std::move(*f));
        }
    }
    ASSERT_EQ(got.size(), 3u);
    EXPECT_EQ(r.error(), wire::decode_status::ok);
    EXPECT_EQ(r.buffered(), 0u);
    for (std::size_t i = 0; i < 3; ++i) {
        EXPECT_EQ(got[i].hdr.job_id, i + 1);
        EXPECT_EQ(got[i].payload.size(), (i + 1) * 10);
        EXPECT_EQ(got[i].hdr.payload_len, (i + 1) * 10);
    }
}

TEST(frame_reader, garbage_after_a_good_frame_is_a_sticky_error) {
    auto f = wire::encode_frame(sample_job(), std::string("abc"));
    const std::uint8_t junk[8] = {'j', 'u', 'n', 'k', 0, 0, 0, 0};
    f.insert(f.end(), std::begin(junk), std::end(junk));
    wire::frame_reader r;
    r.feed(f);
    auto first = r.next();
    ASSERT_TRUE(first.has_value());
    EXPECT_EQ(first->payload_text(), "abc");
    EXPECT_FALSE(r.next().has_value());
    EXPECT_EQ(r.error(), wire::decode_status::bad_magic);
    r.feed(wire::encode_frame(sample_job(), std::string("ok")));
    EXPECT_FALSE(r.next().has_value()) << "after an error the stream is out of sync";
}

// The agent's JOB and qpu-sim's RESULT/ERROR are built by the one
// header_for: every job field of the JOB comes back in the answer, and what
// only the sender knows is left zero for it to fill in.
TEST(wire, header_for_builds_a_job_from_a_dispatch_job_and_the_answer_echoes_it) {
    qrt::dispatch::dispatch_job j;
    j.job_id = 77;
    j.qpu_index = 3;
    j.scheduled_ns = 1'767'225'600'000'000'123;
    j.window_start_ns = 1'767'225'600'000'000'000;
    j.window_end_ns = 1'767'225'601'000'000'000;
    j.duration_ns = 250'000;
    j.calibration_id = 42;
    j.tolerance_ns = 50'000;
    j.shots = 1000;
    const wire::header job = wire::header_for(j);
    EXPECT_EQ(job.type, static_cast<std::uint8_t>(wire::frame_type::job));
    EXPECT_EQ(job.magic, QRT_WIRE_MAGIC);
    EXPECT_EQ(job.job_id, 77U);
    EXPECT_EQ(job.calibration_id, 42U);
    EXPECT_EQ(job.scheduled_ns, j.scheduled_ns);
    EXPECT_EQ(job.window_start_ns, j.window_start_ns);
    EXPECT_EQ(job.window_end_ns, j.window_end_ns);
    EXPECT_EQ(job.duration_ns, 250'000);
    EXPECT_EQ(job.shots, 1000U);
    EXPECT_EQ(job.tolerance_ns, 50'000);
    EXPECT_EQ(job.flags, 0U);
    EXPECT_EQ(job.payload_len, 0U);
    EXPECT_EQ(job.sent_ns, 0);
    EXPECT_EQ(job.arrival_ns, 0);
    EXPECT_EQ(wire::decode_header(encoded(job)).status, wire::decode_status::ok);

    // The QPU's side: the JOB as decoded, answered.
    const wire::header got = wire::decode_header(encoded(sample_job())).hdr;
    for (const auto type : {wire::frame_type::result, wire::frame_type::error}) {
        wire::header a = wire::header_for(got, type);
        EXPECT_EQ(a.type, static_cast<std::uint8_t>(type));
        EXPECT_EQ(a.job_id, got.job_id);
        EXPECT_EQ(a.calibration_id, got.calibration_id);
        EXPECT_EQ(a.scheduled_ns, got.scheduled_ns);
        EXPECT_EQ(a.window_start_ns, got.window_start_ns);
        EXPECT_EQ(a.window_end_ns, got.window_end_ns);
        EXPECT_EQ(a.duration_ns, got.duration_ns);
        EXPECT_EQ(a.shots, got.shots);
        EXPECT_EQ(a.tolerance_ns, got.tolerance_ns);
        EXPECT_EQ(a.flags, 0U) << "the JOB's flags are not the answer's";
        EXPECT_EQ(a.sent_ns, 0);
        EXPECT_EQ(a.arrival_ns, 0);
        if (type == wire::frame_type::error) {
            a.status = QRT_WIRE_ERR_BUSY;
        }
        EXPECT_EQ(wire::decode_header(encoded(a)).status, wire::decode_status::ok);
    }
}
