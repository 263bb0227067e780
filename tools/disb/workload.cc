#include "tools/disb/workload.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace reefline::disb {

namespace {

// The five models of REEF's DISB (BERT as the zoo's sequence classifier).
const char* const models5[] = {"resnet50", "vgg19", "densenet201", "inception_v3", "bert"};

client_spec rt(const std::string& name, const std::string& model, pattern p, double util) {
    client_spec c;
    c.name = name;
    c.model = model;
    c.rt = true;
    c.arrivals = p;
    c.utilisation = util;
    return c;
}

client_spec be(const std::string& name, const std::string& model) {
    client_spec c;
    c.name = name;
    c.model = model;
    c.arrivals = pattern::closed;
    return c;
}

void add_be5(workload& w) {
    for (int i = 0; i < 5; ++i) w.clients.push_back(be("be" + std::to_string(i), models5[i]));
}

pattern parse_pattern(const std::string& s, const std::string& where) {
    if (s == "uniform") return pattern::uniform;
    if (s == "poisson") return pattern::poisson;
    if (s == "closed") return pattern::closed;
    if (s == "trace") return pattern::trace;
    if (s == "camera") return pattern::camera;
    throw std::invalid_argument(where + ": pattern '" + s + "' (uniform, poisson, closed, trace or camera)");
}

bool parse_class(const std::string& s, const std::string& where) {
    if (s == "rt") return true;
    if (s == "be") return false;
    throw std::invalid_argument(where + ": class '" + s + "' (rt or be)");
}

double number(const std::string& s, const std::string& where) {
    size_t used = 0;
    double v = 0;
    try {
        v = std::stod(s, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    if (used != s.size() || !std::isfinite(v) || v < 0) throw std::invalid_argument(where + ": '" + s + "' is not a number >= 0");
    return v;
}

void check(const workload& w, const std::string& path) {
    if (w.clients.empty()) throw std::invalid_argument(path + ": no client");
    if (w.clients.size() > 64) throw std::invalid_argument(path + ": more than 64 clients");
    for (const client_spec& c : w.clients) {
        if (c.model.empty()) throw std::invalid_argument(path + ": client '" + c.name + "' has no model");
        if (c.arrivals == pattern::trace && c.trace.empty())
            throw std::invalid_argument(path + ": client '" + c.name + "' has an empty trace");
        if ((c.arrivals == pattern::uniform || c.arrivals == pattern::poisson || c.arrivals == pattern::camera) &&
            !(c.rate > 0) && !(c.utilisation > 0))
            throw std::invalid_argument(path + ": client '" + c.name + "' needs a rate or a utilisation");
        if (c.rate > 100000) throw std::invalid_argument(path + ": client '" + c.name + "': more than 100000 requests/s");
    }
}

}  // namespace

const char* pattern_name(pattern p) {
    switch (p) {
    case pattern::uniform: return "uniform";
    case pattern::poisson: return "poisson";
    case pattern::closed: return "closed";
    case pattern::trace: return "trace";
    case pattern::camera: return "camera";
    }
    return "?";
}

const std::vector<std::string>& builtin_names() {
    static const std::vector<std::string> n{"A", "B", "C", "D", "E", "REAL"};
    return n;
}

workload builtin(const std::string& name) {
    workload w;
    w.name = name;
    // RT utilisation as REEF's rates gave on its GPU: VGG-19 at 100 req/s, ~40%.
    constexpr double a_util = 0.4;
    if (name == "A" || name == "B") {
        w.clients.push_back(rt("rt0", "vgg19", pattern::uniform, name == "A" ? a_util : 2.2 * a_util));
        w.clients.push_back(be("be0", "resnet50"));
    } else if (name == "C") {
        w.clients.push_back(rt("rt0", "vgg19", pattern::uniform, a_util));
        add_be5(w);
    } else if (name == "D" || name == "E") {
        for (int i = 0; i < 5; ++i)
            w.clients.push_back(rt("rt" + std::to_string(i), models5[i], name == "D" ? pattern::uniform : pattern::poisson,
                                   a_util / 5));
        add_be5(w);
    } else if (name == "REAL") {
        // A perception stack (synthetic): a front camera at 30 Hz, two side cameras at 20 Hz,
        // a rear one at 10 Hz and a cabin sensor at 15 Hz; frames jitter by +-10% of their
        // period and now and then arrive in bursts of three. Relative rates as named; the
        // absolute ones scale with the device (their utilisations add up to 40%).
        const std::pair<const char*, double> cams[] = {
            {"resnet50", 30}, {"densenet201", 20}, {"inception_v3", 20}, {"vgg19", 10}, {"bert", 15}};
        double hz = 0;
        for (const auto& [m, f] : cams) hz += f;
        int i = 0;
        for (const auto& [m, f] : cams) {
            client_spec c = rt("cam" + std::to_string(i++), m, pattern::camera, a_util * f / hz);
            c.rate = f;  // the camera's own rate (--scale 1); --scale auto rescales it
            w.clients.push_back(c);
        }
        add_be5(w);
    } else {
        throw std::invalid_argument("unknown workload '" + name + "' (A, B, C, D, E, REAL or a .csv/.json file)");
    }
    return w;
}

workload from_file(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw std::invalid_argument("cannot open workload file " + path);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    if (text.size() > (16u << 20)) throw std::invalid_argument(path + ": over 16 MiB");
    workload w;
    w.name = path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
    const bool json = path.size() >= 5 && path.substr(path.size() - 5) == ".json";
    if (json) {
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(text);
        } catch (const nlohmann::json::exception& e) {
            throw std::invalid_argument(path + ": not valid JSON: " + e.what());
        }
        if (!j.is_object() || !j.contains("clients") || !j["clients"].is_array())
            throw std::invalid_argument(path + ": expected {\"clients\": [...]}");
        int n = 0;
        for (const auto& c : j["clients"]) {
            const std::string where = path + ": client " + std::to_string(n++);
            if (!c.is_object()) throw std::invalid_argument(where + ": not an object");
            const auto str = [&](const char* k, const char* def) {
                if (!c.contains(k)) {
                    if (def) return std::string(def);
                    throw std::invalid_argument(where + ": \"" + k + "\" missing");
                }
                if (!c[k].is_string()) throw std::invalid_argument(where + ": \"" + k + "\" is not a string");
                return c[k].get<std::string>();
            };
            client_spec s;
            s.name = str("name", ("c" + std::to_string(n - 1)).c_str());
            s.model = str("model", nullptr);
            s.rt = parse_class(str("class", nullptr), where);
            s.arrivals = parse_pattern(str("pattern", "closed"), where);
            const auto num = [&](const char* k) {
                if (!c[k].is_number() || !std::isfinite(c[k].get<double>()) || c[k].get<double>() < 0)
                    throw std::invalid_argument(where + ": \"" + k + "\" is not a number >= 0");
                return c[k].get<double>();
            };
            if (c.contains("rate")) s.rate = num("rate");
            if (c.contains("utilisation")) s.utilisation = num("utilisation");
            if (c.contains("trace")) {
                if (!c["trace"].is_array() || c["trace"].size() > 10'000'000)
                    throw std::invalid_argument(where + ": \"trace\" is not an array of times");
                for (const auto& t : c["trace"]) {
                    if (!t.is_number() || !std::isfinite(t.get<double>()) || t.get<double>() < 0)
                        throw std::invalid_argument(where + ": a trace time is not a number >= 0");
                    s.trace.push_back(t.get<double>());
                }
                std::sort(s.trace.begin(), s.trace.end());
            }
            w.clients.push_back(std::move(s));
        }
    } else {
        std::istringstream lines(text);
        std::string line;
        for (int n = 1; std::getline(lines, line); ++n) {
            if (line.empty() || line[0] == '#') continue;
            const std::string where = path + ":" + std::to_string(n);
            std::vector<std::string> f;
            std::stringstream ls(line);
            for (std::string x; std::getline(ls, x, ',');) {
                x.erase(0, x.find_first_not_of(" \t\r"));
                x.erase(x.find_last_not_of(" \t\r") + 1);
                f.push_back(x);
            }
            if (f.size() == 5 && f[0] == "client") continue;  // a header line
            if (f.size() != 5) throw std::invalid_argument(where + ": expected client,model,class,pattern,value");
            client_spec s;
            s.name = f[0];
            s.model = f[1];
            s.rt = parse_class(f[2], where);
            s.arrivals = parse_pattern(f[3], where);
            if (s.arrivals == pattern::trace) {
                std::stringstream ts(f[4]);
                for (std::string t; ts >> t;) s.trace.push_back(number(t, where));
                std::sort(s.trace.begin(), s.trace.end());
            } else if (s.arrivals != pattern::closed) {
                if (!f[4].empty() && f[4][0] == 'u') s.utilisation = number(f[4].substr(1), where);
                else s.rate = number(f[4], where);
            }
            w.clients.push_back(std::move(s));
        }
    }
    check(w, path);
    return w;
}

std::vector<double> arrivals(const client_spec& c, double seconds, uint64_t seed) {
    std::vector<double> t;
    uint64_t h = seed;
    for (char ch : c.name) h = h * 1099511628211ull + uint8_t(ch);
    std::mt19937_64 rng(h);
    std::uniform_real_distribution<double> u(0, 1);
    switch (c.arrivals) {
    case pattern::closed: break;
    case pattern::trace:
        for (double x : c.trace)
            if (x < seconds) t.push_back(x);
        break;
    case pattern::uniform: {
        const double period = 1.0 / c.rate;
        for (double x = u(rng) * period; x < seconds; x += period) t.push_back(x);
        break;
    }
    case pattern::poisson: {
        std::exponential_distribution<double> gap(c.rate);
        for (double x = gap(rng); x < seconds; x += gap(rng)) t.push_back(x);
        break;
    }
    case pattern::camera: {
        const double period = 1.0 / c.rate;
        for (double x = u(rng) * period; x < seconds; x += period) {
            const double at = std::max(0.0, x + (u(rng) - 0.5) * 0.2 * period);
            t.push_back(at);
            if (u(rng) < 0.05)  // a burst: two more frames right behind
                for (int k = 1; k <= 2; ++k) t.push_back(at + 0.001 * k);
        }
        std::sort(t.begin(), t.end());
        t.erase(std::remove_if(t.begin(), t.end(), [&](double x) { return x >= seconds; }), t.end());
        break;
    }
    }
    return t;
}

}  // namespace reefline::disb
