// The ledger's writer thread: group commit (see commit_writer.hpp).
#include "qrt/timeline/commit_writer.hpp"

#include <pthread.h>

#include <algorithm>

#include "rtcore/clock.hpp"

namespace qrt::timeline {

status write_change(store& st, const change_set& c) {
    for (const reservation& r : c.puts) {
        if (auto s = st.put(r); !s) {
            return s;
        }
    }
    for (const std::uint64_t id : c.erases) {
        if (auto s = st.erase(id); !s) {
            return s;
        }
    }
    if (auto s = st.put_counters(c.next_id, c.next_gang, c.next_block); !s) {
        return s;
    }
    for (const calibration_block& b : c.block_puts) {
        if (auto s = st.put_block(b); !s) {
            return s;
        }
    }
    for (const std::uint64_t id : c.block_erases) {
        if (auto s = st.erase_block(id); !s) {
            return s;
        }
    }
    if (c.dispatch_mark) {
        if (auto s = st.put_dispatch_mark(*c.dispatch_mark); !s) {
            return s;
        }
    }
    // In the order they happened: a window dropped and one with its id
    // added by the same update end as the added one.
    for (const change_set::window_row& w : c.windows) {
        auto s = w.put ? st.put_window(w.qpu, *w.put) : st.erase_window(w.qpu, w.calibration_id);
        if (!s) {
            return s;
        }
    }
    return {};
}

commit_writer::commit_writer(std::unique_ptr<store> st, writer_options opts, post_fn post,
                             std::function<void(const group_outcome&)> on_done)
    : _store(std::move(st)),
      _opts(std::move(opts)),
      _post(std::move(post)),
      _on_done(std::move(on_done)),
      _path(_store->path()) {
    _opts.group_max = std::max<std::size_t>(_opts.group_max, 1);
    _thread = std::thread([this] { run(); });
}

commit_writer::~commit_writer() { (void)stop(); }

std::unique_ptr<store> commit_writer::stop() {
    bool parked = false;
    {
        const std::lock_guard<std::mutex> lk(_mu);
        _stopping = true;
    }
    _cv.notify_all();
    if (_thread.joinable()) {
        _thread.join();
    }
    *_alive = false;
    {
        const std::lock_guard<std::mutex> lk(_mu);
        parked = _parked;
    }
    if (parked) {
        return nullptr;
    }
    return std::move(_store);
}

void commit_writer::enqueue(change_set c) {
    {
        const std::lock_guard<std::mutex> lk(_mu);
        _queue.push_back(std::move(c));
    }
    _cv.notify_one();
}

std::size_t commit_writer::queued() const {
    const std::lock_guard<std::mutex> lk(_mu);
    return _queue.size() + _in_transaction;
}

void commit_writer::request_mark(std::int64_t mark_ns) {
    {
        const std::lock_guard<std::mutex> lk(_mu);
        _mark = std::max(_mark.value_or(mark_ns), mark_ns);
    }
    _cv.notify_one();
}

void commit_writer::request_checkpoint() {
    {
        const std::lock_guard<std::mutex> lk(_mu);
        _checkpoint = true;
    }
    _cv.notify_one();
}

commit_writer::recovered commit_writer::recover() {
    recovered out;
    std::unique_lock<std::mutex> lk(_mu);
    for (const change_set& c : _queue) {
        out.last_dropped = std::max(out.last_dropped, c.seq);
    }
    _queue.clear();
    _parked = false;
    lk.unlock();
    _cv.notify_one();
    return out;
}

void commit_writer::run() {
    ::pthread_setname_np(::pthread_self(), "qrtd-commit");
    std::vector<change_set> group;
    std::unique_lock<std::mutex> lk(_mu);
    for (;;) {
        _cv.wait(lk, [this] {
            return (!_parked && (!_queue.empty() || _checkpoint || _mark)) ||
                   (_stopping && (_parked || _queue.empty()));
        });
        if (_stopping && (_parked || _queue.empty())) {
            break;
        }
        if (_mark) {
            // One small transaction before the next group.
            const std::int64_t mark = *std::exchange(_mark, std::nullopt);
            lk.unlock();
            status st = _store->begin();
            if (st) {
                st = _store->put_dispatch_mark(mark);
            }
            if (st) {
                st = _store->commit();
            }
            if (!st) {
                _store->rollback();
            }
            if (_post && _opts.on_mark) {
                _post([alive = std::weak_ptr<bool>(_alive), done = _opts.on_mark, mark, ok = bool(st)] {
                    if (const auto a = alive.lock(); a && *a) {
                        done(mark, ok);
                    }
                });
            }
            lk.lock();
            continue;
        }
        if (_queue.empty()) {
            // Idle: a checkpoint was asked for.
            _checkpoint = false;
            lk.unlock();
            (void)_store->checkpoint();
            lk.lock();
            continue;
        }
        if (_opts.group_wait.count() > 0 && _queue.size() < _opts.group_max && !_stopping) {
            _cv.wait_for(lk, _opts.group_wait,
                         [this] { return _queue.size() >= _opts.group_max || _stopping; });
        }
        const std::size_t n = std::min(_queue.size(), _opts.group_max);
        group.clear();
        for (std::size_t i = 0; i < n; ++i) {
            group.push_back(std::move(_queue.front()));
            _queue.pop_front();
        }
        _in_transaction = n;
        const bool checkpoint = std::exchange(_checkpoint, false);
        lk.unlock();

        group_outcome out;
        out.first_seq = group.front().seq;
        out.last_seq = group.back().seq;
        out.changes = n;
        const std::int64_t t0 = rtcore::monotonic_now_ns();
        status st = _store->begin();
        for (std::size_t i = 0; st && i < group.size(); ++i) {
            st = write_change(*_store, group[i]);
        }
        if (st && _opts.before_commit) {
            st = _opts.before_commit(n);
        }
        if (st) {
            st = _store->commit();
        }
        out.commit_ns = rtcore::monotonic_now_ns() - t0;
        if (!st) {
            _store->rollback();
            out.ok = false;
            out.failure = std::move(st).err();
            // What the ledger reloads, read here and not on the loop.
            status seam = _opts.before_reload ? _opts.before_reload() : status{};
            out.reloaded = seam ? std::make_shared<result<stored_state>>(_store->load())
                                : std::make_shared<result<stored_state>>(std::move(seam).err());
        } else {
            _groups.fetch_add(1, std::memory_order_relaxed);
            if (checkpoint) {
                (void)_store->checkpoint();
            }
        }
        group.clear();

        lk.lock();
        _in_transaction = 0;
        if (!out.ok) {
            _parked = true;  // until the loop has recovered
        }
        lk.unlock();
        if (_post) {
            _post([alive = std::weak_ptr<bool>(_alive), done = _on_done, out = std::move(out)] {
                if (const auto a = alive.lock(); a && *a && done) {
                    done(out);
                }
            });
        }
        lk.lock();
    }
}

}  // namespace qrt::timeline
