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
    }
    return "unknown";
}


}  // namespace qrt::dispatch
