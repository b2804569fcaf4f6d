#include "qrt/version.hpp"

namespace qrt {
std::string_view version() noexcept { return QRT_VERSION; }
}  // namespace qrt
