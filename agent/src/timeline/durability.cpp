// The ledger's durability tracker (durability.hpp): sequence numbers, the
// changes in flight to the writer, persist and the writer's outcomes.
#include "qrt/timeline/durability.hpp"

#include <algorithm>
#include <limits>
#include <utility>

#include "rtcore/clock.hpp"

namespace qrt::timeline {

durability::durability(durability_options opts, durability_hooks hooks)
    : _opts(std::move(opts)), _hooks(std::move(hooks)) {}

durability::~durability() {
    _writer.reset();  // commits what is queued, then joins its thread
}

result<stored_state> durability::load() {
    auto loaded = _store->load();
    if (loaded) {
        adopt_mark(loaded->dispatch_mark_ns);
    }
    return loaded;
}

void durability::adopt_mark(std::int64_t mark_ns) {
    _dispatch_mark_ns = mark_ns;
    _mark_requested_ns = _dispatch_mark_ns;
    _mark_dirty.reset();
}

void durability::close() {
    if (_writer) {
        _store = _writer->stop();  // commits what is queued, then joins its thread
        _writer.reset();
    }
    if (_store) {
        // Every outcome is recorded: no job is left that a dispatch thread
        // may have sent unrecorded.
        if (_store->begin()) {
            if (_store->put_dispatch_mark(0, true) && _store->commit()) {
                _dispatch_mark_ns = 0;
            } else {
                _store->rollback();
            }
        }
        _store.reset();
    }
}

void durability::reset_mark() {
    if (!_store) {
        return;
    }
    auto s = _store->begin();
    if (s) {
        s = _store->put_dispatch_mark(0, true);
    }
    if (s) {
        s = _store->commit();
    }
    if (s) {
        _dispatch_mark_ns = 0;
        _mark_requested_ns = 0;
    } else {
        _store->rollback();
    }
}

bool durability::request_mark(std::int64_t to_ns) {
    _mark_requested_ns = to_ns;
    if (_writer) {
        _writer->request_mark(to_ns);  // ahead of the queued changes
        return false;
    }
    _mark_dirty = to_ns;
    return true;
}

void durability::mark_with_next(std::int64_t mark_ns) {
    _mark_dirty = std::max(_mark_dirty.value_or(mark_ns), mark_ns);
    _mark_requested_ns = mark_ns;
}

void durability::on_mark(std::int64_t mark_ns, bool ok) {
    if (ok) {
        _dispatch_mark_ns = std::max(_dispatch_mark_ns, mark_ns);
        if (_hooks.durable) {
            _hooks.durable(_durable_seq);  // the hand-over may go on
        }
    } else {
        _mark_requested_ns = _dispatch_mark_ns;  // asked for again at the next plan
    }
}

status durability::checkpoint() {
    if (_writer) {
        _writer->request_checkpoint();
        return {};
    }
    return _store ? _store->checkpoint() : status{};
}

void durability::follow(std::vector<event>& events) {
    if (!_in_flight.empty()) {
        for (event& e : events) {
            _in_flight.back().events.push_back(std::move(e));
        }
        events.clear();
    } else if (_hooks.publish) {
        _hooks.publish(events);
    }
    events.clear();
}

// Without a writer the change commits at once (one transaction, one fsync),
// as before group commit; with one it is queued, and on_group_done() makes
// it durable (or undoes it).
status durability::persist(change_set c, std::vector<event>& events,
                           std::vector<std::uint64_t>& commits) {
    if (!_stopped.empty()) {
        // Memory holds the change; the disk never will: never planned.
        for (const reservation& r : c.puts) {
            _undurable[r.id] = c.seq;
        }
        for (const std::uint64_t id : c.erases) {
            _undurable[id] = c.seq;
        }
        events.clear();
        commits.clear();
        return make_error(reason::store_error, "ledger: stopped: " + _stopped);
    }
    if (_writer) {
        in_flight f;
        f.seq = c.seq;
        f.ids.reserve(c.puts.size() + c.erases.size());
        for (const reservation& r : c.puts) {
            f.ids.push_back(r.id);
        }
        for (const std::uint64_t id : c.erases) {
            f.ids.push_back(id);
        }
        for (const std::uint64_t id : f.ids) {
            _undurable[id] = c.seq;
        }
        f.events = std::move(events);
        events.clear();
        f.commits = std::move(commits);
        commits.clear();
        f.dispatch_mark = c.dispatch_mark;
        _in_flight.push_back(std::move(f));
        _writer->enqueue(std::move(c));
        return {};
    }
    // For the commit latency histogram only (no decision reads a clock here).
    const std::int64_t t0 = rtcore::monotonic_now_ns();
    auto fail_with = [&](error e) -> status {
        ++_commits_failed;
        _store->rollback();
        // Memory holds the failed operation; the store does not.  Reload so
        // that the ledger again equals what was acknowledged.
        if (auto loaded = load(); loaded && _hooks.undo) {
            _hooks.undo(&*loaded);
        }
        _durable_seq = _latest_seq;  // resolved: it did not happen
        return e;
    };
    if (auto s = _store->begin(); !s) {
        return fail_with(std::move(s).err());
    }
    if (auto s = write_change(*_store, c); !s) {
        return fail_with(std::move(s).err());
    }
    if (auto s = _store->commit(); !s) {
        return fail_with(std::move(s).err());
    }
    _commit_ns.record(rtcore::monotonic_now_ns() - t0);
    _durable_seq = c.seq;
    commits.clear();
    if (c.dispatch_mark) {
        _dispatch_mark_ns = std::max(_dispatch_mark_ns, *c.dispatch_mark);
    }
    if (_hooks.publish) {
        _hooks.publish(events);
    }
    events.clear();
    return {};
}

void durability::start_writer(commit_writer::post_fn post) {
    if (!_store || _writer || _opts.group_max <= 1) {
        return;
    }
    writer_options wo;
    wo.group_max = _opts.group_max;
    wo.group_wait = _opts.group_wait;
    wo.before_commit = _opts.commit_hook;
    wo.before_reload = _opts.reload_hook;
    wo.on_mark = [this, alive = std::weak_ptr<bool>(_alive)](std::int64_t mark, bool ok) {
        if (const auto a = alive.lock(); a && *a) {
            on_mark(mark, ok);
        }
    };
    _writer = std::make_unique<commit_writer>(
        std::move(_store), std::move(wo), std::move(post),
        [this, alive = std::weak_ptr<bool>(_alive)](const group_outcome& g) {
            if (const auto a = alive.lock(); a && *a) {
                on_group_done(g);
            }
        });
}

std::uint64_t durability::change_seq_of(std::uint64_t id) const {
    const auto it = _undurable.find(id);
    return it == _undurable.end() ? 0 : it->second;
}

void durability::advance_durable(std::uint64_t seq) {
    _durable_seq = std::max(_durable_seq, seq);
    while (!_in_flight.empty() && _in_flight.front().seq <= _durable_seq) {
        in_flight& f = _in_flight.front();
        for (const std::uint64_t id : f.ids) {
            if (const auto it = _undurable.find(id); it != _undurable.end() && it->second == f.seq) {
                _undurable.erase(it);
            }
        }
        if (_hooks.publish) {
            _hooks.publish(f.events);
        }
        for (const std::uint64_t id : f.commits) {
            _durable_commits.push_back({f.seq, id});
        }
        if (f.dispatch_mark) {
            _dispatch_mark_ns = std::max(_dispatch_mark_ns, *f.dispatch_mark);
        }
        _in_flight.pop_front();
    }
    if (_hooks.durable) {
        _hooks.durable(_durable_seq);  // what is durable changed: the hand-over plan follows it
    }
}

std::int64_t durability::commit_lead_ns() const {
    if (!_writer) {
        return 0;
    }
    const std::int64_t slowest =
        *std::max_element(_recent_commit_ns.begin(), _recent_commit_ns.end());
    if (slowest <= 0) {
        return 0;
    }
    const std::size_t group = std::max<std::size_t>(_opts.group_max, 1);
    // The groups queued ahead, the one under way, and this change's own.
    const auto groups = static_cast<std::int64_t>(_writer->queued() / group + 1);
    return groups > std::numeric_limits<std::int64_t>::max() / slowest
               ? std::numeric_limits<std::int64_t>::max() / 4
               : groups * slowest;
}

// Loop thread, after each group.  A failed group is undone: every change
// from its first sequence on (the ones still queued were made on top of it)
// is dropped, and the owner reloads from the store, so that it again holds
// exactly what is on disk.
void durability::on_group_done(const group_outcome& g) {
    commit_notice n;
    n.changes = g.changes;
    n.commit_ns = g.commit_ns;
    _commit_ns.record(g.commit_ns);
    _recent_commit_ns[_recent_commit_next] = g.commit_ns;
    _recent_commit_next = (_recent_commit_next + 1) % _recent_commit_ns.size();
    if (g.ok) {
        advance_durable(g.last_seq);
        n.durable_seq = _durable_seq;
        n.committed = std::move(_durable_commits);
        _durable_commits.clear();
    } else {
        ++_commits_failed;
        const bool reloaded = g.reloaded && *g.reloaded;
        n.failed_from = g.first_seq;
        n.failed_to = std::max(g.last_seq, _latest_seq);
        n.why = g.failure.message;
        _in_flight.clear();
        _durable_commits.clear();
        stored_state* disk = nullptr;
        if (reloaded) {
            // Everything still queued was made on top of the failed changes.
            const auto rec = _writer ? _writer->recover() : commit_writer::recovered{};
            n.failed_to = std::max(n.failed_to, rec.last_dropped);
            _undurable.clear();
            disk = &**g.reloaded;
            adopt_mark(disk->dispatch_mark_ns);
        } else {
            // Fail-stop: memory keeps the failed changes, and nothing can
            // tell them from what is on disk.  Their ids stay undurable for
            // good (never planned), the writer stays parked, and nothing is
            // written again; the owner stops.
            n.why += "; reloading the ledger failed too: " +
                     (g.reloaded ? g.reloaded->err().message : std::string("no state"));
            _stopped = "the commit of changes " + std::to_string(n.failed_from) + ".." +
                       std::to_string(n.failed_to) + " failed (" + n.why + ")";
            n.stopped = true;
        }
        if (_hooks.undo) {
            _hooks.undo(disk);
        }
        _durable_seq = n.failed_to;
        _latest_seq = std::max(_latest_seq, n.failed_to);
        n.durable_seq = _durable_seq;
        // What the owner did on the wire is not undone by a failed group:
        // its transitions are applied again (new changes, after failed_to).
        if (reloaded && _hooks.redo) {
            _hooks.redo();
        }
    }
    if (_listener) {
        _listener(n);
    }
}

}  // namespace qrt::timeline
