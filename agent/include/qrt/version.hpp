#pragma once
#include <string_view>

namespace qrt {
// Agent version and the JSON-RPC API version it speaks.
std::string_view version() noexcept;
inline constexpr int api_version = 1;
}  // namespace qrt
