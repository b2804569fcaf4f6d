// The wire's version 2 (qrt/proto/wire_codec.hpp): the 128-byte header, the
// ARM/ARMED/FIRE/DISARM/DISARMED frames, ERROR's stage, RESULT's endpoint
// times; and version 1 read by the same reader on the same stream.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "qrt/proto/wire_codec.hpp"

namespace wire = qrt::wire;

namespace {

wire::header_v2 sample(wire::frame_type type) {
    wire::header_v2 h = wire::make_header_v2(type);
    h.v1.job_id = 0x0102030405060708ULL;
    h.v1.calibration_id = 42;
    h.v1.scheduled_ns = 1'767'225'600'000'000'123;
    h.v1.sent_ns = -5;
    h.v1.window_start_ns = 1'767'225'600'000'000'000;
    h.v1.window_end_ns = 1'767'225'601'000'000'000;
    h.v1.duration_ns = 250'000;
    h.v1.shots = 1000;
    h.v1.tolerance_ns = 50'000;
    return h;
}

std::vector<std::uint8_t> encoded(const wire::header_v2& h) {
    std::vector<std::uint8_t> b(wire::header_len_v2);
    wire::encode_header(h, b.data());
    return b;
}

}  // namespace

TEST(wire_v2, result_round_trips_every_field_with_the_endpoint_times) {
    wire::header_v2 h = sample(wire::frame_type::result);
    h.v1.arrival_ns = 7;
    h.armed_ns = 1'767'225'599'800'000'000;
    h.started_ns = 1'767'225'600'000'000'200;
    h.ended_ns = 1'767'225'600'000'250'200;
    const auto b = encoded(h);
    ASSERT_EQ(b.size(), 128U);
    const wire::decoded d = wire::decode_header(b);
    ASSERT_EQ(d.status, wire::decode_status::ok) << wire::to_string(d.status);
    EXPECT_EQ(std::memcmp(&d.v2, &h, sizeof(h)), 0);
    EXPECT_EQ(std::memcmp(&d.hdr, &h.v1, sizeof(h.v1)), 0) << "hdr is the v1 part of v2";
    EXPECT_EQ(d.hdr.version, 2U);
    EXPECT_EQ(d.hdr.header_len, 128U);
}

TEST(wire_v2, error_names_its_stage_and_a_version_2_status) {
    wire::header_v2 h = sample(wire::frame_type::error);
    h.v1.status = QRT_WIRE_ERR_PROGRAM_REFUSED;
    h.stage = QRT_WIRE_STAGE_PARSE;
    const wire::decoded d = wire::decode_header(encoded(h));
    ASSERT_EQ(d.status, wire::decode_status::ok) << wire::to_string(d.status);
    EXPECT_EQ(d.v2.stage, QRT_WIRE_STAGE_PARSE);
    EXPECT_EQ(d.hdr.status, QRT_WIRE_ERR_PROGRAM_REFUSED);
}

TEST(wire_v2, every_version_2_frame_type_is_accepted_and_named) {
    for (const auto t : {wire::frame_type::hello, wire::frame_type::result, wire::frame_type::arm,
                         wire::frame_type::armed, wire::frame_type::fire, wire::frame_type::disarm,
                         wire::frame_type::disarmed}) {
        const wire::decoded d = wire::decode_header(encoded(sample(t)));
        EXPECT_EQ(d.status, wire::decode_status::ok) << wire::to_string(t) << ": " << wire::to_string(d.status);
        EXPECT_NE(wire::to_string(t)[0], '?');
    }
}

TEST(wire_v2, fire_is_a_header_only_and_its_fields_come_from_the_job) {
    wire::header_v2 f = sample(wire::frame_type::fire);
    f.v1.payload_len = 1;
    EXPECT_EQ(wire::decode_header(encoded(f)).status, wire::decode_status::fire_has_payload);
    const auto bytes = wire::encode_frame(sample(wire::frame_type::fire), std::string_view{});
    EXPECT_EQ(bytes.size(), wire::header_len_v2);
}

TEST(wire_v2, short_input_needs_more_until_the_versions_header_is_in) {
    const auto b = encoded(sample(wire::frame_type::arm));
    for (std::size_t n = 0; n < wire::header_len_v2; ++n) {
        EXPECT_EQ(wire::decode_header({b.data(), n}).status, wire::decode_status::need_more) << n;
    }
    EXPECT_EQ(wire::decode_header(b).status, wire::decode_status::ok);
}

struct malformed_v2 {
    const char* name;
    void (*mutate)(wire::header_v2&);
    wire::decode_status expected;
};

class wire_v2_malformed : public ::testing::TestWithParam<malformed_v2> {};

TEST_P(wire_v2_malformed, is_rejected_with_its_reason) {
    wire::header_v2 h = sample(wire::frame_type::arm);
    GetParam().mutate(h);
    const auto b = encoded(h);
    EXPECT_EQ(wire::decode_header(b).status, GetParam().expected)
        << GetParam().name << ": got " << wire::to_string(wire::decode_header(b).status);
}

INSTANTIATE_TEST_SUITE_P(
    every_v2_field, wire_v2_malformed,
    ::testing::Values(
        malformed_v2{"header_len_96", [](wire::header_v2& h) { h.v1.header_len = 96; },
                     wire::decode_status::bad_header_len},
        malformed_v2{"job_type_is_version_1_only_but_allowed",
                     [](wire::header_v2& h) { h.v1.type = QRT_WIRE_JOB; }, wire::decode_status::ok},
        malformed_v2{"type10", [](wire::header_v2& h) { h.v1.type = 10; }, wire::decode_status::bad_type},
        malformed_v2{"reserved2", [](wire::header_v2& h) { h.reserved2 = 1; }, wire::decode_status::bad_reserved},
        malformed_v2{"reserved3", [](wire::header_v2& h) { h.reserved3 = 1; }, wire::decode_status::bad_reserved},
        malformed_v2{"reserved4", [](wire::header_v2& h) { h.reserved4 = 1; }, wire::decode_status::bad_reserved},
        malformed_v2{"stage_on_arm", [](wire::header_v2& h) { h.stage = QRT_WIRE_STAGE_PARSE; },
                     wire::decode_status::bad_stage},
        malformed_v2{"stage_past_the_table",
                     [](wire::header_v2& h) {
                         h.v1.type = QRT_WIRE_ERROR;
                         h.v1.status = QRT_WIRE_ERR_PROGRAM_REFUSED;
                         h.stage = QRT_WIRE_STAGE_LAST + 1;
                     },
                     wire::decode_status::bad_stage},
        malformed_v2{"status_past_the_table",
                     [](wire::header_v2& h) {
                         h.v1.type = QRT_WIRE_ERROR;
                         h.v1.status = QRT_WIRE_ERR_LAST + 1;
                     },
                     wire::decode_status::bad_status},
        malformed_v2{"hello_over_its_limit",
                     [](wire::header_v2& h) {
                         h.v1.type = QRT_WIRE_HELLO;
                         h.v1.payload_len = QRT_WIRE_V2_MAX_HELLO_PAYLOAD + 1;
                     },
                     wire::decode_status::payload_too_large},
        malformed_v2{"hello_at_its_limit",
                     [](wire::header_v2& h) {
                         h.v1.type = QRT_WIRE_HELLO;
                         h.v1.payload_len = QRT_WIRE_V2_MAX_HELLO_PAYLOAD;
                     },
                     wire::decode_status::ok},
        malformed_v2{"arm_payload_over_the_wire",
                     [](wire::header_v2& h) { h.v1.payload_len = QRT_WIRE_MAX_PAYLOAD + 1; },
                     wire::decode_status::payload_too_large}),
    [](const ::testing::TestParamInfo<malformed_v2>& i) { return std::string(i.param.name); });

// One reader, one stream: a version-1 HELLO, then version-2 frames, each cut
// at its own header_len, fed one byte at a time.
TEST(frame_reader, reads_version_1_and_version_2_frames_on_one_stream) {
    std::vector<std::uint8_t> stream;
    auto add = [&](const std::vector<std::uint8_t>& f) { stream.insert(stream.end(), f.begin(), f.end()); };
    add(wire::encode_frame(wire::make_header(wire::frame_type::hello), std::string_view("qrtd 0 qpu=0 wire=2")));
    add(wire::encode_frame(wire::make_header_v2(wire::frame_type::hello), std::string_view(R"({"two_phase":true})")));
    wire::header_v2 armed = sample(wire::frame_type::armed);
    armed.armed_ns = 99;
    add(wire::encode_frame(armed, std::string_view(R"({"stages":[]})")));
    add(wire::encode_frame(sample(wire::frame_type::disarmed), std::string_view{}));
    wire::frame_reader r;
    std::vector<wire::frame> got;
    for (std::uint8_t byte : stream) {
        r.feed({&byte, 1});
        while (auto f = r.next()) {
            got.push_back(std::move(*f));
        }
    }
    ASSERT_EQ(r.error(), wire::decode_status::ok) << wire::to_string(r.error());
    ASSERT_EQ(got.size(), 4U);
    EXPECT_EQ(got[0].hdr.version, 1U);
    EXPECT_EQ(got[0].payload_text(), "qrtd 0 qpu=0 wire=2");
    EXPECT_EQ(got[1].hdr.version, 2U);
    EXPECT_EQ(got[1].payload_text(), R"({"two_phase":true})");
    EXPECT_EQ(got[2].hdr.type, QRT_WIRE_ARMED);
    EXPECT_EQ(got[2].v2.armed_ns, 99);
    EXPECT_EQ(got[3].hdr.type, QRT_WIRE_DISARMED);
    EXPECT_EQ(r.buffered(), 0U);
}

TEST(wire_v2, header_v2_for_echoes_the_job_and_leaves_the_rest_to_the_sender) {
    const wire::header_v2 arm = sample(wire::frame_type::arm);
    const wire::header_v2 a = wire::header_v2_for(arm.v1, wire::frame_type::armed);
    EXPECT_EQ(a.v1.version, 2U);
    EXPECT_EQ(a.v1.header_len, 128U);
    EXPECT_EQ(a.v1.type, QRT_WIRE_ARMED);
    EXPECT_EQ(a.v1.job_id, arm.v1.job_id);
    EXPECT_EQ(a.v1.scheduled_ns, arm.v1.scheduled_ns);
    EXPECT_EQ(a.v1.tolerance_ns, arm.v1.tolerance_ns);
    EXPECT_EQ(a.v1.sent_ns, 0);
    EXPECT_EQ(a.armed_ns, 0);
}

// The JSON payloads (qrt/proto/wire_v2.hpp).
#include "qrt/proto/wire_v2.hpp"

TEST(wire_v2_payloads, capabilities_parse_with_the_tables_keys_and_refuse_a_wrong_type) {
    const auto c = wire::parse_capabilities(
        R"({"identity":"qpu-sim 0.2","two_phase":true,"max_armed":8,"horizon_ns":10000000000,)"
        R"("min_lead_ns":200000000,"start":"own_clock","session":"abc","future_key":[1]})");
    ASSERT_TRUE(c) << c.err().message;
    EXPECT_TRUE(c->two_phase);
    EXPECT_EQ(c->max_armed, 8U);
    EXPECT_EQ(c->horizon_ns, 10'000'000'000);
    EXPECT_EQ(c->min_lead_ns, 200'000'000);
    EXPECT_TRUE(c->own_clock);
    EXPECT_EQ(c->session, "abc");
    const auto back = wire::parse_capabilities(wire::capabilities_json(*c));
    ASSERT_TRUE(back);
    EXPECT_EQ(back->max_armed, 8U);
    EXPECT_EQ(back->session, "abc");

    for (const char* bad : {R"([])", R"({"session":"s"})", R"({"two_phase":1,"session":"s"})",
                            R"({"two_phase":true})", R"({"two_phase":true,"session":""})",
                            R"({"two_phase":true,"session":"s","max_armed":-1})",
                            R"({"two_phase":true,"session":"s","max_armed":4294967296})",
                            R"({"two_phase":true,"session":"s","start":"whenever"})",
                            R"({"two_phase":true,"session":7})", "not json"}) {
        const auto r = wire::parse_capabilities(bad);
        EXPECT_FALSE(r) << bad;
        if (!r) {
            EXPECT_NE(r.err().message.find("endpoint HELLO"), std::string::npos) << r.err().message;
        }
    }
}

TEST(wire_v2_payloads, armed_costs_are_summed_by_the_tables_stages) {
    const auto a = wire::parse_armed(
        R"({"stages":[{"name":"compile","ns":1000},{"name":"upload","ns":2000},{"name":"upload","ns":5},)"
        R"({"name":"vendor_magic","ns":7}],"program_duration_ns":5000})");
    ASSERT_TRUE(a) << a.err().message;
    EXPECT_EQ(a->by_stage[QRT_WIRE_STAGE_COMPILE], 1000);
    EXPECT_EQ(a->by_stage[QRT_WIRE_STAGE_UPLOAD], 2005);
    EXPECT_EQ(a->other_ns, 7);
    EXPECT_EQ(a->total_ns(), 3012);
    EXPECT_EQ(a->program_duration_ns, 5000);
    EXPECT_TRUE(wire::parse_armed(""));
    for (const char* bad : {R"({"stages":{}})", R"({"stages":[{"name":"x"}]})", R"({"stages":[{"name":"x","ns":-1}]})",
                            R"({"program_duration_ns":"5"})", "["}) {
        EXPECT_FALSE(wire::parse_armed(bad)) << bad;
    }
}

TEST(wire_v2_payloads, the_agent_offers_version_2_in_its_identity_and_names_its_session_on_the_fire_connection) {
    EXPECT_EQ(wire::agent_identity("0.2.0", 3, true), "qrtd 0.2.0 qpu=3 wire=2");
    EXPECT_TRUE(wire::offers_v2("qrtd 0.2.0 qpu=3 wire=2"));
    EXPECT_FALSE(wire::offers_v2(wire::agent_identity("0.2.0", 3, false)));
    EXPECT_FALSE(wire::offers_v2("qrtd wire=20"));
    const auto s = wire::parse_fire_hello(wire::fire_hello_json("cafe"));
    ASSERT_TRUE(s);
    EXPECT_EQ(*s, "cafe");
    EXPECT_FALSE(wire::parse_fire_hello(R"({"channel":"control","session":"x"})"));
}
