// libFuzzer target for the QPU endpoint wire codec (qrt/proto/wire_codec.hpp,
// the header qrtd's QPU link, qpu-sim and the tests all use): the bytes are
// what a QPU endpoint sends on the stream.  The first byte picks how the
// stream is cut into recv() pieces.  Checked on every input:
//   - frame_reader never reads past what it was fed, and never allocates
//     for a payload it has not received (payload_len is bounded first);
//   - every frame it returns has a header decode_header() accepts, a payload
//     of exactly payload_len bytes, and encodes back to the very bytes it was
//     cut from (one encoder, one decoder, one layout);
//   - decode_header() on any prefix agrees with the reader: need_more only
//     while short, and a wrong magic is reported as soon as 4 bytes are in;
//   - after an error the reader stays broken (the connection is dropped);
//   - bytes are conserved: returned frames + buffered == fed, until an error.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "qrt/proto/wire_codec.hpp"

namespace {

namespace wire = qrt::wire;

[[noreturn]] void fail(const char* what) {
    std::fprintf(stderr, "fuzz_wire: %s\n", what);
    std::abort();
}

void check_frame(const wire::frame& f, std::span<const std::uint8_t> source) {
    if (f.payload.size() != f.hdr.payload_len || f.payload.size() > wire::max_payload) {
        fail("payload size differs from payload_len");
    }
    if (source.size() != wire::header_len + f.payload.size()) {
        fail("a frame is not header + payload bytes of the stream");
    }
    const wire::decoded d = wire::decode_header(source);
    if (d.status != wire::decode_status::ok) {
        fail("the reader returned a frame decode_header() rejects");
    }
    std::uint8_t enc[wire::header_len];
    wire::encode_header(f.hdr, enc);
    if (std::memcmp(enc, source.data(), wire::header_len) != 0) {
        fail("a decoded header does not encode back to its bytes");
    }
    if (!f.payload.empty() &&
        std::memcmp(f.payload.data(), source.data() + wire::header_len, f.payload.size()) != 0) {
        fail("the payload differs from the stream's bytes");
    }
    const auto whole = wire::encode_frame(f.hdr, std::span<const std::uint8_t>(f.payload));
    if (whole.size() != source.size() || std::memcmp(whole.data(), source.data(), whole.size()) != 0) {
        fail("encode_frame differs from the stream's bytes");
    }
    if (wire::to_string(static_cast<wire::frame_type>(f.hdr.type))[0] == '?') {
        fail("an accepted frame has an unknown type");
    }
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
            check_frame(*f, stream.subspan(consumed, wire::header_len + f->payload.size()));
            consumed += wire::header_len + f->payload.size();
        }
        if (reader.error() != wire::decode_status::ok) {
            break;
        }
        if (consumed + reader.buffered() != fed) {
            fail("bytes fed are neither in a frame nor buffered");
        }
        if (reader.buffered() >= wire::header_len + wire::max_payload) {
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
               stream.size() - consumed >=
                   wire::header_len + wire::decode_header(stream.subspan(consumed)).hdr.payload_len) {
        fail("a complete frame was left in the reader");
    }
    return 0;
}
