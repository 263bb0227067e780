// The IF manager: the set of IFs the daemon serves, and every operation of the control plane
// (docs/control.md) on it.
//
// Threads: operations (handle(), add_*) run on the control thread (or main() at start-up),
// one at a time. serve() runs on the serving thread: it polls every IF and the tx ring. The
// two meet in the serving list: an operation changes the list, bumps a generation and waits
// until the serving thread has taken the new list before it frees anything the old one
// named. The data plane sees IFs only through its if_table, which is published after an IF
// is ready (add) and before it drains (remove), so rx lcores never enqueue to a freed ring.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dataplane/engine.h"
#include "dataplane/if_service.h"
#include "ifmanager/model_if.h"
#include "ifmanager/repository.h"
#include "libml/libml.h"
#include "preempt/scheduler.h"

namespace reefline::ifm {

// An operation's failure: a code from docs/control.md and a message for a person.
struct control_error : std::runtime_error {
    std::string code;
    control_error(std::string c, const std::string& message) : std::runtime_error(message), code(std::move(c)) {}
};

struct manager_info {
    std::string version = "0.1.0";
    std::string backend;  // device caps name
    std::string policy;   // scheduler policy name
};

class if_manager {
public:
    if_manager(dp::dataplane& plane, ml::runtime& runtime, gpu::scheduler& scheduler,
               model_repository* repo, manager_info info);
    ~if_manager();

    // One control request (a parsed JSON value) -> one reply object. Never throws.
    nlohmann::json handle(const nlohmann::json& request);
    // The same for raw message bytes: parse errors become bad_request replies.
    std::string handle_message(std::string_view message);

    // Operations, for start-up and tests. Throw control_error.
    nlohmann::json add_model(const nlohmann::json& fields, bool persist);
    nlohmann::json remove_model(const std::string& name);
    void add_service(std::shared_ptr<dp::if_service> s);  // built-in IFs (crc32)
    // Loads every repository entry; returns one line per entry that failed.
    std::vector<std::string> load_repository();

    nlohmann::json stats(const std::string& only = "") const;
    nlohmann::json health() const;
    // Adds every IF's data-plane counters (requests served, responses sent...) to `s`.
    void add_if_counters(dp::counter_snapshot& s) const;

    // Serving thread: polls every IF once and the tx ring. Returns the work done.
    uint32_t serve();
    // True when every IF has nothing queued or in flight and nothing waits for tx.
    bool quiet() const;
    // Shutdown: everything still waiting is answered with status shutting_down.
    void fail_pending();

    bool shutdown_requested() const { return _shutdown.load(std::memory_order_relaxed); }
    void request_shutdown() { _shutdown.store(true, std::memory_order_relaxed); }
    // The serving thread announces when it starts and stops polling: before and after,
    // list changes take effect at once instead of waiting for it.
    void set_serving(bool active) {
        _serving_active.store(active, std::memory_order_release);
        if (!active) _serving_stopped.store(true, std::memory_order_relaxed);
    }

    // Events for the PUB socket, oldest first (the control thread publishes them).
    std::vector<nlohmann::json> take_events();
    // Once a second from the control thread: SLO and drop events from counter deltas.
    void tick();

    dp::dataplane& plane() { return _plane; }

private:
    nlohmann::json dispatch(const nlohmann::json& request);
    nlohmann::json set(const nlohmann::json& fields);
    nlohmann::json list() const;
    std::shared_ptr<model_if> find(const std::string& name) const;
    void publish_bindings();
    void replace_serving(std::vector<std::shared_ptr<dp::if_service>> list);
    void event(nlohmann::json e);
    uint16_t free_slot() const;

    dp::dataplane& _plane;
    ml::runtime& _runtime;
    gpu::scheduler& _scheduler;
    model_repository* _repo;
    manager_info _info;
    std::chrono::steady_clock::time_point _start = std::chrono::steady_clock::now();

    // Control side (one operation at a time).
    mutable std::recursive_mutex _ops_mu;
    std::vector<std::shared_ptr<dp::if_service>> _services;   // built-in + model IFs
    std::map<std::string, std::shared_ptr<model_if>> _models;  // by IF name
    std::map<std::string, nlohmann::json> _model_fields;       // add_model fields, for persistence
    std::map<uint64_t, std::weak_ptr<ml::model>> _loaded;      // by file content hash: weights shared

    // The serving list handed to the serving thread.
    mutable std::mutex _list_mu;
    std::vector<std::shared_ptr<dp::if_service>> _list;
    std::atomic<uint64_t> _list_gen{0};
    std::atomic<uint64_t> _served_gen{0};
    std::vector<std::shared_ptr<dp::if_service>> _serving;  // serving thread's copy
    uint64_t _seen_gen = 0;

    std::atomic<bool> _shutdown{false};
    std::atomic<bool> _serving_stopped{false};
    std::atomic<bool> _serving_active{false};

    std::mutex _ev_mu;
    std::vector<nlohmann::json> _events;
    // tick(): previous counter values.
    std::map<std::string, uint64_t> _last_violations;
    std::vector<uint64_t> _last_drops;
};

}  // namespace reefline::ifm
