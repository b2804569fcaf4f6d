#include "qrt/dispatch/job.hpp"

namespace qrt::dispatch {

const char* to_string(dispatch_status s) noexcept {
    switch (s) {
    case dispatch_status::sent: return "sent";
    case dispatch_status::missed: return outcome::missed.data();
    case dispatch_status::calibration_changed: return outcome::calibration_changed.data();
    case dispatch_status::out_of_window: return outcome::out_of_window.data();
    case dispatch_status::endpoint_down: return outcome::endpoint_down.data();
    case dispatch_status::send_failed: return outcome::send_failed.data();
    case dispatch_status::cancelled: return outcome::cancelled.data();
    case dispatch_status::not_armed: return outcome::not_armed.data();
    }
    return "unknown";
}

std::string_view outcome_for_wire_error(std::uint16_t status) noexcept {
    for (const auto& row : proto::wire_errors) {
        if (row.status == static_cast<int>(status) && !row.outcome.empty()) {
            return row.outcome;
        }
    }
    return outcome::qpu_error;
}


}  // namespace qrt::dispatch
