#pragma once
// dispatcher::uring, the liburing state behind the dispatcher's pimpl, for
// the files that run a dispatcher's RT loop (dispatcher.cpp,
// dispatch_group.cpp); liburing.h stays out of the public header.

#include <liburing.h>

#include "qrt/dispatch/dispatcher.hpp"

namespace qrt::dispatch {

struct dispatcher::uring {
    io_uring ring{};
    bool inited = false;
    ~uring() {
        if (inited) {
            io_uring_queue_exit(&ring);
        }
    }
};

}  // namespace qrt::dispatch
