#pragma once
// What the event loop does for the ledger and its durability tracker in the
// timeline tests: runs what the commit writer posts, on the test's thread.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <vector>

#include "qrt/timeline/commit_writer.hpp"

namespace qrt::timeline::test {

class fake_loop {
public:
    commit_writer::post_fn poster() {
        return [this](std::function<void()> fn) {
            const std::lock_guard<std::mutex> lk(_mu);
            _posted.push_back(std::move(fn));
            _cv.notify_all();
        };
    }
    // Run posted callbacks until `done` holds (bounded: false after 20 s).
    bool run_until(const std::function<bool()>& done) {
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (!done()) {
            std::vector<std::function<void()>> batch;
            {
                std::unique_lock<std::mutex> lk(_mu);
                if (!_cv.wait_until(lk, give_up, [this] { return !_posted.empty(); })) {
                    return done();
                }
                batch.swap(_posted);
            }
            for (auto& fn : batch) {
                fn();
            }
        }
        return true;
    }

private:
    std::mutex _mu;
    std::condition_variable _cv;
    std::vector<std::function<void()>> _posted;
};

}  // namespace qrt::timeline::test
