#include "qrt/dispatch/step_follower.hpp"

#include <sys/epoll.h>

#include "qrt/log.hpp"

namespace qrt::dispatch {

rtcore::result<std::unique_ptr<realtime_step_follower>> realtime_step_follower::open(
    event_loop& loop, const rtcore::clock_source& clock) {
    auto watch = rtcore::realtime_step_watch::open(clock);
    if (!watch) {
        return watch.err();
    }
    std::unique_ptr<realtime_step_follower> f(new realtime_step_follower(loop, std::move(*watch)));
    realtime_step_follower* self = f.get();
    if (auto st = loop.add_fd(self->_watch.fd(), EPOLLIN, [self](std::uint32_t) { self->on_readable(); }); !st) {
        return st.err();
    }
    return f;
}

realtime_step_follower::~realtime_step_follower() { _loop.remove_fd(_watch.fd()); }

void realtime_step_follower::on_readable() {
    auto r = _watch.check();
    if (!r) {
        log::warn("dispatch", "realtime step watch: {}", r.err().message);
        return;
    }
    if (r->has_value()) {
        apply(**r);
    }
}

rtcore::result<rtcore::realtime_step> realtime_step_follower::resample_now() {
    auto r = _watch.rearm_and_resample();
    if (!r) {
        return r.err();
    }
    apply(*r);
    return *r;
}

void realtime_step_follower::apply(const rtcore::realtime_step& step) {
    ++_steps;
    std::size_t n = 0;
    for (auto& t : _targets) {
        n += t(step.after);
    }
    _reconverted += n;
    log::info("dispatch", "realtime clock stepped by {} ns; re-converted {} queued deadlines", step.step_ns, n);
}

}  // namespace qrt::dispatch
