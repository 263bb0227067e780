#include "tools/reefctl/client.h"

#include <sys/stat.h>
#include <unistd.h>

#include <zmq.hpp>

#include <atomic>
#include <cerrno>
#include <optional>
#include <utility>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "ifmanager/bounded_json.h"

namespace reefline::reefctl {

namespace {

// One context for the process: contexts own I/O threads, and `watch` calls every second.
// Every socket is closed (linger 0) before call() returns, so terminating it at exit is quick.
zmq::context_t& context() {
    static zmq::context_t ctx{1};
    return ctx;
}

// Replies are small JSON objects (a stats reply of every IF is tens of kB); the bound keeps a
// misdirected or hostile endpoint from making us allocate without limit.
constexpr int64_t max_reply_bytes = 16ll << 20;

// At most this much of a reply is quoted in an error message.
constexpr size_t quoted_reply_bytes = 200;

std::string hint(const std::string& endpoint) {
    return "is reefline running (reefline --control " + endpoint + ")?";
}

// Local failures; their messages may quote what an endpoint sent.
[[noreturn]] void fail(const char* code, const std::string& message) {
    throw control_error(code, printable(message), false);
}

// The checks that tell "no daemon" from "daemon not answering" before anything is sent: for
// ipc:// the socket file must exist, be a socket, and be writable (connect(2) on a Unix socket
// needs write permission, and ZeroMQ would otherwise just retry quietly until the timeout).
void check_ipc_endpoint(const std::string& endpoint) {
    const std::string path = ipc_path(endpoint);
    if (path.empty()) return;
    struct stat st{};
    if (::stat(path.c_str(), &st) != 0) {
        if (errno == ENOENT)
            fail(local_code::no_daemon,
                 "no daemon at " + endpoint + " (" + path + " does not exist): " + hint(endpoint));
        fail(local_code::no_daemon, "cannot reach " + endpoint + ": " + path + ": " +
                                        std::strerror(errno));
    }
    if (!S_ISSOCK(st.st_mode))
        fail(local_code::no_daemon,
             "no daemon at " + endpoint + " (" + path + " is not a socket): " + hint(endpoint));
    if (::access(path.c_str(), W_OK) != 0)
        fail(local_code::no_daemon, "cannot connect to " + endpoint + ": " + path + ": " +
                                        std::strerror(errno) +
                                        " (run reefctl as a user allowed to use the socket)");
}

}  // namespace

std::string printable(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    for (const char c : text) {
        const auto u = static_cast<unsigned char>(c);
        out += u < 0x20 && c != '\n' && c != '\t' ? '?' : u == 0x7f ? '?' : c;
    }
    return out;
}

std::string ipc_path(const std::string& endpoint) {
    constexpr std::string_view scheme = "ipc://";
    if (endpoint.compare(0, scheme.size(), scheme) != 0) return {};
    std::string path = endpoint.substr(scheme.size());
    if (path.empty() || path.front() == '@') return {};
    return path;
}

std::string default_endpoint() {
    if (const char* env = std::getenv("REEFLINE_CONTROL"); env && *env) return env;
    struct stat st{};
    if (::stat(ipc_path(builtin_endpoint).c_str(), &st) != 0 &&
        ::stat(ipc_path(fallback_endpoint).c_str(), &st) == 0 && S_ISSOCK(st.st_mode))
        return fallback_endpoint;
    return builtin_endpoint;
}

nlohmann::json parse_reply(const std::string& endpoint, const std::string& text) {
    using ifm::excerpt;
    nlohmann::json reply;
    try {
        reply = ifm::bounded_parse(text);
    } catch (const ifm::json_refused& e) {
        fail(local_code::bad_reply, "the reply from " + endpoint + " is " + e.what() + ": '" +
                                        printable(excerpt(text, quoted_reply_bytes)) + "'");
    }
    const auto shown = [&](const nlohmann::json& v) { return printable(excerpt(ifm::serialise(v), quoted_reply_bytes)); };
    if (!reply.is_object())
        fail(local_code::bad_reply, "the reply from " + endpoint + " is not a JSON object: " + shown(reply));
    // A reply without "v" is accepted (nothing else could be meant), one with another version
    // is not: its fields may mean something else.
    if (auto v = reply.find("v"); v != reply.end() && *v != schema_version)
        fail(local_code::bad_reply, "the reply from " + endpoint + " has schema version " + shown(*v) +
                                        "; reefctl speaks version " + std::to_string(schema_version));
    const auto ok = reply.find("ok");
    if (ok == reply.end() || !ok->is_boolean())
        fail(local_code::bad_reply, "the reply from " + endpoint + " has no boolean \"ok\": " + shown(reply));
    if (ok->get<bool>()) {
        const auto result = reply.find("result");
        if (result == reply.end() || result->is_null()) return nlohmann::json::object();
        if (!result->is_object())
            fail(local_code::bad_reply,
                 "the reply from " + endpoint + " has a \"result\" that is not an object: " + shown(*result));
        return *result;
    }
    const auto error = reply.find("error");
    if (error == reply.end() || !error->is_object() || !error->contains("code") || !(*error)["code"].is_string())
        fail(local_code::bad_reply, "the reply from " + endpoint + " reports an error without a code: " + shown(reply));
    const auto message = error->find("message");
    throw control_error(printable(excerpt((*error)["code"].get<std::string>(), 64)),
                        message != error->end() && message->is_string()
                            ? printable(excerpt(message->get<std::string>(), max_message_bytes))
                            : std::string("(no message)"),
                        true);
}

nlohmann::json call(const std::string& endpoint, const nlohmann::json& request, int timeout_ms,
                    const curve_client_keys* curve) {
    if (timeout_ms < 1) timeout_ms = 1;
    check_ipc_endpoint(endpoint);

    nlohmann::json req = request;
    if (req.is_object() && !req.contains("v")) req["v"] = schema_version;
    // A path or name that is not UTF-8 cannot travel in JSON: its bad bytes become U+FFFD and
    // the daemon names the file it could not find.
    const std::string text = ifm::serialise(req);

    using clock = std::chrono::steady_clock;
    const auto deadline = clock::now() + std::chrono::milliseconds(timeout_ms);
    const std::string no_reply = "no reply from " + endpoint + " within " +
                                 std::to_string(timeout_ms) + " ms: " + hint(endpoint);
    try {
        zmq::socket_t socket(context(), zmq::socket_type::req);
        socket.set(zmq::sockopt::linger, 0);
        socket.set(zmq::sockopt::sndtimeo, timeout_ms);
        socket.set(zmq::sockopt::maxmsgsize, max_reply_bytes);
        // A failed handshake (a refused CURVE key, CURVE on one side only) is silent on a REQ
        // socket (libzmq reconnects and tries again): a monitor reports it so that a wrong key
        // reads as one, not as a dead daemon.
        std::optional<zmq::socket_t> monitor;
        if (curve) {
            for (const auto& [opt, key] : {std::pair{ZMQ_CURVE_SERVERKEY, &curve->server_public},
                                           std::pair{ZMQ_CURVE_PUBLICKEY, &curve->public_key},
                                           std::pair{ZMQ_CURVE_SECRETKEY, &curve->secret_key}})
                if (zmq_setsockopt(socket.handle(), opt, key->c_str(), key->size()) != 0)
                    fail(local_code::auth, std::string("CURVE key rejected by ZeroMQ: ") + zmq_strerror(zmq_errno()));
        }
        static std::atomic<unsigned> monitors{0};
        const std::string mon = "inproc://reefctl-monitor-" + std::to_string(monitors++);
        if (zmq_socket_monitor(socket.handle(), mon.c_str(),
                               ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                   ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_CONNECTED |
                                   ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_DISCONNECTED) == 0) {
            monitor.emplace(context(), zmq::socket_type::pair);
            monitor->set(zmq::sockopt::linger, 0);
            monitor->connect(mon);
        }
        // libzmq's I/O thread sends monitor events with a blocking send, and a PAIR socket with
        // no peer blocks: were our end closed while the socket still reports (a reconnect after
        // a refusal), that thread, and every later call of this process, would hang. Monitoring
        // stops before our end closes (destruction runs in reverse order of declaration).
        struct stop_monitoring {
            void* socket;
            ~stop_monitoring() { zmq_socket_monitor(socket, nullptr, 0); }
        } const stop_monitor_first{socket.handle()};
        socket.connect(endpoint);
        if (!socket.send(zmq::buffer(text), zmq::send_flags::none))
            fail(local_code::no_reply, no_reply);

        // A CURVE server may close the connection before its ERROR command is flushed (libzmq
        // does not wait for it), so a refusal can also arrive as connections that are closed
        // before their handshake completes: each is a refusal too, and two in a row are not a
        // daemon restarting under us.
        bool connected = false;
        int closed_in_handshake = 0;
        const auto refused = [&](bool told_auth) {
            const char* why =
                !curve ? "does the daemon use CURVE? then give --curve-server-key and --curve-key"
                : told_auth ? "the daemon refused this client's key: is its public key in the daemon's "
                              "--curve-clients list?"
                            : "is --curve-server-key the daemon's public key, is this client's key in the "
                              "daemon's --curve-clients list, and does the daemon use CURVE?";
            fail(local_code::auth, "the handshake with " + endpoint + " failed (" + why + ")");
        };
        for (;;) {
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                deadline - clock::now());
            if (left.count() <= 0) fail(local_code::no_reply, no_reply);
            zmq::pollitem_t items[2] = {{socket.handle(), 0, ZMQ_POLLIN, 0},
                                        {monitor ? monitor->handle() : nullptr, 0, ZMQ_POLLIN, 0}};
            zmq::poll(items, monitor ? 2 : 1, left);
            // Every monitor event is two parts: (event id, value), then the endpoint.
            zmq::message_t event, address;
            while (monitor && monitor->recv(event, zmq::recv_flags::dontwait)) {
                if (event.more()) (void)monitor->recv(address, zmq::recv_flags::dontwait);
                uint16_t id = 0;
                if (event.size() >= 2) std::memcpy(&id, event.data(), 2);
                switch (id) {
                case ZMQ_EVENT_CONNECTED: connected = true; break;
                case ZMQ_EVENT_HANDSHAKE_SUCCEEDED: connected = false; closed_in_handshake = 0; break;
                case ZMQ_EVENT_DISCONNECTED:
                    if (connected && ++closed_in_handshake >= 2) refused(false);
                    connected = false;
                    break;
                case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH: refused(true); break;  // refused() throws
                default: refused(false); break;  // the handshake failed for a protocol reason
                }
            }
            if (!(items[0].revents & ZMQ_POLLIN)) continue;
            zmq::message_t msg;
            if (!socket.recv(msg, zmq::recv_flags::dontwait)) continue;
            return parse_reply(endpoint, msg.to_string());
        }
    } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) fail(local_code::interrupted, "interrupted");
        fail(local_code::transport, "cannot use endpoint " + endpoint + ": " + e.what());
    }
}

}  // namespace reefline::reefctl
