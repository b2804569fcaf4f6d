#include "qrt/timeline/types.hpp"

#include <array>

namespace qrt::timeline {

namespace {
constexpr std::array<std::string_view, 11> k_state_names = {
    "held", "committed", "dispatched", "completed", "failed",
    "expired", "released", "cancelled", "missed", "displaced",
    "sent",
};
}  // namespace

std::string_view to_string(res_state s) noexcept {
    return k_state_names[static_cast<std::size_t>(s)];
}

std::optional<res_state> res_state_from_string(std::string_view s) noexcept {
    for (std::size_t i = 0; i < k_state_names.size(); ++i) {
        if (k_state_names[i] == s) {
            return static_cast<res_state>(i);
        }
    }
    return std::nullopt;
}

bool is_active(res_state s) noexcept {
    return s == res_state::held || s == res_state::committed || s == res_state::dispatched;
}

bool is_terminal(res_state s) noexcept { return !is_active(s); }

bool transition_allowed(res_state from, res_state to) noexcept {
    using st = res_state;
    switch (from) {
    case st::held:
        return to == st::committed || to == st::expired || to == st::released ||
               to == st::displaced;
    case st::committed:
        return to == st::dispatched || to == st::cancelled || to == st::missed ||
               to == st::displaced;
    case st::dispatched:
        return to == st::completed || to == st::failed || to == st::sent;
    default:
        return false;  // terminal states never change
    }
}

}  // namespace qrt::timeline
