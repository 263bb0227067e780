#include "ifmanager/manager.h"

#include "dkp/profile.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <rte_ethdev.h>
#include <rte_mempool.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <regex>
#include <set>
#include <span>
#include <thread>

#include "ifmanager/bounded_json.h"
#include "ifmanager/byte_size.h"
#include "ifmanager/if_stats.h"
#include "ifmanager/share_tuner.h"
#include "libml/regular_file.h"
#include "preempt/abacus.h"

namespace reefline::ifm {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int schema_version = 1;

[[noreturn]] void bad(const std::string& message) { throw control_error("bad_request", message); }

// A field name as an error message quotes it (the name may be anything a client sent).
std::string in_quotes(std::string_view key) { return "'" + excerpt(key) + "'"; }

const json* field(const json& o, const char* key) {
    const auto it = o.find(key);
    return it == o.end() || it->is_null() ? nullptr : &*it;
}

std::string get_string(const json& o, const char* key) {
    const json* v = field(o, key);
    if (!v) bad(std::string("missing field '") + key + "'");
    if (!v->is_string()) bad(std::string("field '") + key + "' must be a string");
    return v->get<std::string>();
}

int64_t get_int(const json& o, const char* key, int64_t lo, int64_t hi) {
    const json* v = field(o, key);
    if (!v) bad(std::string("missing field '") + key + "'");
    if (!v->is_number_integer() && !v->is_number_unsigned() &&
        !(v->is_number_float() && std::nearbyint(v->get<double>()) == v->get<double>()))
        bad(std::string("field '") + key + "' must be an integer");
    const double d = v->get<double>();
    if (d < double(lo) || d > double(hi))
        bad(std::string("field '") + key + "' must be " + std::to_string(lo) + ".." + std::to_string(hi));
    return int64_t(d);
}

double get_number(const json& o, const char* key) {
    const json* v = field(o, key);
    if (!v) bad(std::string("missing field '") + key + "'");
    if (!v->is_number()) bad(std::string("field '") + key + "' must be a number");
    return v->get<double>();
}

bool get_bool(const json& o, const char* key) {
    const json* v = field(o, key);
    if (!v->is_boolean()) bad(std::string("field '") + key + "' must be true or false");
    return v->get<bool>();
}

gpu::task_class parse_class(const std::string& s) {
    if (s == "rt") return gpu::task_class::rt;
    if (s == "be") return gpu::task_class::be;
    bad("field 'class' must be \"rt\" or \"be\", got \"" + excerpt(s) + "\"");
}

std::array<float, 3> get_triple(const json& o, const char* key) {
    const json* v = field(o, key);
    if (!v->is_array() || v->size() != 3) bad(std::string("field '") + key + "' must be an array of 3 numbers");
    std::array<float, 3> t{};
    for (size_t i = 0; i < 3; ++i) {
        if (!(*v)[i].is_number()) bad(std::string("field '") + key + "' must be an array of 3 numbers");
        const double d = (*v)[i].get<double>();
        if (!(std::fabs(d) <= 1e6)) bad(std::string("field '") + key + "' must hold numbers within +-1e6");
        t[i] = float(d);
    }
    return t;
}

// The fields each operation takes besides "v" and "op" (docs/control.md). Anything else is
// refused: a misspelt field silently ignored is a setting the operator believes applied, and
// an unknown one persisted would grow the repository without bound.
constexpr const char* tunable_fields[] = {"class", "slo_ms", "batching", "min_batch", "max_batch", "fixed_batch",
                                          "priority", "rt_sources", "output", "shed", "share"};
constexpr const char* add_only_fields[] = {"name", "port", "onnx", "top_k", "mean", "std"};

bool one_of(std::string_view key, std::span<const char* const> names) {
    return std::any_of(names.begin(), names.end(), [&](const char* n) { return key == n; });
}

std::string names_text(std::initializer_list<std::span<const char* const>> lists) {
    std::string s;
    for (const auto& l : lists)
        for (const char* n : l) s += (s.empty() ? "" : ", ") + std::string(n);
    return s.empty() ? "none" : s;
}

// Refuses fields `op` does not take and values beyond the size limits, naming the field.
void check_fields(const json& r, const std::string& op, std::initializer_list<std::span<const char* const>> allowed) {
    for (const auto& [key, value] : r.items()) {
        if (key == "v" || key == "op") continue;
        bool known = false;
        for (const auto& l : allowed) known |= one_of(key, l);
        if (!known) {
            if (op == "set" && one_of(key, add_only_fields))
                bad("field '" + key + "' cannot be changed by set: remove and add the model");
            bad("unknown field " + in_quotes(key) + " for " + op + " (it takes: " + names_text(allowed) + ")");
        }
        if (value.is_string() && value.get_ref<const std::string&>().size() > max_string_bytes)
            bad("field '" + key + "' is " + std::to_string(value.get_ref<const std::string&>().size()) +
                " bytes long; the limit is " + std::to_string(max_string_bytes));
        if (value.is_array() && value.size() > max_array_items)
            bad("field '" + key + "' has " + std::to_string(value.size()) + " entries; the limit is " +
                std::to_string(max_array_items));
        if (value.is_object()) bad("field '" + key + "' must not be an object");
    }
}

// Applies the tunable fields present in `f` to `s` (add_model and set share them).
void apply_settings(const json& f, model_settings& s) {
    if (field(f, "class")) s.cls = parse_class(get_string(f, "class"));
    if (field(f, "slo_ms")) {
        const double slo = get_number(f, "slo_ms");
        if (!(slo > 0) || slo > 3.6e6) bad("field 'slo_ms' must be > 0 and at most an hour");
        s.batching.slo_ms = slo;
    }
    if (field(f, "batching")) {
        const std::string p = get_string(f, "batching");
        if (!parse_batching_policy(p, s.batching.policy))
            bad("field 'batching' must be \"slab\", \"aimd\" or \"fixed\", got \"" + excerpt(p) + "\"");
    }
    if (field(f, "max_batch")) s.batching.max_batch = uint32_t(get_int(f, "max_batch", 1, 256));
    if (field(f, "min_batch")) s.batching.min_batch = uint32_t(get_int(f, "min_batch", 1, 256));
    if (field(f, "fixed_batch")) s.batching.fixed_batch = uint32_t(get_int(f, "fixed_batch", 0, 256));
    if (field(f, "priority")) s.priority = int(get_int(f, "priority", 0, 2));
    if (field(f, "shed")) s.shed = get_bool(f, "shed");
    if (field(f, "share")) {
        const json& v = f["share"];
        if (v.is_string() && v.get<std::string>() == "auto") {
            s.share_auto = true;
        } else {
            const double x = v.is_number() ? v.get<double>() : -1;
            if (!(x > 0 && x <= 1))
                bad("field 'share' must be a number > 0 and at most 1 (a fraction of the device) or \"auto\"");
            s.share = x;
            s.share_auto = false;
        }
    }
    if (field(f, "output")) {
        const std::string o = get_string(f, "output");
        if (o != "topk" && o != "tensor") bad("field 'output' must be \"topk\" or \"tensor\", got \"" + excerpt(o) + "\"");
        s.tensor_output = o == "tensor";
    }
    if (field(f, "rt_sources")) {
        const json& v = f["rt_sources"];
        if (!v.is_array()) bad("field 'rt_sources' must be an array of IPv4 addresses");
        s.rt_sources_be.clear();
        for (const auto& a : v) {
            uint32_t be = 0;
            if (!a.is_string() || inet_pton(AF_INET, a.get<std::string>().c_str(), &be) != 1)
                bad("field 'rt_sources': " + excerpt(serialise(a)) + " is not an IPv4 address");
            s.rt_sources_be.push_back(be);
        }
    }
    // The settings as a whole: rules across fields (min_batch <= fixed_batch <= max_batch,
    // ...) hold before anything is applied.
    try {
        check_settings(s);
    } catch (const std::invalid_argument& e) {
        bad(e.what());
    }
}

model_file read_model_file(const std::string& path, uint64_t limit) {
    model_file f;
    try {
        f.bytes = ml::read_regular_file(path, limit);
    } catch (const ml::file_too_large& e) {
        throw control_error("bad_model", path + " is " + format_byte_size(double(e.size)) +
                                             "; the largest model file this daemon reads is " +
                                             format_byte_size(double(e.limit)) + " (--max-model-file)");
    } catch (const ml::file_refused& e) {
        throw control_error("bad_model", e.what());
    }
    if (f.bytes.empty()) throw control_error("bad_model", path + " is empty");
    // The key that lets a second IF of the same model share its weights, and that the abacus
    // predictor names its models by.
    f.hash = gpu::abacus::model_key(f.bytes);
    return f;
}

std::string sizes_text(const std::vector<std::vector<int64_t>>& lanes) {
    std::vector<int64_t> distinct;
    for (const auto& sizes : lanes) distinct.insert(distinct.end(), sizes.begin(), sizes.end());
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    std::string s;
    for (const int64_t b : distinct) s += (s.empty() ? "" : ", ") + std::to_string(b);
    return s;
}

json reply_error(const std::string& code, const std::string& message) {
    return {{"v", schema_version}, {"ok", false}, {"error", {{"code", code}, {"message", message}}}};
}

// What handle_message() answers if even an error reply cannot be serialised (out of memory).
constexpr std::string_view unserialisable_reply =
    R"({"v":1,"ok":false,"error":{"code":"internal","message":"the reply could not be serialised"}})";

}  // namespace

if_manager::if_manager(dp::dataplane& plane, ml::runtime& runtime, gpu::scheduler& scheduler,
                       model_repository* repo, manager_info info)
    : _plane(plane), _runtime(runtime), _scheduler(scheduler), _repo(repo), _info(std::move(info)) {}

if_manager::~if_manager() = default;

void if_manager::event(json e) {
    e["v"] = schema_version;
    e["time"] = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    std::lock_guard<std::mutex> g(_ev_mu);
    if (_events.size() < 1024) _events.push_back(std::move(e));  // bounded: a stalled publisher loses events
}

std::vector<json> if_manager::take_events() {
    std::lock_guard<std::mutex> g(_ev_mu);
    return std::exchange(_events, {});
}

std::shared_ptr<model_if> if_manager::find(const std::string& name) const {
    const auto it = _models.find(name);
    if (it == _models.end()) throw control_error("unknown_model", "no model IF named " + in_quotes(name));
    return it->second;
}

uint16_t if_manager::free_slot() const {
    std::vector<bool> used(dp::max_ifs);
    for (const auto& s : _services) used[s->binding().slot] = true;
    for (uint16_t i = 0; i < dp::max_ifs; ++i)
        if (!used[i]) return i;
    throw control_error("internal", "all " + std::to_string(dp::max_ifs) + " IF slots are in use");
}

void if_manager::replace_serving(std::vector<std::shared_ptr<dp::if_service>> list) {
    uint64_t gen;
    {
        std::lock_guard<std::mutex> g(_list_mu);
        _list = std::move(list);
        gen = _list_gen.fetch_add(1, std::memory_order_acq_rel) + 1;
    }
    if (!_serving_active.load(std::memory_order_acquire)) {
        // Not serving (start-up, or stopped): nothing else reads the serving list.
        std::lock_guard<std::mutex> g(_list_mu);
        _serving = _list;
        _seen_gen = gen;
        _served_gen.store(gen, std::memory_order_release);
        return;
    }
    // Wait until the serving thread has dropped the old list (or stopped serving).
    while (_served_gen.load(std::memory_order_acquire) < gen && !_serving_stopped.load(std::memory_order_relaxed))
        std::this_thread::sleep_for(std::chrono::microseconds(100));
}

void if_manager::publish_bindings() {
    std::vector<dp::if_binding> b;
    for (const auto& s : _services) b.push_back(s->binding());
    _plane.ifs().publish(std::move(b));
}

void if_manager::add_service(std::shared_ptr<dp::if_service> s) {
    std::lock_guard<std::recursive_mutex> g(_ops_mu);
    for (const auto& o : _services)
        if (o->binding().udp_port == s->binding().udp_port)
            throw control_error("port_in_use", "UDP port " + std::to_string(s->binding().udp_port) + " is taken by IF '" +
                                                   o->name() + "'");
    {
        std::lock_guard<std::mutex> t(_tables_mu);
        _services.push_back(std::move(s));
    }
    replace_serving(_services);
    publish_bindings();
}

void if_manager::admit(memory_use need, const std::string& what) const {
    const memory_use used = memory_in_use();
    const bool separate = _info.device_memory_budget_bytes > 0;
    if (!separate) {
        need.host += need.device;
        need.device = 0;
    }
    const uint64_t budget = _info.memory_budget_bytes;
    if (budget != 0 && !(used.host <= budget && need.host <= budget - used.host))
        throw control_error("bad_model", what + "; budget " + format_byte_size(double(budget)) + ", " +
                                             format_byte_size(double(used.host)) + " in use (--memory-budget)");
    const uint64_t device_budget = _info.device_memory_budget_bytes;
    if (separate && !(used.device <= device_budget && need.device <= device_budget - used.device))
        throw control_error("bad_model", what + "; device memory budget " + format_byte_size(double(device_budget)) + ", " +
                                             format_byte_size(double(used.device)) + " in use (3/4 of the " +
                                             format_byte_size(double(_info.device_memory_free_at_start)) +
                                             " the device had free at start)");
}

if_manager::memory_use if_manager::memory_in_use() const {
    std::set<const ml::model*> counted;
    memory_use u;
    for (const auto& [name, mif] : snapshot().models) {
        if (counted.insert(mif->model().get()).second) {
            u.host += uint64_t(mif->model()->host_bytes());
            u.device += uint64_t(mif->model()->weight_bytes());
        }
        u.device += uint64_t(mif->memory_bytes());
    }
    if (_info.device_memory_budget_bytes == 0) {
        u.host += u.device;
        u.device = 0;
    }
    return u;
}

json if_manager::persisted_config(const model_if& mif) const {
    const model_if_config& c = mif.config();
    const model_settings s = mif.settings();
    json sources = json::array();
    for (const uint32_t ip : s.rt_sources_be) {
        char buf[INET_ADDRSTRLEN];
        sources.push_back(inet_ntop(AF_INET, &ip, buf, sizeof buf));
    }
    return {{"name", c.name},
            {"port", c.udp_port},
            {"onnx", c.onnx},
            {"class", s.cls == gpu::task_class::rt ? "rt" : "be"},
            {"slo_ms", s.batching.slo_ms},
            {"batching", batching_policy_name(s.batching.policy)},
            {"min_batch", s.batching.min_batch},
            {"max_batch", s.batching.max_batch},
            {"fixed_batch", s.batching.fixed_batch},
            {"priority", s.priority},
            {"shed", s.shed},
            {"share", s.share_auto ? json("auto") : json(s.share)},
            {"output", s.tensor_output ? "tensor" : "topk"},
            {"rt_sources", sources},
            {"top_k", c.top_k},
            {"mean", {c.mean[0], c.mean[1], c.mean[2]}},
            {"std", {c.std[0], c.std[1], c.std[2]}}};
}

void if_manager::check_share(const model_settings& s) const {
    if ((s.share < 1 || s.share_auto) && !_runtime.device().has_unit_sets())
        bad("field 'share' below 1 or \"auto\" needs a device with spatial shares; this backend (" + _info.backend +
            ") has none");
}

uint32_t if_manager::share_units() const {
    return gpu::unit_set_bits(_runtime.device().caps().compute_units);
}

// Static shares first: IFs with a share below 1, in name order, each get max(1, round(share x
// units)) consecutive compute units, starting where the previous one's ended (wrapping round),
// so that shares do not overlap while they add up to at most the device; past that they
// overlap, as an over-committed device must. Then the self-tuned IFs divide what the static
// ones left (all of it when there are none) max-min fairly by their demands, placed the same
// way after them. An IF with share 1 runs on every unit.
void if_manager::place_shares() {
    const uint32_t n = share_units();
    const uint64_t every = n >= 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1;
    uint32_t next = 0, used = 0;
    std::lock_guard<std::mutex> t(_tables_mu);
    const auto place = [&](model_if& mif, uint32_t k) {
        uint64_t mask = 0;
        for (uint32_t i = 0; i < k; ++i) mask |= uint64_t{1} << ((next + i) % n);
        next = (next + k) % n;
        used += k;
        mif.set_units(mask == every ? 0 : mask);
    };
    std::vector<std::pair<model_if*, uint32_t>> tuned;  // (IF, demand)
    for (auto it = _tuning.begin(); it != _tuning.end();)  // removed IFs and IFs no longer tuned
        it = _models.count(it->first) && _models.at(it->first)->settings().share_auto ? std::next(it) : _tuning.erase(it);
    for (const auto& [name, mif] : _models) {
        const model_settings s = mif->settings();
        if (n <= 1 || (s.share >= 1 && !s.share_auto)) {
            mif->set_units(0);
        } else if (s.share_auto) {
            share_tuning& st = _tuning[name];
            if (st.demand == 0) {  // starts at its knee, else at its share
                const uint32_t knee = knee_units(mif->knee());
                st.demand = knee ? knee : std::clamp<uint32_t>(uint32_t(std::lround(s.share * n)), 1, n);
                st.last = mif->share_counters();
                st.at = std::chrono::steady_clock::now();
            }
            tuned.emplace_back(mif.get(), st.demand);
        } else {
            place(*mif, std::clamp<uint32_t>(uint32_t(std::lround(s.share * n)), 1, n));
        }
    }
    std::vector<uint32_t> demands;
    for (const auto& [mif, d] : tuned) demands.push_back(d);
    const std::vector<uint32_t> got = max_min_fair(demands, used >= n ? 0 : n - used);
    for (size_t i = 0; i < tuned.size(); ++i) {
        _tuning[tuned[i].first->name()].units = got[i];
        place(*tuned[i].first, got[i]);
    }
}

// GSLICE's self-tuning: every tuned IF's window since the last round becomes a step of its
// demand (share_step), and the demands are placed again. A step moves 1/16 of the device (at
// least one unit), so a GPU with a hundred SMs converges in as many rounds as a small one.
void if_manager::tune_shares() {
    const uint32_t n = share_units();
    const auto now = std::chrono::steady_clock::now();
    bool changed = false;
    for (const auto& [name, mif] : _models) {
        const auto it = _tuning.find(name);
        if (it == _tuning.end()) continue;
        share_tuning& st = it->second;
        const model_if::share_totals c = mif->share_counters();
        share_window w;
        w.seconds = std::chrono::duration<double>(now - st.at).count();
        w.arrived = c.arrived - st.last.arrived;
        w.answered = c.answered - st.last.answered;
        w.late = c.late - st.last.late;
        const uint64_t batches = c.be_batches - st.last.be_batches;
        w.service_ms = batches ? double(c.be_busy_ns - st.last.be_busy_ns) / 1e6 / double(batches) : 0;
        w.busy = w.seconds > 0 ? double(c.be_busy_ns - st.last.be_busy_ns) / 1e9 / w.seconds : 0;
        w.queued = c.queued;
        w.slo_ms = mif->settings().batching.slo_ms;
        st.last = c;
        st.at = now;
        const int step = share_step(w);
        const uint32_t size = std::max<uint32_t>(1, n / 16);
        const uint32_t demand = step > 0   ? std::min(n, st.demand + size)
                                : step < 0 ? std::max<uint32_t>(1, st.demand > size ? st.demand - size : 1)
                                           : st.demand;
        changed |= demand != st.demand;
        st.demand = demand;
    }
    if (!changed) return;
    std::map<std::string, uint32_t> before;
    for (const auto& [name, st] : _tuning) before[name] = st.units;
    place_shares();
    for (const auto& [name, st] : _tuning)
        if (before[name] != st.units)
            event({{"event", "share_changed"}, {"name", name}, {"units", st.units}, {"demand", st.demand},
                   {"share", double(st.units) / n}});
}

void if_manager::profile(model_if& mif, const std::string& name, bool keep, model_if::prepared_settings* change) {
    if (!(_info.profile_budget_ms > 0)) return;
    dkp::model_profile stored, out;
    out.device = _info.backend;
    bool have = false;
    if (_repo && _repo->contains(name)) {
        const std::string text = _repo->load_profile(name);
        if (!text.empty()) {
            try {
                stored = dkp::model_profile::parse(text);
                have = stored.device == _info.backend;  // another device's profile is recomputed
            } catch (const std::exception&) {
                have = false;  // a damaged profile is measured again
            }
        }
    }
    // Each launch alone, as a BE task through the scheduler: RT traffic on the other IFs
    // preempts profiling; a preempted measurement is taken again. A knee measurement binds
    // the task to the units of the share it measures.
    const auto run_on = [this](std::vector<gpu::task_launch> launches, uint64_t units) {
        double us = 0;
        for (int attempt = 0; attempt < 3; ++attempt) {
            gpu::task t;
            t.cls = gpu::task_class::be;
            t.units = units;
            t.launches = launches;
            const gpu::task_result r = _scheduler.wait(_scheduler.submit(std::move(t)));
            if (r.status != gpu::task_status::completed) throw std::runtime_error("a profiling task did not complete");
            us = double(r.end_ns - r.start_ns) / 1e3;
            if (r.preemptions == 0) break;
        }
        return us;
    };
    const auto run_alone = [&run_on](std::vector<gpu::task_launch> launches) { return run_on(std::move(launches), 0); };
    if (change) {
        // Only the change's new instances are measured (on the side); the repository keeps
        // the profiles of the plans the IF had as well.
        mif.profile(*change, have ? &stored : nullptr, run_alone, _info.profile_budget_ms, out);
        if (have && !change->model)  // a replaced model's plans are gone
            for (const dkp::plan_profile& p : stored.plans)
                if (!out.find(p.plan, p.key)) out.put(p);
    } else {
        mif.profile(have ? &stored : nullptr, run_alone, _info.profile_budget_ms, out);
    }
    // The knee, where shares can be placed: on the IF's largest batch (a change's, when it
    // plans a larger one; the IF's stays otherwise).
    if (_runtime.device().has_unit_sets()) {
        dkp::knee_curve knee = mif.measure_knee(change, have ? &stored.knee : nullptr, run_on, share_units(),
                                                _info.profile_budget_ms);
        if (!knee.points.empty()) {
            out.knee = knee;
            if (change) change->knee = std::move(knee);
            else mif.set_knee(std::move(knee));
        } else {
            out.knee = mif.knee();  // kept as it was
        }
    }
    if (keep && _repo && _repo->contains(name)) {
        try {
            _repo->save_profile(name, out.to_json());
        } catch (const std::exception&) {
            // The profile is an optimisation: measured again at the next start.
        }
    }
}

if_manager::loaded_model if_manager::load_model_file(const std::string& name, const std::string& onnx,
                                                    const model_settings& settings,
                                                    const std::vector<std::vector<int64_t>>& sizes) {
    // The file's size is checked before it is read, and it must fit the budget on its own:
    // importing holds at least its bytes.
    struct stat st {};
    if (::stat(onnx.c_str(), &st) != 0) throw control_error("bad_model", "no such model file: " + onnx);
    if (!S_ISREG(st.st_mode))
        throw control_error("bad_model", onnx + " is " + ml::file_type_name(st.st_mode) + ", not a regular file");
    const uint64_t file_size = uint64_t(st.st_size);
    if (file_size <= _info.max_model_file_bytes)
        admit({file_size, 0}, "model '" + name + "': reading " + onnx + " needs " + format_byte_size(double(file_size)));
    loaded_model out;
    out.file = read_model_file(onnx, _info.max_model_file_bytes);
    const model_file& file = out.file;

    // Share the weights of a loaded copy of the same file, or import it; then the footprint of
    // everything the IF will allocate, from the graph and its plans, before any of it is.
    out.key = std::make_pair(file.hash, uint64_t(file.bytes.size()));
    std::shared_ptr<ml::model> model;
    if (auto it = _loaded.find(out.key); it != _loaded.end()) model = it->second.lock();
    const std::string label = "model '" + name + "' (" + onnx + ")";
    std::optional<ml::graph> imported;
    ml::memory_footprint need;
    std::vector<int64_t> lengths;
    try {
        if (!model)
            imported = ml::import_onnx_buffer(file.bytes.data(), file.bytes.size(), model_if::import_options(), onnx);
        lengths = model_if::planned_lengths(model_if::request_input(model ? model->imported() : *imported, settings));
        need = model ? _runtime.footprint(*model, sizes, model_if::segments_per_request, lengths)
                     : _runtime.footprint(*imported, sizes, model_if::segments_per_request, lengths);
    } catch (const std::exception& e) {
        throw control_error("bad_model", label + ": " + e.what());
    }
    // The file's bytes stay in memory until the entry is stored in the repository. Where the
    // device has memory of its own, the weights and arenas are there and the host holds the
    // host copy, the upload buffer and the file (the instances' inputs regions, host-mapped,
    // are counted on the device side with their arenas).
    const uint64_t peak = uint64_t(need.peak_bytes()) + file.bytes.size();
    const memory_use peak_use = _info.device_memory_budget_bytes
                                    ? memory_use{uint64_t(need.host_bytes + need.staging_bytes) + file.bytes.size(),
                                                 uint64_t(need.weight_bytes + need.instance_bytes())}
                                    : memory_use{peak, 0};
    std::string needs = label + " needs " + format_byte_size(double(peak)) + ": ";
    if (model)
        needs += "weights shared with a loaded IF of the same file, ";
    else
        needs += "weights " + format_byte_size(double(need.weight_bytes)) + " (+ " + format_byte_size(double(need.host_bytes)) +
                 " host copy), ";
    needs += "arenas " + format_byte_size(double(need.instance_bytes())) + " for batch sizes " + sizes_text(sizes) +
             (lengths.empty() ? "" : " at sequence lengths " + sizes_text({lengths})) +
             ", while loading the file " + format_byte_size(double(file.bytes.size()));
    if (!model) needs += " and the upload buffer " + format_byte_size(double(need.staging_bytes));
    admit(peak_use, needs);
    try {
        if (!model) model = _runtime.load_graph(std::move(*imported), fs::path(onnx).filename().string());
    } catch (const std::exception& e) {
        throw control_error("bad_model", label + ": " + e.what());
    }
    out.model = std::move(model);
    return out;
}

json if_manager::add_model(const json& f, bool persist) {
    std::lock_guard<std::recursive_mutex> g(_ops_mu);
    if (!f.is_object()) bad("add_model fields must be an object");
    check_fields(f, "add_model", {add_only_fields, tunable_fields});
    const std::string name = get_string(f, "name");
    static const std::regex name_re("[A-Za-z0-9_.-]{1,64}");
    if (!std::regex_match(name, name_re) || name == "." || name == "..")
        bad("field 'name' must be 1-64 characters of A-Z a-z 0-9 _ . -, got \"" + excerpt(name) + "\"");
    const uint16_t port = uint16_t(get_int(f, "port", 1, 65535));
    if (_models.count(name)) throw control_error("model_exists", "a model IF named '" + name + "' is already loaded");
    for (const auto& s : _services)
        if (s->binding().udp_port == port)
            throw control_error("port_in_use", "UDP port " + std::to_string(port) + " is taken by IF '" + s->name() + "'");

    model_if_config c;
    c.name = name;
    c.udp_port = port;
    if (field(f, "onnx")) {
        c.onnx = get_string(f, "onnx");
    } else if (_repo && _repo->contains(name)) {
        c.onnx = _repo->entry(name).onnx.string();
    } else {
        bad("field 'onnx' is missing and the repository has no entry '" + name + "'");
    }
    apply_settings(f, c.settings);
    check_share(c.settings);
    if (field(f, "top_k")) c.top_k = uint32_t(get_int(f, "top_k", 1, 100));
    if (field(f, "mean")) {
        const auto m = get_triple(f, "mean");
        std::copy(m.begin(), m.end(), c.mean);
    }
    if (field(f, "std")) {
        const auto s = get_triple(f, "std");
        for (float v : s)
            if (v == 0) bad("field 'std' must not hold zeros");
        std::copy(s.begin(), s.end(), c.std);
    }
    c.slot = free_slot();

    loaded_model l = load_model_file(name, c.onnx, c.settings, model_if::initial_instances(c.settings));
    c.model_key = l.file.hash;  // abacus::model_key: the predictor's key
    std::shared_ptr<model_if> mif;
    try {
        mif = std::make_shared<model_if>(_plane, _runtime, _scheduler, c, l.model);
    } catch (const std::exception& e) {
        throw control_error("bad_model", "model '" + name + "' (" + c.onnx + "): " + e.what());
    }
    _loaded[l.key] = l.model;
    const model_file& file = l.file;

    if (persist && _repo) {
        try {
            const fs::path stored = _repo->save(name, persisted_config(*mif), c.onnx, file.bytes);
            c.onnx = stored.string();
        } catch (const std::exception& e) {
            throw control_error("io_error", std::string("model repository: ") + e.what());
        }
    }
    // Kernel profiles before the port is published (the repository's when they match).
    try {
        profile(*mif, name, true);  // kept when the model is in the repository (added or loaded from it)
    } catch (const std::exception& e) {
        throw control_error("internal_error", "model '" + name + "': profiling: " + e.what());
    }
    {
        std::lock_guard<std::mutex> t(_tables_mu);
        _models[name] = mif;
        _services.push_back(mif);
    }
    place_shares();  // before it serves: its first batch runs inside its share
    replace_serving(_services);  // the serving thread polls it from now on...
    publish_bindings();          // ...and only then does the data plane fill its ring
    event({{"event", "model_loaded"}, {"name", name}, {"udp_port", port},
           {"class", c.settings.cls == gpu::task_class::rt ? "rt" : "be"}});
    return describe(*mif);
}

json if_manager::remove_model(const std::string& name) {
    std::lock_guard<std::recursive_mutex> g(_ops_mu);
    std::shared_ptr<model_if> mif = find(name);
    // Unpublish first: once publish() returns no rx lcore can put another request on the
    // IF's ring. Then the serving thread drains what is there.
    {
        std::lock_guard<std::mutex> t(_tables_mu);
        std::erase(_services, std::static_pointer_cast<dp::if_service>(mif));
    }
    publish_bindings();
    // responses_sent counts every answer that went out, results and errors alike.
    const uint64_t before = mif->counters().responses_sent.get();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!mif->idle() && !_serving_stopped.load() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    replace_serving(_services);
    if (!mif->idle()) mif->fail_pending();  // drain timed out (or serving stopped)
    const uint64_t answered = mif->counters().responses_sent.get() - before;
    {
        std::lock_guard<std::mutex> t(_tables_mu);
        _models.erase(name);
    }
    place_shares();
    mif.reset();  // ~model_if waits for a batch in flight
    if (_repo && _repo->contains(name)) {
        try {
            _repo->remove(name);
        } catch (const std::exception& e) {
            throw control_error("io_error", std::string("model repository: ") + e.what());
        }
    }
    event({{"event", "model_removed"}, {"name", name}});
    return {{"name", name}, {"answered_while_draining", answered}};
}

json if_manager::set(const json& f) {
    std::lock_guard<std::recursive_mutex> g(_ops_mu);
    static constexpr const char* set_only_fields[] = {"name", "onnx"};
    check_fields(f, "set", {set_only_fields, tunable_fields});
    const std::string name = get_string(f, "name");
    std::shared_ptr<model_if> mif = find(name);
    model_settings s = mif->settings();
    apply_settings(f, s);
    check_share(s);
    std::optional<loaded_model> replacement;
    if (field(f, "onnx")) {
        // A new version of the model: every batch size the IF plans, on the new weights, admitted
        // beside what the IF holds now (both are held until the switch-over).
        replacement = load_model_file(name, get_string(f, "onnx"), s, mif->instances_to_plan(s, true));
    } else if (const std::vector<std::vector<int64_t>> sizes = mif->instances_to_plan(s); !sizes.empty()) {
        // New batch sizes (a larger max_batch, a lane that was not planned) are new instances.
        int64_t need = 0;
        try {
            need = _runtime.footprint(*mif->model(), sizes, model_if::segments_per_request,
                                      model_if::planned_lengths(mif->input()))
                       .instance_bytes();
        } catch (const std::exception& e) {
            bad(std::string("cannot plan the new batch sizes: ") + e.what());
        }
        admit({0, uint64_t(need)}, "model '" + name + "' needs " + format_byte_size(double(need)) +
                                  " more for arenas of batch sizes " + sizes_text(sizes));
    }
    // The new instances are planned, warmed up and profiled on the side while the IF goes on
    // serving (GSLICE's shadow IF); the switch-over between two batches holds it for
    // microseconds.
    model_if::prepared_settings change;
    try {
        change = mif->prepare(s, replacement ? replacement->model : nullptr);
    } catch (const std::invalid_argument& e) {
        if (replacement) throw control_error("bad_model", "model '" + name + "' (" + get_string(f, "onnx") + "): " + e.what());
        bad(e.what());
    } catch (const std::exception& e) {
        if (!replacement) throw;
        throw control_error("bad_model", "model '" + name + "' (" + get_string(f, "onnx") + "): " + e.what());
    }
    const bool stored = _repo && _repo->contains(name);
    if (replacement) {
        _loaded[replacement->key] = replacement->model;
        change.onnx = stored ? _repo->entry(name).onnx.string() : get_string(f, "onnx");
        change.model_key = replacement->file.hash;
    }
    if (!change.instances.empty()) profile(*mif, name, true, &change);  // the new plans
    mif->commit(std::move(change));
    place_shares();
    if (replacement)
        event({{"event", "model_replaced"}, {"name", name}, {"onnx", get_string(f, "onnx")}});
    if (stored) {
        try {
            if (replacement) _repo->save(name, persisted_config(*mif), get_string(f, "onnx"), replacement->file.bytes);
            else _repo->save_config(name, persisted_config(*mif));
        } catch (const std::exception& e) {
            throw control_error("io_error", std::string("model repository: ") + e.what());
        }
    }
    return describe(*mif);
}

json if_manager::describe(const model_if& mif) const {
    json d = mif.describe();
    if (const auto it = _tuning.find(mif.name()); it != _tuning.end()) {
        // A tuned IF's share is what the tuner gave it last.
        d["share"] = double(it->second.units) / share_units();
        d["share_demand"] = double(it->second.demand) / share_units();
    }
    const auto& m = mif.model();
    const int64_t instances = mif.memory_bytes();
    // The weights are shared when another IF serves the same loaded model.
    bool shared = false;
    for (const auto& [other, o] : _models) shared |= o.get() != &mif && o->model() == m;
    d["memory"] = {{"weight_bytes", m->weight_bytes()},
                   {"host_bytes", m->host_bytes()},
                   {"instance_bytes", instances},
                   {"shared_weights", shared},
                   {"total_bytes", m->weight_bytes() + m->host_bytes() + instances}};
    return d;
}

if_manager::tables if_manager::snapshot() const {
    std::lock_guard<std::mutex> t(_tables_mu);
    return {_services, _models};
}

std::vector<std::string> if_manager::load_repository() {
    std::vector<std::string> problems;
    if (!_repo) return problems;
    for (const auto& e : _repo->entries(problems)) {
        try {
            add_model(e.config, false);
        } catch (const control_error& err) {
            problems.push_back(e.name + ": " + err.code + ": " + err.what());
        }
    }
    return problems;
}

json if_manager::list() const {
    json models = json::array();
    for (const auto& [name, mif] : snapshot().models) {
        json d = mif->describe();
        json summary;
        for (const char* k : {"name", "udp_port", "class", "input_format", "output", "slo_ms", "batching", "batch_size",
                              "min_batch", "max_batch", "priority", "state", "requests_total", "responses_total"})
            summary[k] = d[k];
        models.push_back(summary);
    }
    return {{"models", models}};
}

json if_manager::health() const {
    const size_t models = snapshot().models.size();
    rte_eth_link link{};
    rte_eth_link_get_nowait(_plane.eth().id(), &link);
    json h = {{"status", _shutdown.load() ? "stopping" : "ok"},
              {"version", _info.version},
              {"uptime_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - _start).count()},
              {"backend", _info.backend},
              {"policy", _info.policy},
              {"dkp", _info.dkp ? "on" : "off"},
              {"models", models},
              {"memory", memory_json()},
              {"units", units_json()},
              {"port", {{"id", _plane.eth().id()}, {"driver", _plane.eth().driver()}, {"link_up", link.link_status != 0}}}};
    if (!_info.abacus.is_null()) h["abacus"] = _info.abacus;  // policy abacus: its predictor
    return h;
}

json if_manager::memory_json() const {
    const memory_use use = memory_in_use();
    const uint64_t used = use.host, budget = _info.memory_budget_bytes;
    json m = {{"used_bytes", used}, {"max_model_file_bytes", _info.max_model_file_bytes}};
    if (const uint64_t device = _info.device_memory_budget_bytes)
        m["device"] = {{"budget_bytes", device},
                       {"used_bytes", use.device},
                       {"free_bytes", device > use.device ? device - use.device : 0},
                       {"free_at_start_bytes", _info.device_memory_free_at_start}};
    m["budget_bytes"] = budget ? json(budget) : json(nullptr);
    m["budget_source"] = _info.memory_budget_source;
    if (!_info.memory_available.empty()) m["available_at_start"] = _info.memory_available;
    m["free_bytes"] = budget ? json(budget > used ? budget - used : 0) : json(nullptr);
    return m;
}

// The device's spatial shares: how they are made, whether binding works here, and every set
// served on the whole device instead (fallbacks), so that a share that does not hold shows.
json if_manager::units_json() const {
    gpu::device& dev = _runtime.device();
    if (!dev.has_unit_sets()) return {{"mechanism", "none"}, {"usable", false}, {"why", "this backend has no spatial shares"}};
    const gpu::unit_shares_info i = dev.unit_shares();
    json u = {{"mechanism", i.mechanism}, {"usable", i.usable},    {"step", i.step},
              {"binds", i.binds},         {"fallbacks", i.fallbacks}, {"partitions", i.partitions}};
    if (!i.why.empty()) u["why"] = i.why;
    return u;
}

json if_manager::stats(const std::string& only) const {
    const tables t = snapshot();
    if (!only.empty() && std::none_of(t.services.begin(), t.services.end(), [&](const auto& s) { return s->name() == only; }))
        throw control_error("unknown_model", "no model IF named " + in_quotes(only));
    json ifs = json::array();
    for (const auto& s : t.services) {
        if (!only.empty() && s->name() != only) continue;
        if (auto it = t.models.find(s->name()); it != t.models.end() && it->second == s) {
            ifs.push_back(it->second->stats());
        } else {
            const dp::if_counters& c = s->counters();
            if_stats v;
            v.requests_total = c.requests_served.get();
            v.responses_total = c.responses_sent.get();
            v.errors_total = c.error_responses.get();
            v.send_failures_total = c.responses_failed.get();
            v.queue_depth = s->queued();
            json all;
            v.add_to(all);
            json f = {{"name", s->name()}, {"udp_port", s->binding().udp_port}, {"class", "builtin"}};
            for (std::string_view key : builtin_if_stat_keys) f[std::string(key)] = all[std::string(key)];
            ifs.push_back(std::move(f));
        }
    }
    const rte_eth_stats ps = _plane.eth().stats();
    const dp::counter_snapshot c = _plane.counters();
    json drops = json::object();
    for (size_t i = 0; i < dp::drop_reason_count; ++i) drops[std::string(dp::drop_reason_names[i])] = c.drops[i];
    const gpu::scheduler_stats ss = _scheduler.stats();
    const rte_mempool* rx_pool = _plane.eth().rx_pool();
    const rte_mempool* tx_pool = _plane.eth().tx_pool();
    return {{"uptime_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - _start).count()},
            {"ifs", ifs},
            {"port",
             {{"id", _plane.eth().id()}, {"driver", _plane.eth().driver()}, {"rx_packets", ps.ipackets},
              {"rx_bytes", ps.ibytes}, {"tx_packets", ps.opackets}, {"tx_bytes", ps.obytes}, {"rx_missed", ps.imissed},
              {"rx_errors", ps.ierrors}, {"tx_errors", ps.oerrors}, {"rx_nombuf", ps.rx_nombuf},
              // Pool occupancy: a count that keeps rising under steady traffic is a leak long
              // before the exit check would report it.
              {"rx_mbufs", rx_pool->size}, {"rx_mbufs_in_use", rte_mempool_in_use_count(rx_pool)},
              {"tx_mbufs", tx_pool->size}, {"tx_mbufs_in_use", rte_mempool_in_use_count(tx_pool)}}},
            {"dataplane",
             {
#define X(name, help) {#name, c.name},
                 REEFLINE_RX_COUNTERS(X) REEFLINE_TX_COUNTERS(X)
#undef X
                     {"drops", drops}}},
            {"units", units_json()},
            {"scheduler",
             {{"policy", _info.policy}, {"submitted", ss.submitted}, {"completed_rt", ss.completed_rt},
              {"completed_be", ss.completed_be}, {"preemptions", ss.preemptions}, {"restores", ss.restores},
              {"reexecuted_kernels", ss.reexecuted_kernels}, {"dkp", dkp_json()},
              {"abacus",
               {{"groups", ss.abacus_groups}, {"groups_by_profile", ss.abacus_by_profile}, {"dropped", ss.abacus_dropped},
                {"predicted_seconds", ss.abacus_predicted_us / 1e6}, {"measured_seconds", ss.abacus_measured_us / 1e6}}}}}};
}

json if_manager::dkp_json() const {
    const gpu::scheduler_stats ss = _scheduler.stats();
    json d = {{"enabled", ss.padding}, {"padded_launches", ss.padded_launches}, {"pads_issued", ss.pads_issued}};
    gpu::device& dev = _runtime.device();
    if (dev.pads_launches()) {
        const auto c = dev.padding_stats();
        d["pads_completed"] = c.pads_completed;
        d["pads_cut"] = c.pads_cut;
        d["pads_skipped"] = c.pads_skipped;
        d["pad_blocks"] = c.pad_blocks;
    }
    json le = json::array(), counts = json::array();
    uint64_t cumulative = 0;
    for (size_t b = 0; b < std::size(gpu::select_ns_buckets); ++b) {
        cumulative += ss.select_ns_hist[b];
        le.push_back(double(gpu::select_ns_buckets[b]) / 1e9);
        counts.push_back(cumulative);
    }
    d["selection_seconds"] = {{"le", le}, {"counts", counts}, {"sum", double(ss.select_ns_sum) / 1e9}, {"count", ss.select_count}};
    return d;
}

void if_manager::add_if_counters(dp::counter_snapshot& s) const {
    for (const auto& f : snapshot().services) s.add(f->counters());
}

void if_manager::tick() {
    std::lock_guard<std::recursive_mutex> g(_ops_mu);
    tune_shares();
    for (const auto& [name, mif] : _models) {
        const json s = mif->stats();
        const uint64_t v = s["slo_violations_total"].get<uint64_t>() + s["shed_total"].get<uint64_t>() +
                           s["deadline_exceeded_total"].get<uint64_t>();
        uint64_t& last = _last_violations[name];
        if (v > last)
            event({{"event", "slo_violation"}, {"name", name}, {"violations", v - last}, {"p99_ms", s["latency_ms"]["p99"]}});
        last = v;
    }
    const dp::counter_snapshot c = _plane.counters();
    if (_last_drops.size() != dp::drop_reason_count) _last_drops.assign(dp::drop_reason_count, 0);
    for (size_t i = 0; i < dp::drop_reason_count; ++i) {
        if (c.drops[i] > _last_drops[i])
            event({{"event", "drops_rising"}, {"reason", std::string(dp::drop_reason_names[i])},
                   {"count", c.drops[i] - _last_drops[i]}});
        _last_drops[i] = c.drops[i];
    }
}

json if_manager::dispatch(const json& r) {
    if (!r.is_object()) bad("a request must be a JSON object");
    const json* v = field(r, "v");
    if (!v) bad("missing field 'v' (schema version; this daemon speaks 1)");
    if (!v->is_number_integer() || v->get<int64_t>() != schema_version)
        throw control_error("unsupported_version",
                            "schema version " + excerpt(serialise(*v)) + " is not supported (this daemon speaks 1)");
    const std::string op = get_string(r, "op");
    static constexpr const char* name_only[] = {"name"};
    const auto takes = [&](std::initializer_list<std::span<const char* const>> allowed) { check_fields(r, op, allowed); };
    if (op == "health" || op == "list" || op == "shutdown") takes({});
    if (op == "health") return health();
    if (op == "list") return list();
    if (op == "stats") {
        takes({name_only});
        return stats(field(r, "name") ? get_string(r, "name") : "");
    }
    if (op == "describe") {
        takes({name_only});
        std::lock_guard<std::recursive_mutex> g(_ops_mu);
        return describe(*find(get_string(r, "name")));
    }
    if (op == "shutdown") {
        request_shutdown();
        return {{"stopping", true}};
    }
    if (op != "add_model" && op != "remove_model" && op != "set")
        throw control_error("unknown_op", "unknown operation " + in_quotes(op) +
                                              " (known: health, list, describe, stats, add_model, remove_model, set, shutdown)");
    if (_shutdown.load()) throw control_error("shutting_down", "the daemon is stopping");
    if (op == "add_model") return add_model(r, true);
    if (op == "remove_model") {
        takes({name_only});
        return remove_model(get_string(r, "name"));
    }
    return set(r);
}

json if_manager::handle(const json& request) {
    try {
        return {{"v", schema_version}, {"ok", true}, {"result", dispatch(request)}};
    } catch (const control_error& e) {
        return reply_error(e.code, e.what());
    } catch (const std::exception& e) {
        return reply_error("internal", e.what());
    }
}

std::string if_manager::error_text(const std::string& code, const std::string& message) {
    return serialise(reply_error(code, message), unserialisable_reply);
}

std::string if_manager::handle_message(std::string_view message) {
    try {
        if (message.size() > max_request_bytes)
            return error_text("bad_request", "message of " + std::to_string(message.size()) + " bytes exceeds the limit of " +
                                                 std::to_string(max_request_bytes) + " bytes");
        json request;
        try {
            request = bounded_parse(message);
        } catch (const json_refused& e) {
            return error_text("bad_request", e.what());
        }
        return serialise(handle(request), unserialisable_reply);
    } catch (...) {
        return std::string(unserialisable_reply);
    }
}

uint32_t if_manager::serve() {
    const uint64_t gen = _list_gen.load(std::memory_order_acquire);
    if (gen != _seen_gen) {
        std::lock_guard<std::mutex> g(_list_mu);
        _serving = _list;
        _seen_gen = _list_gen.load(std::memory_order_relaxed);
        _served_gen.store(_seen_gen, std::memory_order_release);
    }
    uint32_t work = 0;
    for (const auto& s : _serving) work += s->poll();
    work += _plane.poll_tx();
    return work;
}

bool if_manager::quiet() const {
    if (_plane.tx_pending() > 0) return false;
    for (const auto& s : _serving) {
        if (s->queued() > 0) return false;
        if (auto* m = dynamic_cast<const model_if*>(s.get()); m && !m->idle()) return false;
    }
    return true;
}

void if_manager::fail_pending() {
    for (const auto& s : _serving)
        if (auto* m = dynamic_cast<model_if*>(s.get())) m->fail_pending();
}

}  // namespace reefline::ifm
