// libFuzzer target for the QPU endpoint wire codec (qrt/proto/wire_codec.hpp,
// the header qrtd's QPU link, qpu-sim and the tests all use), versions 1
// and 2 (HELLO, JOB, RESULT, ERROR; ARM, ARMED, FIRE, DISARM, DISARMED, each
// with its own header length), and the version-2 JSON payloads
// (qrt/proto/wire_v2.hpp: capabilities, fire HELLO, ARMED costs): the bytes
// are what a QPU endpoint sends on the stream.  The first byte picks how the
// stream is cut into recv() pieces.  Checked on every input:
//   - frame_reader never reads past what it was fed, and never allocates
//     for a payload it has not received (payload_len is bounded first);
//   - every frame it returns has a header decode_header() accepts, a payload
//     of exactly payload_len bytes, and encodes back to the very bytes it was
//     cut from (one encoder, one decoder, one layout);
//   - decode_header() on any prefix agrees with the reader: need_more only
//     while short, and a wrong magic is reported as soon as 4 bytes are in;
//   - after an error the reader stays broken (the connection is dropped);
//   - bytes are conserved: returned frames + buffered == fed, until an error;
//   - a version-2 HELLO's or ARMED's payload parses or is refused, never
//     throws; what parses writes back to what parses the same.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "qrt/proto/wire_codec.hpp"
#include "qrt/proto/wire_v2.hpp"

namespace {

namespace wire = qrt::wire;

[[noreturn]] void fail(const char* what) {
    std::fprintf(stderr, "fuzz_wire: %s\n", what);
    std::abort();
}

void check_payloads(const wire::frame& f) {
    if (f.hdr.version != 2) {
        return;
    }
    if (f.hdr.type == QRT_WIRE_HELLO) {
        if (auto c = wire::parse_capabilities(f.payload_text())) {
            auto again = wire::parse_capabilities(wire::capabilities_json(*c));
            if (!again || again->session != c->session || again->max_armed != c->max_armed ||
                again->horizon_ns != c->horizon_ns || again->min_lead_ns != c->min_lead_ns ||
                again->two_phase != c->two_phase || again->own_clock != c->own_clock) {
                fail("capabilities do not survive their own writer");
            }
        } else if (auto s = wire::parse_fire_hello(f.payload_text())) {
            auto again = wire::parse_fire_hello(wire::fire_hello_json(*s));
            if (!again || *again != *s) {
                fail("the fire HELLO does not survive its own writer");
            }
        }
    } else if (f.hdr.type == QRT_WIRE_ARMED) {
        if (auto a = wire::parse_armed(f.payload_text())) {
            if (a->total_ns() < 0) {
                fail("ARMED costs add up below zero");
            }
            auto again = wire::parse_armed(wire::armed_json(*a));
            if (!again || again->program_duration_ns != a->program_duration_ns ||
                again->total_ns() != a->total_ns() - a->other_ns - a->by_stage[0]) {
                fail("ARMED costs do not survive their own writer");
            }
        }
    }
}

void check_frame(const wire::frame& f, std::span<const std::uint8_t> source) {
    const std::size_t hlen = f.hdr.header_len;
    if (hlen != wire::header_len_of(f.hdr.version)) {
        fail("a frame's header_len is not its version's");
    }
    if (f.payload.size() != f.hdr.payload_len || f.payload.size() > wire::max_payload) {
        fail("payload size differs from payload_len");
    }
    if (source.size() != hlen + f.payload.size()) {
        fail("a frame is not header + payload bytes of the stream");
    }
    const wire::decoded d = wire::decode_header(source);
    if (d.status != wire::decode_status::ok) {
        fail("the reader returned a frame decode_header() rejects");
    }
    if (std::memcmp(&f.v2.v1, &f.hdr, sizeof(f.hdr)) != 0) {
        fail("a frame's v2.v1 differs from its hdr");
    }
    std::uint8_t enc[wire::max_header_len];
    if (f.hdr.version == 1) {
        wire::encode_header(f.hdr, enc);
    } else {
        wire::encode_header(f.v2, enc);
    }
    if (std::memcmp(enc, source.data(), hlen) != 0) {
        fail("a decoded header does not encode back to its bytes");
    }
    if (!f.payload.empty() && std::memcmp(f.payload.data(), source.data() + hlen, f.payload.size()) != 0) {
        fail("the payload differs from the stream's bytes");
    }
    const auto whole = f.hdr.version == 1 ? wire::encode_frame(f.hdr, std::span<const std::uint8_t>(f.payload))
                                          : wire::encode_frame(f.v2, std::span<const std::uint8_t>(f.payload));
    if (whole.size() != source.size() || std::memcmp(whole.data(), source.data(), whole.size()) != 0) {
        fail("encode_frame differs from the stream's bytes");
    }
    if (wire::to_string(static_cast<wire::frame_type>(f.hdr.type))[0] == '?') {
        fail("an accepted frame has an unknown type");
    }
    if (f.hdr.type == QRT_WIRE_FIRE && !f.payload.empty()) {
        fail("a FIRE with a payload was accepted");
    }
    check_payloads(f);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size == 0) {
        return 0;
    }
    const std::span<const std::uint8_t> stream(data + 1, size - 1);

    // decode_header on every short prefix of the stream: need_more, or
    // bad_magic as soon as 4 wrong bytes are in; never a read past the span.
    const std::size_t probe = std::min(stream.size(), wire::header_len - 1);
    for (std::size_t n = 0; n <= probe; ++n) {
        const wire::decoded d = wire::decode_header(stream.first(n));
        const bool magic_known = n >= 4;
        const bool bad_magic = magic_known && std::memcmp(stream.data(), "QRTW", 4) != 0;
        if (d.status != (bad_magic ? wire::decode_status::bad_magic : wire::decode_status::need_more)) {
            fail("a short header is neither need_more nor an early bad_magic");
        }
    }

    // A version-2 header between its first 96 bytes and its 128: need_more,
    // unless the fields of the first 96 already break it.
    if (stream.size() >= wire::header_len) {
        const wire::decoded head = wire::decode_header(stream.first(wire::header_len));
        if (head.hdr.magic == QRT_WIRE_MAGIC && head.hdr.version == 2 &&
            head.hdr.header_len == wire::header_len_v2) {
            for (std::size_t n = wire::header_len; n < std::min(stream.size(), wire::header_len_v2); ++n) {
                if (wire::decode_header(stream.first(n)).status != wire::decode_status::need_more) {
                    fail("a short version-2 header is not need_more");
                }
            }
        }
    }

    wire::frame_reader reader;
    std::size_t fed = 0;
    std::size_t consumed = 0;  // bytes of the stream in returned frames
    std::size_t piece = 1 + (data[0] & 0x3FU) * 7U;
    const bool byte_by_byte = (data[0] & 0x40U) != 0;
    while (fed < stream.size()) {
        const std::size_t n = byte_by_byte ? 1 : std::min(piece, stream.size() - fed);
        reader.feed(stream.subspan(fed, n));
        fed += n;
        piece = piece * 2 + 3;
        while (auto f = reader.next()) {
            const std::size_t len = f->hdr.header_len + f->payload.size();
            check_frame(*f, stream.subspan(consumed, len));
            consumed += len;
        }
        if (reader.error() != wire::decode_status::ok) {
            break;
        }
        if (consumed + reader.buffered() != fed) {
            fail("bytes fed are neither in a frame nor buffered");
        }
        if (reader.buffered() >= wire::max_header_len + wire::max_payload) {
            fail("the reader holds a whole frame it did not return");
        }
    }
    if (reader.error() != wire::decode_status::ok) {
        // The error is what decode_header says of the bytes after the last frame.
        if (wire::decode_header(stream.subspan(consumed)).status != reader.error()) {
            fail("the reader's error differs from decode_header's");
        }
        if (std::strcmp(wire::to_string(reader.error()), "unknown") == 0) {
            fail("an error without a stable name");
        }
        reader.feed(stream.first(std::min<std::size_t>(stream.size(), 8)));
        if (reader.next()) {
            fail("a broken stream produced a frame");
        }
        reader.reset();
        if (reader.error() != wire::decode_status::ok || reader.buffered() != 0) {
            fail("reset() did not clear the reader");
        }
    } else if (wire::decode_header(stream.subspan(consumed)).status == wire::decode_status::ok &&
               stream.size() - consumed >= wire::decode_header(stream.subspan(consumed)).hdr.header_len +
                                               wire::decode_header(stream.subspan(consumed)).hdr.payload_len) {
        fail("a complete frame was left in the reader");
    }
    return 0;
}
