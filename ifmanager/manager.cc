#include "ifmanager/manager.h"

#include <arpa/inet.h>
#include <rte_ethdev.h>
#include <rte_mempool.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

namespace reefline::ifm {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int schema_version = 1;
constexpr size_t max_message_bytes = 1u << 20;

[[noreturn]] void bad(const std::string& message) { throw control_error("bad_request", message); }

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
    bad("field 'class' must be \"rt\" or \"be\", got \"" + s + "\"");
}

std::array<float, 3> get_triple(const json& o, const char* key) {
    const json* v = field(o, key);
    if (!v->is_array() || v->size() != 3) bad(std::string("field '") + key + "' must be an array of 3 numbers");
    std::array<float, 3> t{};
    for (size_t i = 0; i < 3; ++i) {
        if (!(*v)[i].is_number()) bad(std::string("field '") + key + "' must be an array of 3 numbers");
        t[i] = (*v)[i].get<float>();
        if (!std::isfinite(t[i])) bad(std::string("field '") + key + "' must hold finite numbers");
    }
    return t;
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
        if (!ml::parse_batching_policy(p, s.batching.policy))
            bad("field 'batching' must be \"slab\", \"aimd\" or \"fixed\", got \"" + p + "\"");
    }
    if (field(f, "max_batch")) s.batching.max_batch = uint32_t(get_int(f, "max_batch", 1, 256));
    if (field(f, "min_batch")) s.batching.min_batch = uint32_t(get_int(f, "min_batch", 1, 256));
    if (field(f, "fixed_batch")) s.batching.fixed_batch = uint32_t(get_int(f, "fixed_batch", 0, 256));
    if (s.batching.min_batch > s.batching.max_batch) bad("min_batch must not exceed max_batch");
    if (s.batching.fixed_batch > s.batching.max_batch) bad("fixed_batch must not exceed max_batch");
    if (field(f, "priority")) s.priority = int(get_int(f, "priority", 0, 2));
    if (field(f, "shed")) s.shed = get_bool(f, "shed");
    if (field(f, "rt_sources")) {
        const json& v = f["rt_sources"];
        if (!v.is_array()) bad("field 'rt_sources' must be an array of IPv4 addresses");
        s.rt_sources_be.clear();
        for (const auto& a : v) {
            uint32_t be = 0;
            if (!a.is_string() || inet_pton(AF_INET, a.get<std::string>().c_str(), &be) != 1)
                bad("field 'rt_sources': " + a.dump() + " is not an IPv4 address");
            s.rt_sources_be.push_back(be);
        }
    }
}

// FNV-1a over the file: the key that lets a second IF of the same model share its weights.
uint64_t file_hash(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    if (!in) throw control_error("bad_model", "cannot read " + p.string());
    uint64_t h = 1469598103934665603ull;
    char buf[1 << 16];
    while (in) {
        in.read(buf, sizeof buf);
        for (std::streamsize i = 0; i < in.gcount(); ++i) h = (h ^ uint8_t(buf[i])) * 1099511628211ull;
    }
    return h;
}

json reply_error(const std::string& code, const std::string& message) {
    return {{"v", schema_version}, {"ok", false}, {"error", {{"code", code}, {"message", message}}}};
}

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
    if (it == _models.end()) throw control_error("unknown_model", "no model IF named '" + name + "'");
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
    _services.push_back(std::move(s));
    replace_serving(_services);
    publish_bindings();
}

json if_manager::add_model(const json& f, bool persist) {
    std::lock_guard<std::recursive_mutex> g(_ops_mu);
    if (!f.is_object()) bad("add_model fields must be an object");
    const std::string name = get_string(f, "name");
    static const std::regex name_re("[A-Za-z0-9_.-]{1,64}");
    if (!std::regex_match(name, name_re) || name == "." || name == "..")
        bad("field 'name' must be 1-64 characters of A-Z a-z 0-9 _ . -, got \"" + name + "\"");
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
    std::error_code ec;
    if (!fs::is_regular_file(c.onnx, ec)) throw control_error("bad_model", "no such model file: " + c.onnx);
    apply_settings(f, c.settings);
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

    // Load (or share the weights of a loaded copy of the same file), plan, warm up.
    const uint64_t hash = file_hash(c.onnx);
    std::shared_ptr<ml::model> shared;
    if (auto it = _loaded.find(hash); it != _loaded.end()) shared = it->second.lock();
    std::shared_ptr<model_if> mif;
    try {
        mif = std::make_shared<model_if>(_plane, _runtime, _scheduler, c, shared);
    } catch (const std::exception& e) {
        throw control_error("bad_model", "model '" + name + "' (" + c.onnx + "): " + e.what());
    }
    _loaded[hash] = mif->model();

    json fields = f;
    fields.erase("v");
    fields.erase("op");
    fields["onnx"] = c.onnx;
    if (persist && _repo) {
        try {
            const fs::path stored = _repo->save(name, fields, c.onnx);
            fields["onnx"] = stored.string();
        } catch (const std::exception& e) {
            throw control_error("io_error", std::string("model repository: ") + e.what());
        }
    }
    _model_fields[name] = fields;
    _models[name] = mif;
    _services.push_back(mif);
    replace_serving(_services);  // the serving thread polls it from now on...
    publish_bindings();          // ...and only then does the data plane fill its ring
    event({{"event", "model_loaded"}, {"name", name}, {"udp_port", port},
           {"class", c.settings.cls == gpu::task_class::rt ? "rt" : "be"}});
    return mif->describe();
}

json if_manager::remove_model(const std::string& name) {
    std::lock_guard<std::recursive_mutex> g(_ops_mu);
    std::shared_ptr<model_if> mif = find(name);
    // Unpublish first: once publish() returns no rx lcore can put another request on the
    // IF's ring. Then the serving thread drains what is there.
    std::erase(_services, std::static_pointer_cast<dp::if_service>(mif));
    publish_bindings();
    const uint64_t before = mif->counters().responses_sent.get() + mif->counters().error_responses.get();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!mif->idle() && !_serving_stopped.load() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    replace_serving(_services);
    if (!mif->idle()) mif->fail_pending();  // drain timed out (or serving stopped)
    const uint64_t answered = mif->counters().responses_sent.get() + mif->counters().error_responses.get() - before;
    _models.erase(name);
    _model_fields.erase(name);
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
    const std::string name = get_string(f, "name");
    std::shared_ptr<model_if> mif = find(name);
    for (const char* k : {"onnx", "port", "top_k", "mean", "std"})
        if (field(f, k)) bad(std::string("field '") + k + "' cannot be changed by set: remove and add the model");
    model_settings s = mif->settings();
    apply_settings(f, s);
    try {
        mif->update(s);
    } catch (const std::invalid_argument& e) {
        bad(e.what());
    }
    json& stored = _model_fields[name];
    for (const auto& [k, v] : f.items())
        if (k != "v" && k != "op" && k != "name") stored[k] = v;
    if (_repo && _repo->contains(name)) {
        try {
            _repo->save_config(name, stored);
        } catch (const std::exception& e) {
            throw control_error("io_error", std::string("model repository: ") + e.what());
        }
    }
    return mif->describe();
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
    std::lock_guard<std::recursive_mutex> g(_ops_mu);
    json models = json::array();
    for (const auto& [name, mif] : _models) {
        json d = mif->describe();
        json summary;
        for (const char* k : {"name", "udp_port", "class", "slo_ms", "batching", "batch_size", "min_batch", "max_batch",
                              "priority", "state", "requests_total", "responses_total"})
            summary[k] = d[k];
        models.push_back(summary);
    }
    return {{"models", models}};
}

json if_manager::health() const {
    std::lock_guard<std::recursive_mutex> g(_ops_mu);
    rte_eth_link link{};
    rte_eth_link_get_nowait(_plane.eth().id(), &link);
    return {{"status", _shutdown.load() ? "stopping" : "ok"},
            {"version", _info.version},
            {"uptime_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - _start).count()},
            {"backend", _info.backend},
            {"policy", _info.policy},
            {"models", _models.size()},
            {"port", {{"id", _plane.eth().id()}, {"driver", _plane.eth().driver()}, {"link_up", link.link_status != 0}}}};
}

json if_manager::stats(const std::string& only) const {
    std::lock_guard<std::recursive_mutex> g(_ops_mu);
    if (!only.empty()) find(only);
    json ifs = json::array();
    for (const auto& s : _services) {
        if (!only.empty() && s->name() != only) continue;
        if (auto it = _models.find(s->name()); it != _models.end() && it->second == s) {
            ifs.push_back(it->second->stats());
        } else {
            const dp::if_counters& c = s->counters();
            ifs.push_back({{"name", s->name()},
                           {"udp_port", s->binding().udp_port},
                           {"class", "builtin"},
                           {"requests_total", c.requests_served.get()},
                           {"responses_total", c.responses_sent.get()},
                           {"errors_total", c.error_responses.get()},
                           {"send_failures_total", c.responses_failed.get()},
                           {"queue_depth", s->queued()}});
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
#define X(name) {#name, c.name},
                 REEFLINE_RX_COUNTERS(X) REEFLINE_TX_COUNTERS(X)
#undef X
                     {"drops", drops}}},
            {"scheduler",
             {{"policy", _info.policy}, {"submitted", ss.submitted}, {"completed_rt", ss.completed_rt},
              {"completed_be", ss.completed_be}, {"preemptions", ss.preemptions}, {"restores", ss.restores},
              {"reexecuted_kernels", ss.reexecuted_kernels}}}};
}

void if_manager::add_if_counters(dp::counter_snapshot& s) const {
    std::lock_guard<std::recursive_mutex> g(_ops_mu);
    for (const auto& f : _services) s.add(f->counters());
}

void if_manager::tick() {
    std::lock_guard<std::recursive_mutex> g(_ops_mu);
    for (const auto& [name, mif] : _models) {
        const json s = mif->stats();
        const uint64_t v = s["slo_violations_total"].get<uint64_t>() + s["shed_total"].get<uint64_t>();
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
        throw control_error("unsupported_version", "schema version " + v->dump() + " is not supported (this daemon speaks 1)");
    const std::string op = get_string(r, "op");
    if (op == "health") return health();
    if (op == "list") return list();
    if (op == "stats") return stats(field(r, "name") ? get_string(r, "name") : "");
    if (op == "describe") {
        std::lock_guard<std::recursive_mutex> g(_ops_mu);
        return find(get_string(r, "name"))->describe();
    }
    if (op == "shutdown") {
        request_shutdown();
        return {{"stopping", true}};
    }
    if (_shutdown.load()) throw control_error("shutting_down", "the daemon is stopping");
    if (op == "add_model") return add_model(r, true);
    if (op == "remove_model") return remove_model(get_string(r, "name"));
    if (op == "set") return set(r);
    throw control_error("unknown_op", "unknown operation '" + op +
                                          "' (known: health, list, describe, stats, add_model, remove_model, set, shutdown)");
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

std::string if_manager::handle_message(std::string_view message) {
    if (message.size() > max_message_bytes)
        return reply_error("bad_request", "message of " + std::to_string(message.size()) + " bytes exceeds the 1 MiB limit").dump();
    json request;
    try {
        request = json::parse(message);
    } catch (const std::exception& e) {
        return reply_error("bad_request", std::string("not JSON: ") + e.what()).dump();
    }
    // dump() with replacement: a model name from the request may hold invalid UTF-8.
    return handle(request).dump(-1, ' ', false, json::error_handler_t::replace);
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
