#pragma once
// JSON-RPC errors: every reason's spelling, code and qrtctl exit status is a
// row of the protocol's one table (qrt/proto/protocol.hpp, generated from
// agent/proto/protocol.toml).  The socket layer's names for them.

#include "qrt/proto/protocol.hpp"

namespace qrt::rpc {

using proto::code_app_first;
using proto::code_app_last;
using proto::code_internal_error;
using proto::code_invalid_params;
using proto::code_invalid_request;
using proto::code_method_not_found;
using proto::code_parse_error;
using proto::code_unlisted_reason;

namespace reason = proto::reason;

using proto::code_for_reason;
using proto::default_reason_for_code;
using proto::exit_code_for_reason;
using proto::find_outcome;
using proto::find_reason;

}  // namespace qrt::rpc
