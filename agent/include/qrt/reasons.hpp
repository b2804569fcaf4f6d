#pragma once
// Where the layers' reason names meet the one table of reasons
// (qrt/rpc/errors.hpp), checked at compile time:
//   - every reason the ledger raises (qrt::timeline::reason) is an error
//     reason of reason_table, so data.reason never goes out unlisted;
//   - every outcome reason the QPU link and the job pump write into a job
//     (qrt::dispatch::outcome) has its row in outcome_table.
// It sits above timeline, dispatch and rpc, because it names all three; the
// daemon includes it.

#include <array>
#include <cstddef>
#include <string_view>

#include "qrt/dispatch/job.hpp"
#include "qrt/rpc/errors.hpp"
#include "qrt/timeline/types.hpp"

namespace qrt::reasons {

// Every outcome_table row is one of the names (with the check above: the two
// lists are the same).
constexpr bool every_outcome_is_named() noexcept {
    // By index, as rpc::index_in and for the same reason (errors.hpp).
    for (std::size_t i = 0; i < rpc::outcome_table.size(); ++i) {
        bool named = false;
        for (const auto n : dispatch::outcome::all) {
            named = named || n == rpc::outcome_table[i].reason;
        }
        if (!named) {
            return false;
        }
    }
    return true;
}

static_assert(rpc::all_in(timeline::reason::all, rpc::reason_table),
              "a qrt::timeline::reason has no row in qrt::rpc::reason_table");
static_assert(dispatch::outcome::all.size() == rpc::outcome_table.size() &&
                  all_in(dispatch::outcome::all, rpc::outcome_table) && every_outcome_is_named(),
              "qrt::dispatch::outcome and qrt::rpc::outcome_table list different reasons");

}  // namespace qrt::reasons
