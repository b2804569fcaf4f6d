#pragma once
// Standard base64 (RFC 4648 alphabet, '=' padding), as the socket API's
// jobs.submit payload and jobs.result result use it.  One implementation
// for the agent's server and libqrt-client.
//
// base64_decode is strict: length a multiple of 4, no whitespace, no
// URL-safe characters, '=' only at the end (positions 3..4 of the last
// quantum), and zero unused bits before the padding (canonical).  Any
// deviation gives nullopt.

#include <optional>
#include <string>
#include <string_view>

namespace rtcore {

std::string base64_encode(std::string_view bytes);
std::optional<std::string> base64_decode(std::string_view text);

}  // namespace rtcore
