#include "qrt/dispatch/job.hpp"

namespace qrt::dispatch {

const char* to_string(dispatch_status s) noexcept {
    switch (s) {
    case dispatch_status::sent: return "sent";
    case dispatch_status::missed: return "missed";
    case dispatch_status::calibration_changed: return "calibration_changed";
    case dispatch_status::out_of_window: return "out_of_window";
    case dispatch_status::endpoint_down: return "endpoint_down";
    case dispatch_status::send_failed: return "send_failed";
    case dispatch_status::cancelled: return "cancelled";
    }
    return "unknown";
}

const char* to_string(job_state s) noexcept {
    switch (s) {
    case job_state::completed: return "completed";
    case job_state::failed: return "failed";
    case job_state::missed: return "missed";
    case job_state::sent: return "sent";
    }
    return "unknown";
}

}  // namespace qrt::dispatch
