// A small test harness for the GPU tests. Plain C++, no GoogleTest, so that the GPU
// tests also build on a GPU machine that has only a compiler and the GPU toolkit
// (-Dgpu_core=true, scripts/gpu-check). Exit status as meson reads it: 0 all passed, 1 some
// failed, 77 skipped (no GPU).
//
//   GPU_TEST(name) { EXPECT(a == b) << "context"; REQUIRE(ok); }
//   int main(int argc, char** argv) { return gpu_test::main(argc, argv, make_device_or_skip); }
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "preempt/gpu_device.h"

namespace gpu_test {

struct test_case {
    const char* name;
    void (*fn)();
};

inline std::vector<test_case>& registry() {
    static std::vector<test_case> r;
    return r;
}

inline bool add(const char* name, void (*fn)()) {
    registry().push_back({name, fn});
    return true;
}

struct state {
    int failures = 0;  // in the current test
    int reported = 0;
};
inline state& current() {
    static state s;
    return s;
}

struct fatal : std::exception {};

// Collects the message of one failed check and reports it when destroyed (after `<<`).
class failure {
public:
    failure(const char* file, int line, const char* what, bool fatal_) : _fatal(fatal_) {
        _msg << file << ":" << line << ": " << what;
    }
    ~failure() noexcept(false) {
        ++current().failures;
        if (current().reported++ < 30) std::printf("  FAIL %s\n", _msg.str().c_str());
        if (_fatal && !std::uncaught_exceptions()) throw fatal{};
    }
    template <typename T>
    failure& operator<<(const T& v) {
        if (!_started) {
            _msg << ": ";
            _started = true;
        }
        _msg << v;
        return *this;
    }

private:
    std::ostringstream _msg;
    bool _fatal;
    bool _started = false;
};

// Thrown to end a test as skipped (a feature this machine lacks).
struct skipped : std::exception {
    std::string why;
    explicit skipped(std::string w) : why(std::move(w)) {}
};

#define GPU_TEST(name)                                                    \
    static void name();                                                   \
    [[maybe_unused]] static const bool name##_registered = ::gpu_test::add(#name, name); \
    static void name()

// `switch (0) case 0: default:` keeps `if (x) EXPECT(y) << z; else ...` unambiguous (as GoogleTest).
#define EXPECT(cond)                 \
    switch (0)                       \
    case 0:                          \
    default:                         \
        if (cond) {                  \
        } else                       \
            ::gpu_test::failure(__FILE__, __LINE__, #cond, false)

#define REQUIRE(cond)                \
    switch (0)                       \
    case 0:                          \
    default:                         \
        if (cond) {                  \
        } else                       \
            ::gpu_test::failure(__FILE__, __LINE__, #cond, true)

#define SKIP_TEST(why) throw ::gpu_test::skipped(why)

// Run (last registered first) when main() ends, before static destructors: devices are
// released while the GPU runtime is still loaded.
inline std::vector<std::function<void()>>& at_end() {
    static std::vector<std::function<void()>> v;
    return v;
}

struct run_counts {
    int passed = 0, failed = 0, skipped = 0;
};

// Runs every registered test whose name contains `filter`, `label` before each name.
inline run_counts run_registered(const char* filter, const std::string& label = "") {
    run_counts n;
    for (const test_case& t : registry()) {
        if (!std::strstr(t.name, filter)) continue;
        std::printf("[ RUN  ] %s%s\n", label.c_str(), t.name);
        std::fflush(stdout);
        current() = state{};
        bool skip = false;
        try {
            t.fn();
        } catch (const fatal&) {
        } catch (const skipped& s) {
            skip = true;
            std::printf("  skipped: %s\n", s.why.c_str());
        } catch (const std::exception& e) {
            ++current().failures;
            std::printf("  FAIL exception: %s\n", e.what());
        }
        if (skip) {
            ++n.skipped;
            std::printf("[ SKIP ] %s%s\n", label.c_str(), t.name);
        } else if (current().failures) {
            ++n.failed;
            std::printf("[ FAIL ] %s%s (%d failed checks)\n", label.c_str(), t.name, current().failures);
        } else {
            ++n.passed;
            std::printf("[  OK  ] %s%s\n", label.c_str(), t.name);
        }
        std::fflush(stdout);
    }
    return n;
}

inline void run_at_end() {
    for (auto it = at_end().rbegin(); it != at_end().rend(); ++it) (*it)();
    at_end().clear();
}

// Runs every registered test whose name contains argv[1] (if given). `setup` returns false
// (after printing why) when the machine has no GPU: the binary then exits 77.
inline int main(int argc, char** argv, const std::function<bool()>& setup) {
    const char* filter = argc > 1 ? argv[1] : "";
    try {
        if (!setup()) return 77;
    } catch (const reefline::gpu::no_device_error& e) {
        std::printf("SKIP: %s\n", e.what());
        return 77;
    }
    const run_counts n = run_registered(filter);
    std::printf("gpu tests: %d passed, %d failed, %d skipped\n", n.passed, n.failed, n.skipped);
    std::fflush(stdout);
    run_at_end();
    return n.failed ? 1 : 0;
}

// |got - want| <= atol + rtol * scale, with NaN == NaN and equal infinities.
inline bool close(double got, double want, double rtol, double atol, double scale) {
    if (std::isnan(want)) return std::isnan(got);
    if (std::isinf(want)) return got == want;
    return std::fabs(got - want) <= atol + rtol * scale;
}

}  // namespace gpu_test
