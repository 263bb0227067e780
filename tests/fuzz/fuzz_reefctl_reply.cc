// libFuzzer target: reefctl's reply parser and renderers (tools/reefctl/client.h, render.h).
// Invariant: a reply is a result object or a control_error, and every renderer turns any
// result into text without throwing and without control characters but newline and tab.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tools/reefctl/client.h"
#include "tools/reefctl/render.h"

namespace rc = reefline::reefctl;

namespace {

void check_printable(const std::string& text, const char* what) {
    for (const char c : text)
        if ((static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') || c == 0x7f) {
            std::fprintf(stderr, "fuzz_reefctl_reply: %s printed control character 0x%02x\n", what, c);
            std::abort();
        }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string reply(reinterpret_cast<const char*>(data), size);
    nlohmann::json result;
    try {
        result = rc::parse_reply("ipc:///fuzz", reply);
    } catch (const rc::control_error& e) {
        check_printable(e.what(), "an error message");
        check_printable(e.code(), "an error code");
        return 0;
    }
    if (!result.is_object()) std::abort();
    check_printable(rc::render_list(result), "render_list");
    check_printable(rc::render_describe(result), "render_describe");
    check_printable(rc::render_health(result), "render_health");
    check_printable(rc::render_stats(result), "render_stats");
    check_printable(rc::render_watch("ipc:///fuzz", result, result, 1.0, 1.0), "render_watch");
    return 0;
}
