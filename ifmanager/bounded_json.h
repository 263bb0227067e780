// JSON text in and out of the control plane (docs/control.md, "Limits"), shared by the daemon
// and reefctl: whatever arrives, parsing is bounded in nesting before anything walks the value
// recursively, and serialising never throws, so one hostile message (invalid UTF-8, a thousand
// nested arrays) cannot abort the process that reads it.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

namespace reefline::ifm {

// Nesting deeper than any request or reply of the schema (a describe reply is 3 deep).
inline constexpr size_t max_json_depth = 16;

// A text that bounded_parse() refuses; what() says why (not JSON, too deep).
struct json_refused : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The deepest nesting of arrays and objects in `text`, counted outside strings, scanning no
// further than the first point where it exceeds `limit` (so the scan is linear and
// allocation-free whatever the text holds). Meaningful for valid JSON; for anything else it
// is a bound that the parser's own error then supersedes.
inline size_t json_depth(std::string_view text, size_t limit) {
    size_t depth = 0, deepest = 0;
    bool in_string = false, escaped = false;
    for (const char c : text) {
        if (in_string) {
            if (escaped) escaped = false;
            else if (c == '\\') escaped = true;
            else if (c == '"') in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > deepest && (deepest = depth) > limit) return deepest;
        } else if ((c == ']' || c == '}') && depth > 0) {
            --depth;
        }
    }
    return deepest;
}

// At most `n` bytes of client text for an error message, cut on a UTF-8 character boundary,
// with "..." when cut: a message quoting what a client sent stays small.
inline std::string excerpt(std::string_view s, size_t n = 64) {
    if (s.size() <= n) return std::string(s);
    while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
    return std::string(s.substr(0, n)) + "...";
}

// Parses `text` when it nests at most max_json_depth deep; throws json_refused otherwise (the
// message names the depth or the parser's complaint, quoting at most a short excerpt).
inline nlohmann::json bounded_parse(std::string_view text) {
    if (const size_t d = json_depth(text, max_json_depth); d > max_json_depth)
        throw json_refused("JSON nested more than " + std::to_string(max_json_depth) + " levels deep");
    try {
        return nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        // The parser's message quotes the token it stopped at, which may be long.
        throw json_refused("not valid JSON: " + excerpt(e.what(), 240));
    }
}

// The one way replies, events and persisted configs become text: compact, invalid UTF-8 in
// any string replaced by U+FFFD, never throwing. `fallback` is returned if serialising fails
// all the same (out of memory).
inline std::string serialise(const nlohmann::json& value, std::string_view fallback = {}) noexcept {
    try {
        return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    } catch (...) {
        try {
            return std::string(fallback);
        } catch (...) {
            return {};
        }
    }
}

}  // namespace reefline::ifm
