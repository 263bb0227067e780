#include "ifmanager/control.h"

#include <unistd.h>
#include <zmq.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <vector>

#include "ifmanager/bounded_json.h"

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
    if (options.curve_secret.empty() != options.curve_clients.empty())
        throw std::runtime_error(options.curve_secret.empty()
                                     ? "CURVE client keys without a server secret key (--curve-secret-key)"
                                     : "a CURVE server secret key needs the client public keys allowed in (--curve-clients FILE)");
    for (const auto& k : options.curve_clients) {
        uint8_t raw[32];
        if (k.size() != 40 || !zmq_z85_decode(raw, k.c_str()))
            throw std::runtime_error("CURVE client key '" + k + "' is not a 40-character Z85 key");
        _curve_clients.emplace_back(reinterpret_cast<const char*>(raw), sizeof raw);
    }
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
    // libzmq allocates a message part whole as soon as its header announces the size, so a
    // part above this is refused by the transport itself (it closes the connection: no
    // reply can be sent). Up to it, a request above max_request_bytes is received, measured
    // and answered with bad_request. Few queued requests per client keep memory bounded.
    int64_t max_size = int64_t(transport_max_message_bytes);
    int queued = 4;
    zmq_setsockopt(_rep, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(_pub, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(_rep, ZMQ_MAXMSGSIZE, &max_size, sizeof max_size);
    zmq_setsockopt(_rep, ZMQ_RCVHWM, &queued, sizeof queued);
    const auto give_up = [this](const std::string& e) {
        for (void* s : {_rep, _pub, _zap})
            if (s) zmq_close(s);
        zmq_ctx_term(_context);
        throw std::runtime_error(e);
    };
    if (!options.curve_secret.empty()) {
        // ZeroMQ asks the ZAP handler of its context (RFC 27) about every CURVE handshake; it
        // must be bound before the sockets can take a connection. Without one, libzmq would
        // admit any client that knows the server's public key.
        _zap = zmq_socket(_context, ZMQ_REP);
        zmq_setsockopt(_zap, ZMQ_LINGER, &zero, sizeof zero);
        if (zmq_bind(_zap, "inproc://zeromq.zap.01") != 0) give_up(zerr("CURVE: cannot bind the ZAP handler"));
        int one = 1;
        for (void* s : {_rep, _pub})
            if (zmq_setsockopt(s, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
                zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, options.curve_secret.c_str(), options.curve_secret.size()) != 0 ||
                zmq_setsockopt(s, ZMQ_ZAP_DOMAIN, "reefline", 8) != 0)
                give_up(zerr("CURVE secret key"));
    }
    if (zmq_bind(_rep, _endpoint.c_str()) != 0 || zmq_bind(_pub, _events_endpoint.c_str()) != 0)
        give_up(zerr("cannot bind " + _endpoint + " / " + _events_endpoint));
    _thread = std::thread([this] { run(); });
}

control_server::~control_server() { stop(); }

void control_server::stop() {
    if (!_context) return;
    _stop.store(true);
    if (_thread.joinable()) _thread.join();
    zmq_close(_rep);
    zmq_close(_pub);
    if (_zap) zmq_close(_zap);
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
        zmq_pollitem_t items[2] = {{_rep, 0, ZMQ_POLLIN, 0}, {_zap, 0, ZMQ_POLLIN, 0}};
        const int n = zmq_poll(items, _zap ? 2 : 1, 100);
        if (n > 0 && (items[1].revents & ZMQ_POLLIN)) answer_zap();
        if (n > 0 && (items[0].revents & ZMQ_POLLIN)) answer_request();
        const auto now = std::chrono::steady_clock::now();
        if (now >= next_tick) {
            _manager.tick();
            next_tick = now + std::chrono::seconds(1);
        }
        for (const auto& e : _manager.take_events()) {
            const std::string s = serialise(e);
            if (!s.empty()) zmq_send(_pub, s.data(), s.size(), ZMQ_DONTWAIT);
        }
    }
}

// One request: its first part is measured before anything parses it; a REP socket answers
// only a whole message, so every further part is read (and discarded) too. Exactly one reply
// goes back whatever arrived.
void control_server::answer_request() {
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, _rep, 0) < 0) {
        zmq_msg_close(&msg);
        return;
    }
    const size_t size = zmq_msg_size(&msg);
    bool more = zmq_msg_more(&msg);
    std::string reply;
    if (!more) reply = _manager.handle_message({static_cast<const char*>(zmq_msg_data(&msg)), size});
    zmq_msg_close(&msg);
    size_t parts = 1;
    while (more) {
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, _rep, 0) < 0) {
            zmq_msg_close(&msg);
            break;
        }
        ++parts;
        more = zmq_msg_more(&msg);
        zmq_msg_close(&msg);
    }
    if (parts > 1)
        reply = if_manager::error_text("bad_request", "a request is one message part; this one had " +
                                                          std::to_string(parts) + " parts");
    zmq_send(_rep, reply.data(), reply.size(), 0);
}

// One ZAP request (RFC 27): version, request id, domain, address, routing id, mechanism, then
// the mechanism's credentials (CURVE: the client's 32-byte public key). The reply admits the
// client (200) only when its key is on the list; anything malformed is refused (400).
void control_server::answer_zap() {
    // Every part is read (a REP socket answers only a whole request); the first 8 are kept.
    std::vector<std::string> frames;
    for (bool more = true; more;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, _zap, 0) < 0) {
            zmq_msg_close(&m);
            return;
        }
        if (frames.size() < 8) frames.emplace_back(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
        more = zmq_msg_more(&m);
        zmq_msg_close(&m);
    }
    const bool well_formed = frames.size() >= 7 && frames[0] == "1.0";
    bool allowed = false;
    if (well_formed && frames[5] == "CURVE")
        for (const auto& k : _curve_clients) allowed |= frames[6] == k;
    const std::string id = frames.size() > 1 ? frames[1] : std::string();
    const std::string status = allowed ? "200" : well_formed ? "400" : "500";
    const std::string text = allowed ? "OK" : "client key not allowed";
    const std::string reply[6] = {"1.0", id, status, text, "", ""};
    for (int i = 0; i < 6; ++i) zmq_send(_zap, reply[i].data(), reply[i].size(), i < 5 ? ZMQ_SNDMORE : 0);
    // Logged at the 1st, 2nd, 4th, 8th... refusal: a client retrying in a loop cannot fill the log.
    if (!allowed) ++_auth_refused;
    if (!allowed && (_auth_refused & (_auth_refused - 1)) == 0)
        std::fprintf(stderr, "reefline: control: refused a CURVE client from %s (key not in the client list; %llu refusals)\n",
                     frames.size() > 3 ? frames[3].c_str() : "?", static_cast<unsigned long long>(_auth_refused));
}

}  // namespace reefline::ifm
