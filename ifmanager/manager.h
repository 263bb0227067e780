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
#include "ifmanager/bounded_json.h"
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
    // Memory the models may take together (weights, host copies, arenas; 0: no limit) and the
    // largest model file add_model reads (docs/control.md, "Memory budget").
    uint64_t memory_budget_bytes = 0;
    // Where the budget came from ("--memory-budget", "cgroup" or "host": 3/4 of what the
    // tighter of the daemon's memory cgroup and the host had available at start) and what
    // was available then, in words (health shows both).
    std::string memory_budget_source = "--memory-budget";
    std::string memory_available;
    // A GPU's own memory for weights and arenas: 3/4 of what it had free at start (0: the
    // device's memory is the host's, one budget for both).
    uint64_t device_memory_budget_bytes = 0;
    uint64_t device_memory_free_at_start = 0;
    uint64_t max_model_file_bytes = uint64_t(1) << 30;
    // Kernel profiles (kprof) of every model added, for DKP's rules and PREMA's estimates:
    // measured as BE tasks through the scheduler for at most this long per add (0: none).
    double profile_budget_ms = 0;
    bool dkp = false;  // the scheduler pads RT kernels (health shows it)
    // Policy abacus: its predictor (file, models, held-out error) or why the profiles predict
    // instead; null with other policies (health shows it).
    nlohmann::json abacus;
};

// Limits on a request (docs/control.md, "Limits"). Nesting is bounded by max_json_depth
// (ifmanager/bounded_json.h).
inline constexpr size_t max_request_bytes = size_t(1) << 20;
inline constexpr size_t max_string_bytes = 4096;  // any string field (a path fits)
inline constexpr size_t max_array_items = 64;     // any array field (rt_sources)

// A model file read once, after its size was checked: the bytes that are hashed, imported and
// stored in the repository are the same.
struct model_file {
    std::string bytes;
    uint64_t hash = 0;
};

class if_manager {
public:
    if_manager(dp::dataplane& plane, ml::runtime& runtime, gpu::scheduler& scheduler,
               model_repository* repo, manager_info info);
    ~if_manager();

    // One control request (a parsed JSON value) -> one reply object. Never throws.
    nlohmann::json handle(const nlohmann::json& request);
    // The same for raw message bytes: oversized, too deeply nested or malformed text becomes a
    // bad_request reply. Never throws; the reply is always one JSON object with "ok".
    std::string handle_message(std::string_view message);
    // The error reply for a request the transport refused before it was parsed.
    static std::string error_text(const std::string& code, const std::string& message);

    // Operations, for start-up and tests. Throw control_error.
    nlohmann::json add_model(const nlohmann::json& fields, bool persist);
    nlohmann::json remove_model(const std::string& name);
    void add_service(std::shared_ptr<dp::if_service> s);  // built-in IFs (crc32)
    // Loads every repository entry; returns one line per entry that failed.
    std::vector<std::string> load_repository();

    nlohmann::json stats(const std::string& only = "") const;
    nlohmann::json health() const;
    // Memory the loaded models hold now: each model's weights and host copy once, plus every
    // IF's instances. With a device budget (a GPU: weights and arenas in its own memory) the
    // two are apart: host = host copies, device = weights and instances.
    struct memory_use {
        uint64_t host = 0, device = 0;
    };
    memory_use memory_in_use() const;
    uint64_t memory_used() const { return memory_in_use().host; }
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
    // A model file for an IF named `name` with these settings and instances of these batch
    // sizes: read (its size checked first), its weights shared with a loaded copy of the same
    // bytes or imported, and its footprint admitted against the memory budget. Throws
    // control_error (bad_model, or the budget's refusal).
    struct loaded_model {
        std::shared_ptr<ml::model> model;
        model_file file;
        std::pair<uint64_t, uint64_t> key;  // _loaded's
    };
    // `sizes`: the batch sizes to plan, per lane (a lane's instances share an arena).
    loaded_model load_model_file(const std::string& name, const std::string& onnx, const model_settings& settings,
                                 const std::vector<std::vector<int64_t>>& sizes);
    nlohmann::json set(const nlohmann::json& fields);
    // Refuses `need` more bytes when they do not fit the budgets beside what is in use;
    // `what` says what they are for ("model 'cam' needs 3.1 GiB: ..."). `need.device` is
    // counted against the host budget where the device has no memory of its own.
    void admit(memory_use need, const std::string& what) const;
    // The repository entry's config: every setting of the IF, compact and bounded.
    nlohmann::json persisted_config(const model_if& mif) const;
    // Profiles the IF's plans (repository first, then measured as BE tasks) and keeps them in
    // its repository entry when `keep`.
    // A share below 1 needs a device with spatial shares (bad_request otherwise).
    void check_share(const model_settings& s) const;
    // Places the IFs' shares on compute units (model_if::set_units); after every add, set and
    // remove, and when the tuner changed a demand.
    void place_shares();
    // One round of the self-tuned shares (from tick()).
    void tune_shares();
    // How many bits a unit set of this device has: its compute units, or groups of them on a
    // device with more than 64 (gpu::unit_group).
    uint32_t share_units() const;
    // With `change`, profiles only its new instances (a `set` prepared on the side).
    void profile(model_if& mif, const std::string& name, bool keep, model_if::prepared_settings* change = nullptr);
    nlohmann::json dkp_json() const;
    // The IF's describe object with its memory (weights, host copy, instances).
    nlohmann::json describe(const model_if& mif) const;
    // health's "memory": budget, used, free, file limit.
    nlohmann::json memory_json() const;
    // health's and stats' "units": the device's spatial shares and their fallbacks.
    nlohmann::json units_json() const;
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

    // Control side (one operation at a time). Operations hold _ops_mu for their whole
    // length (an add_model loads and warms a model for seconds); they change the two tables
    // below under _tables_mu as well, briefly, so that readers on other threads (metrics
    // scrapes, the serving loop's counters) take only _tables_mu and are never held up by
    // an operation in progress.
    mutable std::recursive_mutex _ops_mu;
    mutable std::mutex _tables_mu;
    std::vector<std::shared_ptr<dp::if_service>> _services;   // built-in + model IFs
    std::map<std::string, std::shared_ptr<model_if>> _models;  // by IF name
    struct tables {
        std::vector<std::shared_ptr<dp::if_service>> services;
        std::map<std::string, std::shared_ptr<model_if>> models;
    };
    // Copies of both tables, for readers outside operations.
    tables snapshot() const;
    // Loaded models by file (content hash, size): a second IF of the same file shares weights.
    std::map<std::pair<uint64_t, uint64_t>, std::weak_ptr<ml::model>> _loaded;

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
    // Self-tuned shares, by IF name (under _ops_mu): demand and placement in units, and the
    // counters at the last round.
    struct share_tuning {
        uint32_t demand = 0, units = 0;
        model_if::share_totals last;
        std::chrono::steady_clock::time_point at;
    };
    std::map<std::string, share_tuning> _tuning;
};

}  // namespace reefline::ifm
