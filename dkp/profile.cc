#include "dkp/profile.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace reefline::dkp {

using json = nlohmann::json;

namespace {

json plan_json(const plan_profile& p) {
    json launches = json::array();
    for (const kernel_profile& k : p.launches)
        launches.push_back({{"kernel", k.kernel},
                            {"node", k.node},
                            {"time_us", k.time_us},
                            {"blocks", k.blocks},
                            {"threads", k.threads},
                            {"registers", k.registers},
                            {"shared_bytes", k.shared_bytes},
                            {"occupancy", k.occupancy}});
    return {{"plan", p.plan}, {"key", p.key}, {"launches", launches}};
}

std::string text(const json& j, const char* key, const std::string& where) {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_string()) throw std::invalid_argument(where + ": \"" + key + "\" missing or not a string");
    return *it;
}

template <typename T>
T number(const json& j, const char* key, const std::string& where, T max) {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() < 0 ||
        it->get<double>() > double(max))
        throw std::invalid_argument(where + ": \"" + key + "\" missing or not a number in 0.." + std::to_string(max));
    return it->get<T>();
}

plan_profile parse_plan(const json& j, const std::string& where) {
    if (!j.is_object()) throw std::invalid_argument(where + ": not an object");
    plan_profile p;
    p.plan = text(j, "plan", where);
    p.key = text(j, "key", where);
    const auto l = j.find("launches");
    if (l == j.end() || !l->is_array()) throw std::invalid_argument(where + ": \"launches\" missing or not an array");
    if (l->size() > 100000) throw std::invalid_argument(where + ": more than 100000 launches");
    for (size_t i = 0; i < l->size(); ++i) {
        const json& e = (*l)[i];
        const std::string at = where + " launch " + std::to_string(i);
        if (!e.is_object()) throw std::invalid_argument(at + ": not an object");
        kernel_profile k;
        k.kernel = text(e, "kernel", at);
        if (e.contains("node")) k.node = text(e, "node", at);
        k.time_us = number<double>(e, "time_us", at, 3.6e9);
        k.blocks = number<uint32_t>(e, "blocks", at, UINT32_MAX);
        k.occupancy = number<uint32_t>(e, "occupancy", at, 1u << 16);
        if (e.contains("threads")) k.threads = number<uint32_t>(e, "threads", at, 1u << 16);
        if (e.contains("registers")) k.registers = number<uint32_t>(e, "registers", at, 1u << 16);
        if (e.contains("shared_bytes")) k.shared_bytes = number<uint32_t>(e, "shared_bytes", at, 1u << 30);
        p.launches.push_back(std::move(k));
    }
    return p;
}

json knee_json(const knee_curve& k) {
    json points = json::array();
    for (const share_point& p : k.points) points.push_back({{"units", p.units}, {"ms", p.ms}});
    return {{"plan", k.plan}, {"key", k.key}, {"batch", k.batch}, {"device_units", k.device_units}, {"points", points}};
}

knee_curve parse_knee(const json& j) {
    const std::string where = "profile knee";
    if (!j.is_object()) throw std::invalid_argument(where + ": not an object");
    knee_curve k;
    k.plan = text(j, "plan", where);
    k.key = text(j, "key", where);
    k.batch = number<uint32_t>(j, "batch", where, 1u << 16);
    k.device_units = number<uint32_t>(j, "device_units", where, 1u << 16);
    const auto p = j.find("points");
    if (p == j.end() || !p->is_array() || p->size() > 1024)
        throw std::invalid_argument(where + ": \"points\" missing or not an array of at most 1024");
    for (size_t i = 0; i < p->size(); ++i) {
        const std::string at = where + " point " + std::to_string(i);
        if (!(*p)[i].is_object()) throw std::invalid_argument(at + ": not an object");
        share_point s;
        s.units = number<uint32_t>((*p)[i], "units", at, k.device_units);
        s.ms = number<double>((*p)[i], "ms", at, 3.6e6);
        if (s.units == 0 || (!k.points.empty() && s.units <= k.points.back().units))
            throw std::invalid_argument(at + ": units must be positive and ascending");
        k.points.push_back(s);
    }
    return k;
}

}  // namespace

const plan_profile* model_profile::find(const std::string& plan, const std::string& key) const {
    for (const plan_profile& p : plans)
        if (p.plan == plan && p.key == key) return &p;
    return nullptr;
}

void model_profile::put(plan_profile p) {
    for (plan_profile& q : plans)
        if (q.plan == p.plan) {
            q = std::move(p);
            return;
        }
    plans.push_back(std::move(p));
}

std::string model_profile::to_json() const {
    json j;
    j["device"] = device;
    if (plans.size() == 1) {
        const json one = plan_json(plans[0]);
        for (auto it = one.begin(); it != one.end(); ++it) j[it.key()] = it.value();
    } else {
        json all = json::array();
        for (const plan_profile& p : plans) all.push_back(plan_json(p));
        j["plans"] = all;
    }
    if (!knee.points.empty()) j["knee"] = knee_json(knee);
    return j.dump(1) + "\n";
}

model_profile model_profile::parse(const std::string& text_in) {
    json j;
    try {
        j = json::parse(text_in);
    } catch (const json::exception& e) {
        throw std::invalid_argument(std::string("profile: not valid JSON: ") + e.what());
    }
    if (!j.is_object()) throw std::invalid_argument("profile: not a JSON object");
    model_profile m;
    m.device = text(j, "device", "profile");
    if (j.contains("plans")) {
        const json& all = j["plans"];
        if (!all.is_array()) throw std::invalid_argument("profile: \"plans\" is not an array");
        for (size_t i = 0; i < all.size(); ++i) m.plans.push_back(parse_plan(all[i], "profile plan " + std::to_string(i)));
    } else {
        m.plans.push_back(parse_plan(j, "profile"));
    }
    if (j.contains("knee")) m.knee = parse_knee(j["knee"]);
    return m;
}

std::string plan_key(const std::vector<std::pair<std::string, uint32_t>>& kernels_and_grids,
                     const std::vector<size_t>& args_sizes) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    const auto mix = [&](uint64_t v) {
        for (int i = 0; i < 8; ++i) {
            h ^= (v >> (8 * i)) & 0xff;
            h *= 1099511628211ull;
        }
    };
    for (const auto& [name, grid] : kernels_and_grids) {
        for (char c : name) mix(uint64_t(uint8_t(c)));
        mix(grid);
    }
    for (size_t a : args_sizes) mix(a);
    mix(kernels_and_grids.size());
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    return buf;
}

uint32_t occupancy(const gpu::kernel_info& k, const gpu::device_caps& caps) {
    if (!caps.gpu) return 1;
    constexpr uint32_t regs_per_sm = 65536, threads_per_sm = 2048, smem_per_sm = 228 * 1024, blocks_per_sm = 32;
    const uint32_t threads = std::max<uint32_t>(1, k.threads_per_block);
    uint32_t n = std::min(blocks_per_sm, threads_per_sm / threads);
    if (k.registers) n = std::min(n, regs_per_sm / (k.registers * threads));
    if (k.shared_bytes) n = std::min(n, smem_per_sm / k.shared_bytes);
    return std::max<uint32_t>(1, n);
}

}  // namespace reefline::dkp
