// The control plane's ZeroMQ side (docs/control.md): a REP socket that hands each request to
// the IF manager and sends its reply, and a PUB socket (endpoint + ".events") for events. Both
// live on one thread (ZeroMQ sockets are not thread-safe), which also runs the manager's
// once-a-second tick.
#pragma once

#include <atomic>
#include <string>
#include <thread>

#include "ifmanager/manager.h"

namespace reefline::ifm {

struct control_options {
    std::string endpoint;        // ipc://PATH or tcp://127.0.0.1:PORT
    std::string curve_secret;    // Z85 server secret key: allows tcp:// beyond loopback
};

// The default endpoint: /run/reefline when it can be created, else /tmp.
std::string default_control_endpoint();

class control_server {
public:
    // Binds both sockets; throws std::runtime_error with the reason (bad endpoint, non-loopback
    // tcp without CURVE, another daemon already answering there, bind failure).
    control_server(if_manager& manager, const control_options& options);
    ~control_server();  // stop()
    void stop();
    const std::string& endpoint() const { return _endpoint; }
    const std::string& events_endpoint() const { return _events_endpoint; }

private:
    void run();

    if_manager& _manager;
    std::string _endpoint, _events_endpoint;
    void* _context = nullptr;
    void* _rep = nullptr;
    void* _pub = nullptr;
    std::string _ipc_path;
    std::atomic<bool> _stop{false};
    std::thread _thread;
};

}  // namespace reefline::ifm
