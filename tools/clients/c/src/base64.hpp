#pragma once
// Standard base64 (RFC 4648 alphabet, '=' padding), as jobs.submit's
// payload and jobs.result's result use it: the agent's own implementation
// (rtcore), so decode is exactly as strict as the server's (no whitespace,
// no URL-safe characters, canonical padding).

#include "rtcore/base64.hpp"

namespace qrt::client {

using rtcore::base64_decode;
using rtcore::base64_encode;

}  // namespace qrt::client
