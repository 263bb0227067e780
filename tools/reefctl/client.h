// reefctl's side of the control plane (docs/control.md, schema version 1): one JSON request,
// one JSON reply over a ZeroMQ REQ socket. Kept out of main.cc so that tests and other tools
// talk to the daemon through exactly the code the CLI uses.
#pragma once

#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>
#include <string_view>

namespace reefline::reefctl {

inline constexpr int schema_version = 1;
inline constexpr const char* builtin_endpoint = "ipc:///run/reefline/control.sock";
// Where the daemon binds when /run is not writable (docs/control.md).
inline constexpr const char* fallback_endpoint = "ipc:///tmp/reefline-control.sock";

// Codes reefctl itself reports; the daemon's codes (bad_request, unknown_model, ...) pass
// through unchanged in control_error::code().
namespace local_code {
inline constexpr const char* no_daemon = "no_daemon";    // the ipc socket file is absent
inline constexpr const char* no_reply = "no_reply";      // nothing came back within the timeout
inline constexpr const char* bad_reply = "bad_reply";    // the reply is not a version-1 envelope
inline constexpr const char* transport = "transport";    // ZeroMQ refused the endpoint or failed
inline constexpr const char* interrupted = "interrupted";  // a signal arrived while waiting
inline constexpr const char* auth = "auth";              // the CURVE handshake was refused
}  // namespace local_code

// A failed call: either the daemon's error reply (from_daemon() is true, code() is one of
// docs/control.md's codes) or a local failure (one of local_code). what() is the message alone.
class control_error : public std::runtime_error {
public:
    control_error(std::string code, const std::string& message, bool from_daemon)
        : std::runtime_error(message), _code(std::move(code)), _from_daemon(from_daemon) {}

    const std::string& code() const { return _code; }
    bool from_daemon() const { return _from_daemon; }

private:
    std::string _code;
    bool _from_daemon;
};

// CURVE keys of a client (docs/control.md, "Remote control with CURVE"), Z85 text, 40
// characters each: the daemon's public key and this client's own pair.
struct curve_client_keys {
    std::string server_public, public_key, secret_key;
};

// Sends `request` (a JSON object; "v" is added when absent) to `endpoint` and returns the
// reply's `result` object, or throws control_error. A fresh REQ socket with ZMQ_LINGER 0 is
// used for every call and closed before returning, so a dead or wedged daemon costs at most
// `timeout_ms` and never leaves the socket in the REQ state machine's "awaiting reply" state.
// With `curve`, the connection is encrypted and a refused handshake (a key the daemon does
// not know) fails at once with local_code::auth instead of waiting out the timeout.
nlohmann::json call(const std::string& endpoint, const nlohmann::json& request, int timeout_ms,
                    const curve_client_keys* curve = nullptr);

// Interprets one raw reply message; exposed so that the envelope rules can be tested alone.
// Whatever `reply` holds, returns the result object or throws control_error: bad_reply for
// anything that is not a version-1 envelope (not JSON, nested deeper than max_json_depth, a
// wrong type where the envelope needs one). Messages quote at most an excerpt of the reply,
// with control characters made visible.
nlohmann::json parse_reply(const std::string& endpoint, const std::string& reply);

// The longest error message from the daemon that reefctl prints in full.
inline constexpr size_t max_message_bytes = 2000;

// `text` with control characters (but newline and tab) replaced by '?': what a daemon sends
// cannot move the cursor or recolour the operator's terminal.
std::string printable(std::string_view text);

// The endpoint to use when none is given on the command line: $REEFLINE_CONTROL if set and
// non-empty, else the daemon's built-in default; when that socket file is absent but the
// daemon's /tmp fallback exists, the fallback (the daemon chose it because /run was not
// writable).
std::string default_endpoint();

// The filesystem path of an ipc:// endpoint, or "" for other transports and for abstract
// ("ipc://@name") sockets, which have no file to check.
std::string ipc_path(const std::string& endpoint);

}  // namespace reefline::reefctl
