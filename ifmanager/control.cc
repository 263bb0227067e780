#include "ifmanager/control.h"

#include <unistd.h>
#include <zmq.h>

#include <chrono>
#include <filesystem>
#include <stdexcept>
#include <vector>

namespace reefline::ifm {

namespace fs = std::filesystem;

namespace {

std::string zerr(const std::string& what) { return what + ": " + zmq_strerror(zmq_errno()); }

bool loopback_tcp(const std::string& ep) {
    for (const char* p : {"tcp://127.", "tcp://localhost:", "tcp://[::1]:"})
        if (ep.rfind(p, 0) == 0) return true;
    return false;
}

// Is a daemon already answering on this ipc endpoint? (A stale socket file is not one.)
bool answers(void* ctx, const std::string& ep) {
    void* s = zmq_socket(ctx, ZMQ_REQ);
    int zero = 0, timeout = 300;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    zmq_setsockopt(s, ZMQ_SNDTIMEO, &timeout, sizeof timeout);
    bool alive = false;
    if (zmq_connect(s, ep.c_str()) == 0) {
        const std::string req = R"({"v":1,"op":"health"})";
        char buf[16];
        alive = zmq_send(s, req.data(), req.size(), 0) >= 0 && zmq_recv(s, buf, sizeof buf, 0) >= 0;
    }
    zmq_close(s);
    return alive;
}

}  // namespace

std::string default_control_endpoint() {
    std::error_code ec;
    fs::create_directories("/run/reefline", ec);
    if (!ec && access("/run/reefline", W_OK) == 0) return "ipc:///run/reefline/control.sock";
    return "ipc:///tmp/reefline-control.sock";
}

control_server::control_server(if_manager& manager, const control_options& options)
    : _manager(manager), _endpoint(options.endpoint.empty() ? default_control_endpoint() : options.endpoint) {
    const bool ipc = _endpoint.rfind("ipc://", 0) == 0;
    const bool tcp = _endpoint.rfind("tcp://", 0) == 0;
    if (!ipc && !tcp) throw std::runtime_error("control endpoint '" + _endpoint + "': expected ipc://PATH or tcp://127.0.0.1:PORT");
    if (tcp && !loopback_tcp(_endpoint) && options.curve_secret.empty())
        throw std::runtime_error("control endpoint '" + _endpoint +
                                 "': tcp:// beyond loopback needs CURVE keys (--curve-secret-key)");
    _events_endpoint = _endpoint + ".events";
    if (tcp) {
        // tcp://HOST:PORT -> events on PORT + 1.
        const auto colon = _endpoint.find_last_of(':');
        try {
            _events_endpoint = _endpoint.substr(0, colon + 1) + std::to_string(std::stoi(_endpoint.substr(colon + 1)) + 1);
        } catch (const std::exception&) {
            throw std::runtime_error("control endpoint '" + _endpoint + "': no port number");
        }
    }
    _context = zmq_ctx_new();
    if (ipc) {
        _ipc_path = _endpoint.substr(6);
        std::error_code ec;
        if (fs::path(_ipc_path).has_parent_path()) fs::create_directories(fs::path(_ipc_path).parent_path(), ec);
        if (fs::exists(_ipc_path, ec) && answers(_context, _endpoint)) {
            zmq_ctx_term(_context);
            throw std::runtime_error("another reefline already answers on " + _endpoint);
        }
    }
    _rep = zmq_socket(_context, ZMQ_REP);
    _pub = zmq_socket(_context, ZMQ_PUB);
    int zero = 0;
    int64_t max_size = 16 << 20;  // larger ones are cut off; 1..16 MiB get an error reply
    zmq_setsockopt(_rep, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(_pub, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(_rep, ZMQ_MAXMSGSIZE, &max_size, sizeof max_size);
    if (!options.curve_secret.empty()) {
        int one = 1;
        for (void* s : {_rep, _pub})
            if (zmq_setsockopt(s, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
                zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, options.curve_secret.c_str(), options.curve_secret.size()) != 0) {
                const std::string e = zerr("CURVE secret key");
                zmq_close(_rep);
                zmq_close(_pub);
                zmq_ctx_term(_context);
                throw std::runtime_error(e);
            }
    }
    if (zmq_bind(_rep, _endpoint.c_str()) != 0 || zmq_bind(_pub, _events_endpoint.c_str()) != 0) {
        const std::string e = zerr("cannot bind " + _endpoint + " / " + _events_endpoint);
        zmq_close(_rep);
        zmq_close(_pub);
        zmq_ctx_term(_context);
        throw std::runtime_error(e);
    }
    _thread = std::thread([this] { run(); });
}

control_server::~control_server() { stop(); }

void control_server::stop() {
    if (!_context) return;
    _stop.store(true);
    if (_thread.joinable()) _thread.join();
    zmq_close(_rep);
    zmq_close(_pub);
    zmq_ctx_term(_context);
    _context = nullptr;
    std::error_code ec;
    if (!_ipc_path.empty()) {
        fs::remove(_ipc_path, ec);
        fs::remove(_ipc_path + ".events", ec);
    }
}

void control_server::run() {
    auto next_tick = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    std::vector<char> buf;
    while (!_stop.load()) {
        zmq_pollitem_t item{_rep, 0, ZMQ_POLLIN, 0};
        const int n = zmq_poll(&item, 1, 100);
        if (n > 0 && (item.revents & ZMQ_POLLIN)) {
            zmq_msg_t msg;
            zmq_msg_init(&msg);
            if (zmq_msg_recv(&msg, _rep, 0) >= 0) {
                std::string request(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
                bool more = zmq_msg_more(&msg);
                const bool multipart = more;
                zmq_msg_close(&msg);
                // REP must read the whole message before it answers; extra parts are an error.
                while (more) {
                    zmq_msg_init(&msg);
                    if (zmq_msg_recv(&msg, _rep, 0) < 0) break;
                    more = zmq_msg_more(&msg);
                    zmq_msg_close(&msg);
                }
                const std::string reply =
                    multipart ? R"({"v":1,"ok":false,"error":{"code":"bad_request","message":"a request is one message part"}})"
                              : _manager.handle_message(request);
                zmq_send(_rep, reply.data(), reply.size(), 0);
            } else {
                zmq_msg_close(&msg);
            }
        }
        const auto now = std::chrono::steady_clock::now();
        if (now >= next_tick) {
            _manager.tick();
            next_tick = now + std::chrono::seconds(1);
        }
        for (const auto& e : _manager.take_events()) {
            const std::string s = e.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
            zmq_send(_pub, s.data(), s.size(), ZMQ_DONTWAIT);
        }
    }
}

}  // namespace reefline::ifm
