// The control plane's ZeroMQ side (docs/control.md): a REP socket that hands each request to
// the IF manager and sends its reply, and a PUB socket (endpoint + ".events") for events. Both
// live on one thread (ZeroMQ sockets are not thread-safe), which also runs the manager's
// once-a-second tick.
#pragma once

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "ifmanager/manager.h"

namespace reefline::ifm {

struct control_options {
    std::string endpoint;        // ipc://PATH or tcp://127.0.0.1:PORT
    // CURVE (both or neither): the server's Z85 secret key and the Z85 public keys of the
    // clients allowed in (checked by a ZAP handler on the control thread). Encrypts and
    // authenticates both sockets; allows tcp:// beyond loopback.
    std::string curve_secret;
    std::vector<std::string> curve_clients;
};

// The largest message part the transport receives (ZMQ_MAXMSGSIZE); see control_server.
inline constexpr size_t transport_max_message_bytes = size_t(16) << 20;

// The default endpoint: /run/reefline when it can be created, else /tmp.
std::string default_control_endpoint();

class control_server {
public:
    // Binds both sockets; throws std::runtime_error with the reason (bad endpoint, non-loopback
    // tcp without CURVE, a secret key without client keys, another daemon already answering
    // there, bind failure).
    control_server(if_manager& manager, const control_options& options);
    ~control_server();  // stop()
    void stop();
    const std::string& endpoint() const { return _endpoint; }
    const std::string& events_endpoint() const { return _events_endpoint; }

private:
    void run();
    void answer_request();
    void answer_zap();

    if_manager& _manager;
    std::string _endpoint, _events_endpoint;
    void* _context = nullptr;
    void* _rep = nullptr;
    void* _pub = nullptr;
    void* _zap = nullptr;  // ZAP handler (CURVE only)
    std::vector<std::string> _curve_clients;  // public keys allowed in (32 bytes each)
    uint64_t _auth_refused = 0;
    std::string _ipc_path;
    std::atomic<bool> _stop{false};
    std::thread _thread;
};

}  // namespace reefline::ifm
