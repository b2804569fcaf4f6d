#pragma once
// Standard base64 (RFC 4648 alphabet, '=' padding), as jobs.submit's
// payload and jobs.result's result use it.  decode is strict like the
// agent's: no whitespace, no URL-safe characters, canonical padding.

#include <optional>
#include <string>
#include <string_view>

namespace qrt::client {

std::string base64_encode(std::string_view bytes);
std::optional<std::string> base64_decode(std::string_view text);

}  // namespace qrt::client
