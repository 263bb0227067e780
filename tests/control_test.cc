// The IF manager and its ZeroMQ control plane in one process, on a net_ring port with a
// serving thread: every operation of docs/control.md, every kind of bad request (each must get
// an error reply and leave the daemon answering), the model repository across a restart,
// events on the PUB socket, and adding/removing a model while another IF serves traffic.
#include <gtest/gtest.h>
#include <rte_eth_ring.h>
#include <rte_ethdev.h>
#include <rte_ring.h>
#include <sys/stat.h>
#include <zmq.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "dkp/profile.h"
#include "ifmanager/available_memory.h"
#include "ifmanager/byte_size.h"
#include "ifmanager/control.h"
#include "ifmanager/manager.h"
#include "ifmanager/metrics.h"
#include "tests/chain_model.h"
#include "tests/ring_port.h"
#include "tests/tiny_zoo.h"
#include "tools/reefctl/client.h"
#include "tools/reefgen/packet.h"
#include "tools/reefgen/payload.h"

namespace dp = reefline::dp;
namespace ml = reefline::ml;
namespace ifm = reefline::ifm;
namespace wire = reefline::wire;
namespace gen = reefline::reefgen;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// x -> Relu -> Sigmoid -> GlobalAveragePool -> Flatten, written to `path`; returns it.
std::string write_activation_model(const fs::path& path, const std::vector<int64_t>& input_shape) {
    std::ofstream(path, std::ios::binary)
        << reefline::testing::chain_model(input_shape, {"Relu", "Sigmoid", "GlobalAveragePool", "Flatten"});
    return path.string();
}

class control_test : public ::testing::Test {
protected:
    void SetUp() override {
        const char* zoo = std::getenv("REEFLINE_ZOO");
        if (!zoo) GTEST_SKIP() << "REEFLINE_ZOO (path of build/tools/zoo) not set";
        _dir = reefline::testing::write_tiny_zoo(zoo, "control_test", "resnet50_tiny,alexnet_tiny");
        ASSERT_FALSE(_dir.empty()) << "the zoo tool failed";
        _model = (_dir / "resnet50_tiny.onnx").string();
        _ring = std::make_unique<reefline::testing::ring_port>("ctl");
        ASSERT_GE(_ring->port_id, 0);
        _rx = _ring->rx;
        _tx = _ring->tx;
        const auto c = _ring->config();
        _plane = std::make_unique<dp::dataplane>(c);
        // Spatial shares need units to place them on: the shares test gets a 4-unit device.
        reefline::gpu::cpu_device_options dopt;
        if (std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()).starts_with("shares_"))
            dopt.compute_units = 4;
        _device = reefline::gpu::make_cpu_device(dopt);
        _runtime = std::make_unique<ml::runtime>(*_device);
        _scheduler = std::make_unique<reefline::gpu::scheduler>(*_device);
        _endpoint = "ipc://" + (_dir / "control.sock").string();
        start_daemon();
        _ctx = zmq_ctx_new();
    }

    void start_daemon() {
        _repo = std::make_unique<ifm::model_repository>(_dir / "repo");
        _manager = std::make_unique<ifm::if_manager>(*_plane, *_runtime, *_scheduler, _repo.get(), _info);
        _load_problems = _manager->load_repository();
        _control = std::make_unique<ifm::control_server>(*_manager, ifm::control_options{_endpoint, ""});
        _stop = false;
        _plane->rx_online(0);
        _manager->set_serving(true);
        _serving = std::thread([this] {
            while (!_stop.load()) {
                _plane->poll_rx(0);
                _manager->serve();
            }
        });
    }

    void stop_daemon() {
        _control.reset();
        _stop = true;
        if (_serving.joinable()) _serving.join();
        _plane->rx_offline(0);
        _plane->flush(0);
        _manager->set_serving(false);
        _manager->fail_pending();
        while (_manager->serve()) {}
        _scheduler->shutdown();
        _manager.reset();
        _scheduler = std::make_unique<reefline::gpu::scheduler>(*_device);
    }

    void TearDown() override {
        if (!_plane) return;
        if (_ctx) zmq_ctx_term(_ctx);
        stop_daemon();
        _scheduler.reset();
        drain_tx();
        rte_mempool* rx = _plane->eth().rx_pool();
        rte_mempool* tx = _plane->eth().tx_pool();
        _plane->eth().close();
        EXPECT_EQ(rte_mempool_avail_count(rx), rx->size);
        EXPECT_EQ(rte_mempool_avail_count(tx), tx->size);
        _plane.reset();
        _ring.reset();
        fs::remove_all(_dir);
    }

    // One request/reply over a fresh REQ socket; the raw reply text.
    std::string call_raw(const std::string& body, bool multipart = false) {
        void* s = zmq_socket(_ctx, ZMQ_REQ);
        int zero = 0, timeout = 60000;
        zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
        zmq_setsockopt(s, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
        EXPECT_EQ(zmq_connect(s, _endpoint.c_str()), 0);
        if (multipart) zmq_send(s, "x", 1, ZMQ_SNDMORE);
        EXPECT_GE(zmq_send(s, body.data(), body.size(), 0), 0);
        zmq_msg_t m;
        zmq_msg_init(&m);
        std::string reply;
        if (zmq_msg_recv(&m, s, 0) >= 0) reply.assign(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
        zmq_msg_close(&m);
        zmq_close(s);
        return reply;
    }
    json call(const json& request) {
        const std::string r = call_raw(request.dump());
        EXPECT_FALSE(r.empty()) << "no reply to " << request.dump();
        return r.empty() ? json() : json::parse(r);
    }
    // Expects an error reply with this code; returns its message.
    std::string expect_error(const json& reply, const std::string& code) {
        EXPECT_EQ(reply.value("ok", true), false) << reply.dump();
        EXPECT_EQ(reply["error"].value("code", ""), code) << reply.dump();
        return reply["error"].value("message", "");
    }
    json add(const std::string& name, uint16_t port, const std::string& file, json extra = json::object()) {
        json r = {{"v", 1}, {"op", "add_model"}, {"name", name}, {"port", port}, {"onnx", file}};
        r.update(extra);
        return call(r);
    }

    // Sends image requests to `port` from the test thread (the serving thread receives them).
    void send_image(uint64_t id, uint16_t port, uint16_t h, uint16_t w, uint16_t c, uint8_t value) {
        reefline::testing::enqueue_image(*_plane, _rx, id, port, std::vector<uint8_t>(size_t(h) * w * c, value), h, w, c);
    }

    // Responses on the tx ring: (request id, kind) of each first fragment.
    std::vector<std::pair<uint64_t, uint8_t>> drain_tx() {
        std::vector<std::pair<uint64_t, uint8_t>> out;
        void* obj;
        while (rte_ring_dequeue(_tx, &obj) == 0) {
            auto* m = static_cast<rte_mbuf*>(obj);
            const gen::parsed_frame p = gen::parse_frame({rte_pktmbuf_mtod(m, const uint8_t*), m->data_len});
            const wire::fields f = wire::decode(&p.header);
            if (f.frag_index == 0) out.push_back({f.request_id, f.kind});
            rte_pktmbuf_free(m);
        }
        return out;
    }

    fs::path _dir;
    std::string _model, _endpoint;
    std::unique_ptr<reefline::testing::ring_port> _ring;
    rte_ring* _rx = nullptr;
    rte_ring* _tx = nullptr;
    std::unique_ptr<dp::dataplane> _plane;
    std::unique_ptr<reefline::gpu::device> _device;
    std::unique_ptr<ml::runtime> _runtime;
    std::unique_ptr<reefline::gpu::scheduler> _scheduler;
    std::unique_ptr<ifm::model_repository> _repo;
    std::unique_ptr<ifm::if_manager> _manager;
    std::unique_ptr<ifm::control_server> _control;
    std::vector<std::string> _load_problems;
    ifm::manager_info _info{"0.1.0", "cpu", "reef"};
    std::thread _serving;
    std::atomic<bool> _stop{false};
    void* _ctx = nullptr;
};

TEST_F(control_test, bad_requests_get_error_replies_and_the_daemon_keeps_answering) {
    auto raw_error = [&](const std::string& body, const std::string& code) {
        const std::string r = call_raw(body);
        ASSERT_FALSE(r.empty()) << body;
        expect_error(json::parse(r), code);
    };
    raw_error("this is not json", "bad_request");
    raw_error("", "bad_request");
    raw_error("[1, 2, 3]", "bad_request");
    raw_error("{\"op\": \"list\"}", "bad_request");
    raw_error("{\"v\": 2, \"op\": \"list\"}", "unsupported_version");
    raw_error("{\"v\": \"1\", \"op\": \"list\"}", "unsupported_version");
    raw_error("{\"v\": 1, \"op\": \"reboot\"}", "unknown_op");
    raw_error("{\"v\": 1, \"op\": 7}", "bad_request");
    raw_error("{\"v\": 1, \"op\": \"add_model\"}", "bad_request");
    raw_error("{\"v\": 1, \"op\": \"add_model\", \"name\": \"a\", \"port\": \"9100\", \"onnx\": \"x\"}", "bad_request");
    raw_error("{\"v\": 1, \"op\": \"add_model\", \"name\": \"a\", \"port\": 0, \"onnx\": \"x\"}", "bad_request");
    raw_error("{\"v\": 1, \"op\": \"add_model\", \"name\": \"a/b\", \"port\": 9100, \"onnx\": \"x\"}", "bad_request");
    raw_error(std::string(2u << 20, ' '), "bad_request");  // over the 1 MiB limit
    EXPECT_NE(add("a", 9100, _model, {{"class", "urgent"}}).dump().find("bad_request"), std::string::npos);
    EXPECT_NE(add("a", 9100, _model, {{"slo_ms", -5}}).dump().find("bad_request"), std::string::npos);
    EXPECT_NE(add("a", 9100, _model, {{"max_batch", 1000}}).dump().find("bad_request"), std::string::npos);
    EXPECT_NE(add("a", 9100, _model, {{"mean", {1, 2}}}).dump().find("bad_request"), std::string::npos);
    EXPECT_NE(add("a", 9100, _model, {{"rt_sources", {"not-an-ip"}}}).dump().find("bad_request"), std::string::npos);
    expect_error(json::parse(call_raw("{\"v\":1,\"op\":\"list\"}", true)), "bad_request");
    expect_error(call({{"v", 1}, {"op", "describe"}, {"name", "nobody"}}), "unknown_model");
    expect_error(call({{"v", 1}, {"op", "remove_model"}, {"name", "nobody"}}), "unknown_model");
    expect_error(call({{"v", 1}, {"op", "stats"}, {"name", "nobody"}}), "unknown_model");
    expect_error(call({{"v", 1}, {"op", "set"}, {"name", "nobody"}, {"slo_ms", 5}}), "unknown_model");
    // Bad model files name the problem.
    const std::string missing = expect_error(add("m", 9101, (_dir / "missing.onnx").string()), "bad_model");
    EXPECT_NE(missing.find("missing.onnx"), std::string::npos) << missing;
    {
        std::ifstream in(_model, std::ios::binary);
        std::string bytes((std::istreambuf_iterator<char>(in)), {});
        std::ofstream(_dir / "truncated.onnx", std::ios::binary) << bytes.substr(0, bytes.size() / 3);
        std::ofstream(_dir / "text.onnx") << "hello, I am not a model\n";
    }
    EXPECT_NE(expect_error(add("t", 9102, (_dir / "truncated.onnx").string()), "bad_model").find("truncated.onnx"),
              std::string::npos);
    EXPECT_NE(expect_error(add("u", 9103, (_dir / "text.onnx").string()), "bad_model").find("text.onnx"),
              std::string::npos);
    // Nothing was loaded or persisted by any of it, and the daemon still answers.
    const json h = call({{"v", 1}, {"op", "health"}});
    ASSERT_TRUE(h["ok"].get<bool>()) << h.dump();
    EXPECT_EQ(h["result"]["status"], "ok");
    EXPECT_EQ(h["result"]["models"], 0);
    EXPECT_TRUE(fs::is_empty(_dir / "repo"));
}

TEST_F(control_test, models_are_added_described_set_persisted_and_removed) {
    // Events: subscribe before anything happens.
    void* sub = zmq_socket(_ctx, ZMQ_SUB);
    int zero = 0, timeout = 10000;
    zmq_setsockopt(sub, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(sub, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0);
    ASSERT_EQ(zmq_connect(sub, (_endpoint + ".events").c_str()), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // PUB drops messages until the SUB joined

    const json a = add("cam", 9100, _model, {{"class", "rt"}, {"slo_ms", 40}, {"max_batch", 4}});
    ASSERT_TRUE(a["ok"].get<bool>()) << a.dump();
    EXPECT_EQ(a["result"]["name"], "cam");
    EXPECT_EQ(a["result"]["class"], "rt");
    EXPECT_EQ(a["result"]["input"]["shape"][1], 3);
    char buf[4096];
    const int n = zmq_recv(sub, buf, sizeof buf, 0);
    ASSERT_GT(n, 0);
    const json ev = json::parse(std::string(buf, size_t(n)));
    EXPECT_EQ(ev["event"], "model_loaded");
    EXPECT_EQ(ev["name"], "cam");
    zmq_close(sub);

    expect_error(add("cam", 9200, _model), "model_exists");
    const std::string conflict = expect_error(add("other", 9100, _model), "port_in_use");
    EXPECT_NE(conflict.find("cam"), std::string::npos) << conflict;
    const json b = add("batch", 9101, (_dir / "alexnet_tiny.onnx").string(), {{"batching", "aimd"}});
    ASSERT_TRUE(b["ok"].get<bool>()) << b.dump();

    const json l = call({{"v", 1}, {"op", "list"}});
    ASSERT_EQ(l["result"]["models"].size(), 2u) << l.dump();
    const json s = call({{"v", 1}, {"op", "set"}, {"name", "cam"}, {"slo_ms", 25}, {"class", "be"}, {"max_batch", 8}});
    ASSERT_TRUE(s["ok"].get<bool>()) << s.dump();
    EXPECT_EQ(s["result"]["slo_ms"], 25);
    EXPECT_EQ(s["result"]["class"], "be");
    expect_error(call({{"v", 1}, {"op", "set"}, {"name", "cam"}, {"port", 1}}), "bad_request");
    expect_error(call({{"v", 1}, {"op", "set"}, {"name", "cam"}, {"min_batch", 9}}), "bad_request");
    // Settings that contradict each other are refused where the message is checked, naming
    // both fields, and nothing of them is applied.
    for (const json& contradiction :
         {json{{"batching", "fixed"}, {"min_batch", 4}, {"fixed_batch", 2}}, json{{"min_batch", 3}, {"fixed_batch", 2}},
          json{{"max_batch", 4}, {"fixed_batch", 6}}, json{{"max_batch", 2}, {"min_batch", 3}}}) {
        json r = {{"v", 1}, {"op", "set"}, {"name", "cam"}};
        r.update(contradiction);
        const std::string why = expect_error(call(r), "bad_request");
        for (const char* f : {"min_batch", "fixed_batch", "max_batch"}) {
            if (contradiction.contains(f)) {
                EXPECT_NE(why.find(f), std::string::npos) << contradiction.dump() << ": " << why;
            }
        }
        const std::string added = expect_error(add("contradiction", 9150, _model, contradiction), "bad_request");
        EXPECT_EQ(added, why);
    }
    {
        const json d = call({{"v", 1}, {"op", "describe"}, {"name", "cam"}});
        EXPECT_EQ(d["result"]["min_batch"], 1) << d.dump();
        EXPECT_EQ(d["result"]["fixed_batch"], 0) << d.dump();
        EXPECT_EQ(d["result"]["batching"], "slab") << d.dump();
    }

    // Persisted: config + model file; the set is in the config.
    ASSERT_TRUE(fs::is_regular_file(_dir / "repo" / "cam" / "model.onnx"));
    std::ifstream cfg(_dir / "repo" / "cam" / "config.json");
    const json stored = json::parse(cfg);
    EXPECT_EQ(stored["slo_ms"], 25);
    EXPECT_EQ(stored["port"], 9100);

    const json st = call({{"v", 1}, {"op", "stats"}});
    ASSERT_TRUE(st["ok"].get<bool>());
    EXPECT_EQ(st["result"]["ifs"].size(), 2u);
    EXPECT_TRUE(st["result"]["dataplane"]["drops"].contains("ring_full"));
    // Every number a real daemon's stats carry reaches Prometheus (or is left out on purpose,
    // with the reason in ifmanager/metrics.cc): a counter added to stats alone fails here.
    for (const std::string& key : reefline::metrics::stats_without_metric(st["result"]))
        ADD_FAILURE() << "stats key " << key << " has no Prometheus metric";

    // A restart brings both back from the repository.
    stop_daemon();
    start_daemon();
    EXPECT_TRUE(_load_problems.empty());
    const json l2 = call({{"v", 1}, {"op", "describe"}, {"name", "cam"}});
    ASSERT_TRUE(l2["ok"].get<bool>()) << l2.dump();
    EXPECT_EQ(l2["result"]["slo_ms"], 25);
    EXPECT_EQ(l2["result"]["class"], "be");
    EXPECT_EQ(l2["result"]["max_batch"], 8);

    const json r = call({{"v", 1}, {"op", "remove_model"}, {"name", "cam"}});
    ASSERT_TRUE(r["ok"].get<bool>()) << r.dump();
    EXPECT_FALSE(fs::exists(_dir / "repo" / "cam"));
    EXPECT_EQ(call({{"v", 1}, {"op", "list"}})["result"]["models"].size(), 1u);
}

// An IF keeps answering every request while another model is added and removed.
// Spatial shares: `share` in add_model and set, placed on disjoint compute units in name order
// (describe's `units`), persisted, placed again when an IF goes; bad values refused.
TEST_F(control_test, shares_are_placed_on_disjoint_units_set_persisted_and_refused_when_bad) {
    const auto units_of = [&](const std::string& name) {
        const json d = call({{"v", 1}, {"op", "describe"}, {"name", name}});
        EXPECT_TRUE(d["ok"].get<bool>()) << d.dump();
        return d["result"]["units"].get<std::vector<uint32_t>>();
    };
    const std::string alex = (_dir / "alexnet_tiny.onnx").string();
    const json a = add("a", 9100, alex, {{"share", 0.5}});
    ASSERT_TRUE(a["ok"].get<bool>()) << a.dump();
    EXPECT_EQ(a["result"]["share"], 0.5);
    ASSERT_TRUE(add("b", 9101, alex, {{"share", 0.25}})["ok"].get<bool>());
    ASSERT_TRUE(add("c", 9102, alex)["ok"].get<bool>());
    EXPECT_EQ(units_of("a"), (std::vector<uint32_t>{0, 1}));
    EXPECT_EQ(units_of("b"), (std::vector<uint32_t>{2}));
    EXPECT_EQ(units_of("c"), (std::vector<uint32_t>{0, 1, 2, 3}));  // share 1: the whole device
    // Where the shares really run (the cpu device binds exactly), and the device's totals.
    const json granted = call({{"v", 1}, {"op", "describe"}, {"name", "a"}})["result"]["units_granted"];
    EXPECT_EQ(granted["bound"], true) << granted.dump();
    EXPECT_EQ(granted["exact"], true) << granted.dump();
    EXPECT_EQ(granted["count"], 2) << granted.dump();
    EXPECT_EQ(granted["units"], json({0, 1})) << granted.dump();
    EXPECT_FALSE(call({{"v", 1}, {"op", "describe"}, {"name", "c"}})["result"].contains("units_granted"));
    const json hu = call({{"v", 1}, {"op", "health"}})["result"]["units"];
    EXPECT_EQ(hu["mechanism"], "workers") << hu.dump();
    EXPECT_EQ(hu["usable"], true) << hu.dump();
    EXPECT_EQ(hu["fallbacks"], 0) << hu.dump();

    const json s = call({{"v", 1}, {"op", "set"}, {"name", "a"}, {"share", 0.25}});
    ASSERT_TRUE(s["ok"].get<bool>()) << s.dump();
    EXPECT_EQ(s["result"]["share"], 0.25);
    EXPECT_EQ(units_of("a"), (std::vector<uint32_t>{0}));
    EXPECT_EQ(units_of("b"), (std::vector<uint32_t>{1}));
    for (const json& bad : {json(0), json(1.5), json(-0.5), json("half")}) {  // (null means "not given")
        const std::string why = expect_error(call({{"v", 1}, {"op", "set"}, {"name", "b"}, {"share", bad}}), "bad_request");
        EXPECT_NE(why.find("share"), std::string::npos) << why;
        expect_error(add("d", 9103, alex, {{"share", bad}}), "bad_request");
    }
    EXPECT_EQ(call({{"v", 1}, {"op", "describe"}, {"name", "b"}})["result"]["share"], 0.25);

    // Persisted, and placed again after a restart.
    std::ifstream cfg(_dir / "repo" / "a" / "config.json");
    EXPECT_EQ(json::parse(cfg)["share"], 0.25);
    stop_daemon();
    start_daemon();
    EXPECT_TRUE(_load_problems.empty());
    EXPECT_EQ(units_of("a"), (std::vector<uint32_t>{0}));
    EXPECT_EQ(units_of("b"), (std::vector<uint32_t>{1}));
    // An IF that goes frees its units: b moves up.
    ASSERT_TRUE(call({{"v", 1}, {"op", "remove_model"}, {"name", "a"}})["ok"].get<bool>());
    EXPECT_EQ(units_of("b"), (std::vector<uint32_t>{0}));
}

// GSLICE's self-tuning, in the situation of its Fig. 16: two IFs with share auto on a 4-unit
// device, one kept busier than its share can serve, one nearly idle. Within seconds the busy
// one holds most of the device and the idle one a single unit. describe shows the knee
// measured when the IF was added (kept in the repository's profile) and the tuned share.
TEST_F(control_test, shares_auto_tune_toward_the_loaded_if_and_describe_has_the_knee) {
    stop_daemon();
    _info.profile_budget_ms = 60000;
    start_daemon();
    const std::string alex = (_dir / "alexnet_tiny.onnx").string();
    const json busy = add("busy", 9100, alex, {{"share", "auto"}, {"batching", "fixed"}, {"max_batch", 1}, {"slo_ms", 50}});
    ASSERT_TRUE(busy["ok"].get<bool>()) << busy.dump();
    EXPECT_EQ(busy["result"]["share_policy"], "auto");
    const json knee = busy["result"]["knee"];
    ASSERT_TRUE(knee.is_object()) << busy.dump();
    EXPECT_EQ(knee["device_units"], 4);
    EXPECT_GT(knee["share"].get<double>(), 0.0);
    EXPECT_LE(knee["share"].get<double>(), 1.0);
    ASSERT_EQ(knee["curve"].size(), 4u) << knee.dump();
    for (const json& p : knee["curve"]) EXPECT_GT(p["batch_ms"].get<double>(), 0.0) << knee.dump();
    {
        std::ifstream in(_dir / "repo" / "busy" / "profile.json");
        const std::string text((std::istreambuf_iterator<char>(in)), {});
        EXPECT_EQ(reefline::dkp::model_profile::parse(text).knee.points.size(), 4u) << text;
    }
    const json quiet = add("quiet", 9101, alex, {{"share", "auto"}, {"slo_ms", 1000}});
    ASSERT_TRUE(quiet["ok"].get<bool>()) << quiet.dump();
    std::ifstream cfg(_dir / "repo" / "quiet" / "config.json");
    EXPECT_EQ(json::parse(cfg)["share"], "auto");

    const uint16_t h = uint16_t(busy["result"]["input"]["shape"][2]), w = uint16_t(busy["result"]["input"]["shape"][3]);
    const auto share_of = [&](const std::string& name) {
        return call({{"v", 1}, {"op", "describe"}, {"name", name}})["result"]["share"].get<double>();
    };
    // The busy IF always has 32 requests outstanding (more than one unit serves within its
    // SLO); the quiet one gets one every 200 ms.
    uint64_t sent_busy = 0, answered_busy = 0, next_quiet = 0;
    double busy_share = 0, quiet_share = 0;
    const auto start = std::chrono::steady_clock::now();
    for (int round = 0; std::chrono::steady_clock::now() - start < std::chrono::seconds(30); ++round) {
        for (const auto& [id, kind] : drain_tx())
            if (id < (uint64_t{1} << 32)) ++answered_busy;
        while (sent_busy - answered_busy < 32) {
            ++sent_busy;
            send_image(sent_busy, 9100, h, w, 3, uint8_t(sent_busy));
        }
        if (round % 40 == 0) send_image((uint64_t{1} << 32) + next_quiet++, 9101, h, w, 3, 7);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        if (round % 100 == 99) {
            busy_share = share_of("busy");
            quiet_share = share_of("quiet");
            if (busy_share == 0.75 && quiet_share == 0.25) break;
        }
    }
    std::printf("shares tuned to busy %.2f / quiet %.2f in %.1f s\n", busy_share, quiet_share,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    EXPECT_EQ(busy_share, 0.75) << "the loaded IF holds 3 of 4 units";
    EXPECT_EQ(quiet_share, 0.25) << "the idle one gives its units back: "
                                 << call({{"v", 1}, {"op", "describe"}, {"name", "quiet"}}).dump()
                                 << call({{"v", 1}, {"op", "stats"}, {"name", "quiet"}}).dump();
    const json d = call({{"v", 1}, {"op", "describe"}, {"name", "busy"}})["result"];
    EXPECT_EQ(d["units"].size(), 3u) << d.dump();
    EXPECT_GE(d["share_demand"].get<double>(), 0.75) << d.dump();

    // A static share again: the tuner lets go of it.
    const json s = call({{"v", 1}, {"op", "set"}, {"name", "busy"}, {"share", 0.5}});
    ASSERT_TRUE(s["ok"].get<bool>()) << s.dump();
    EXPECT_EQ(s["result"]["share"], 0.5);
    EXPECT_EQ(s["result"]["share_policy"], "static");
    const std::string why = expect_error(call({{"v", 1}, {"op", "set"}, {"name", "busy"}, {"share", "automatic"}}), "bad_request");
    EXPECT_NE(why.find("auto"), std::string::npos) << why;
    for (int i = 0; i < 200 && (sent_busy > answered_busy); ++i) {  // let the rest be answered
        for (const auto& [id, kind] : drain_tx())
            if (id < (uint64_t{1} << 32)) ++answered_busy;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
}

// `set` with `onnx`: a new version of the IF's model replaces the old one on the side (the
// traffic check is model_if_test's); the repository keeps the new bytes, a restart serves
// them, and a model that takes other requests or a missing file is refused with bad_model,
// the IF serving as before.
TEST_F(control_test, set_onnx_replaces_the_model_and_the_repository_keeps_the_new_version) {
    const fs::path v2 = _dir / "v2";
    const std::string cmd = std::string(std::getenv("REEFLINE_ZOO")) + " --out " + v2.string() +
                            " --tiny --only alexnet_tiny --seed 2 -q";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    const std::string alex = (_dir / "alexnet_tiny.onnx").string(), alex2 = (v2 / "alexnet_tiny.onnx").string();
    ASSERT_TRUE(add("cam", 9100, alex, {{"max_batch", 2}, {"slo_ms", 500}})["ok"].get<bool>());
    const auto bytes_of = [](const fs::path& p) {
        std::ifstream in(p, std::ios::binary);
        return std::string((std::istreambuf_iterator<char>(in)), {});
    };
    const fs::path stored = _dir / "repo" / "cam" / "model.onnx";
    ASSERT_EQ(bytes_of(stored), bytes_of(alex));
    ASSERT_NE(bytes_of(alex), bytes_of(alex2)) << "the seed changes the weights";

    const json r = call({{"v", 1}, {"op", "set"}, {"name", "cam"}, {"onnx", alex2}, {"slo_ms", 400}});
    ASSERT_TRUE(r["ok"].get<bool>()) << r.dump();
    EXPECT_EQ(r["result"]["slo_ms"], 400.0);
    EXPECT_EQ(r["result"]["planned_batch_sizes"], json({1, 2}));
    EXPECT_EQ(bytes_of(stored), bytes_of(alex2)) << "the repository keeps the new version";
    EXPECT_EQ(r["result"]["onnx"], stored.string());
    // Answers still come, from the new version.
    const uint16_t h = uint16_t(r["result"]["input"]["shape"][2]), w = uint16_t(r["result"]["input"]["shape"][3]);
    send_image(1, 9100, h, w, 3, 9);
    std::vector<std::pair<uint64_t, uint8_t>> answers;
    for (int i = 0; i < 500 && answers.empty(); ++i) {
        answers = drain_tx();
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_EQ(answers.size(), 1u);
    EXPECT_EQ(answers[0].second, uint8_t(wire::kind::response));

    // Refused, and nothing changes: a model of other requests, a missing file.
    const std::string other = write_activation_model(_dir / "small.onnx", {1, 3, 32, 32});
    std::string why = expect_error(call({{"v", 1}, {"op", "set"}, {"name", "cam"}, {"onnx", other}}), "bad_model");
    EXPECT_NE(why.find("other requests"), std::string::npos) << why;
    why = expect_error(call({{"v", 1}, {"op", "set"}, {"name", "cam"}, {"onnx", (_dir / "nope.onnx").string()}}), "bad_model");
    EXPECT_NE(why.find("no such model file"), std::string::npos) << why;
    EXPECT_EQ(bytes_of(stored), bytes_of(alex2));

    // A restart serves the new version from the repository.
    stop_daemon();
    start_daemon();
    EXPECT_TRUE(_load_problems.empty());
    const json d = call({{"v", 1}, {"op", "describe"}, {"name", "cam"}});
    ASSERT_TRUE(d["ok"].get<bool>()) << d.dump();
    EXPECT_EQ(d["result"]["slo_ms"], 400.0);
    EXPECT_EQ(bytes_of(stored), bytes_of(alex2));
}

TEST_F(control_test, adding_and_removing_a_model_does_not_disturb_another_if) {
    const json a = add("steady", 9100, _model, {{"slo_ms", 2000}});
    ASSERT_TRUE(a["ok"].get<bool>()) << a.dump();
    const uint16_t h = uint16_t(a["result"]["input"]["shape"][2]), w = uint16_t(a["result"]["input"]["shape"][3]);
    std::atomic<bool> done{false};
    std::atomic<uint64_t> sent{0};
    std::thread camera([&] {
        for (uint64_t id = 1; !done.load(); ++id) {
            send_image(id, 9100, h, w, 3, uint8_t(id));
            sent = id;
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
    });
    std::vector<std::pair<uint64_t, uint8_t>> answers;
    auto collect_for = [&](int ms) {
        for (int i = 0; i < ms; i += 10) {
            for (auto& x : drain_tx()) answers.push_back(x);
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
    };
    collect_for(200);
    const json b = add("newcomer", 9101, (_dir / "alexnet_tiny.onnx").string());
    ASSERT_TRUE(b["ok"].get<bool>()) << b.dump();
    collect_for(200);
    const json r = call({{"v", 1}, {"op", "remove_model"}, {"name", "newcomer"}});
    ASSERT_TRUE(r["ok"].get<bool>()) << r.dump();
    collect_for(200);
    done = true;
    camera.join();
    for (int i = 0; i < 300 && answers.size() < sent.load(); ++i) collect_for(10);
    ASSERT_GT(sent.load(), 20u);
    EXPECT_EQ(answers.size(), sent.load());
    for (const auto& [id, kind] : answers) EXPECT_EQ(kind, uint8_t(wire::kind::response)) << "request " << id;
    const json st = call({{"v", 1}, {"op", "stats"}, {"name", "steady"}});
    EXPECT_EQ(st["result"]["ifs"][0]["errors_total"], 0);
    EXPECT_EQ(st["result"]["ifs"][0]["shed_total"], 0);
}

// stats (what a metrics scrape and the serving loop's counters read) does not wait for an
// operation in progress: add_model holds the operation lock while it loads and warms a model.
TEST_F(control_test, stats_are_answered_while_a_model_is_being_added) {
    std::atomic<bool> adding{true};
    json added;
    const auto t0 = std::chrono::steady_clock::now();
    std::thread op([&] {
        added = add("slow", 9100, _model, {{"max_batch", 128}});
        adding = false;
    });
    double worst_ms = 0;
    int calls = 0;
    while (adding.load()) {
        const auto s0 = std::chrono::steady_clock::now();
        const json st = _manager->stats();
        dp::counter_snapshot counters{};
        _manager->add_if_counters(counters);
        worst_ms = std::max(worst_ms, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0).count());
        ++calls;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    op.join();
    const double add_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(added["ok"].get<bool>()) << added.dump();
    // Enough calls fell inside the add to tell (its length depends on the cores it gets).
    ASSERT_GE(calls, 5) << "the add was too quick to tell: " << add_ms << " ms";
    EXPECT_LT(worst_ms, 100) << calls << " stats calls during a " << add_ms << " ms add_model";
}

TEST_F(control_test, shutdown_is_acknowledged_and_a_second_daemon_is_refused) {
    EXPECT_THROW(ifm::control_server(*_manager, ifm::control_options{_endpoint, ""}), std::runtime_error);
    EXPECT_THROW(ifm::control_server(*_manager, ifm::control_options{"tcp://0.0.0.0:5999", ""}), std::runtime_error);
    const json r = call({{"v", 1}, {"op", "shutdown"}});
    ASSERT_TRUE(r["ok"].get<bool>());
    EXPECT_TRUE(_manager->shutdown_requested());
    expect_error(add("late", 9100, _model), "shutting_down");
}

// CURVE: the only way to serve beyond loopback. The secret key needs a client list; a listed
// client is served over the encrypted connection, an unlisted key or a plain client is
// refused at the handshake, and reefctl's client says so at once instead of timing out.
TEST_F(control_test, curve_serves_listed_clients_only) {
    struct pair_z85 { char pub[41], sec[41]; } server, op, stranger;
    for (auto* k : {&server, &op, &stranger}) ASSERT_EQ(zmq_curve_keypair(k->pub, k->sec), 0);
    const uint16_t port = uint16_t(20000 + getpid() % 20000);
    const std::string any = "tcp://0.0.0.0:" + std::to_string(port), local = "tcp://127.0.0.1:" + std::to_string(port);
    EXPECT_THROW(ifm::control_server(*_manager, ifm::control_options{any, server.sec, {}}), std::runtime_error);
    EXPECT_THROW(ifm::control_server(*_manager, ifm::control_options{any, "", {op.pub}}), std::runtime_error);
    EXPECT_THROW(ifm::control_server(*_manager, ifm::control_options{any, server.sec, {"not a key"}}), std::runtime_error);

    _control.reset();  // one control thread per manager, as in the daemon
    ifm::control_server curve_server(*_manager, ifm::control_options{any, server.sec, {op.pub}});
    namespace rc = reefline::reefctl;
    const rc::curve_client_keys listed{server.pub, op.pub, op.sec}, unlisted{server.pub, stranger.pub, stranger.sec};
    const json h = rc::call(local, {{"op", "health"}}, 10000, &listed);
    EXPECT_EQ(h.value("status", ""), "ok") << h.dump();

    auto refused = [&](const rc::curve_client_keys* keys) {
        const auto t0 = std::chrono::steady_clock::now();
        try {
            rc::call(local, {{"op", "health"}}, 10000, keys);
            ADD_FAILURE() << "served without an allowed key";
        } catch (const rc::control_error& e) {
            EXPECT_EQ(e.code(), rc::local_code::auth) << e.what();
            EXPECT_FALSE(e.from_daemon());
        }
        EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5)) << "reported only by the timeout";
    };
    // Refusals in a row: each closes its socket while libzmq may still be reporting on it (a
    // reconnect after the refusal), which once hung the client's I/O thread for good.
    for (int i = 0; i < 8; ++i) {
        refused(&unlisted);
        refused(nullptr);
    }
    // The daemon keeps serving the listed client after refusing the others.
    EXPECT_EQ(rc::call(local, {{"op", "list"}}, 10000, &listed)["models"].size(), 0u);
}


// --- Hostile messages: each class below once killed the daemon or bloated its repository ------

// A reply must parse as one JSON object with a boolean "ok"; returns it.
json parsed_reply(const std::string& r) {
    json j = json::parse(r, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << "reply is not JSON: " << r.substr(0, 200);
    EXPECT_TRUE(j.is_object() && j.contains("ok") && j["ok"].is_boolean()) << r.substr(0, 200);
    return j;
}

TEST_F(control_test, invalid_utf8_gets_an_error_reply_not_an_abort) {
    // The parser's error message quotes the bad bytes; serialising it used to throw.
    const std::vector<std::string> bodies = {"\xff\xfe\xfd", "{\"v\":1,\"op\":\"\xff\"}",
                                             "{\"v\":1,\"op\":\"describe\",\"name\":\"\xc3\x28\"}",
                                             "{\"v\":1,\"op\":\"list\",\"\xed\xa0\x80\":1}", "\"\xf0\x28\x8c\x28\""};
    for (const auto& body : bodies) expect_error(parsed_reply(call_raw(body)), "bad_request");
    EXPECT_TRUE(call({{"v", 1}, {"op", "health"}})["ok"].get<bool>());
}

TEST_F(control_test, deeply_nested_json_is_refused_before_anything_walks_it) {
    // 200 000 levels in 400 kB: every recursive walk (dump, copy, compare) overflowed the stack.
    const std::string deep = std::string(200000, '[') + std::string(200000, ']');
    const std::string deep_object = [] {
        std::string s;
        for (int i = 0; i < 100000; ++i) s += "{\"a\":";
        return s + "1" + std::string(100000, '}');
    }();
    const std::vector<std::string> bodies = {"{\"v\":" + deep + ",\"op\":\"list\"}", "{\"v\":1,\"op\":\"list\",\"x\":" + deep + "}",
                                             "{\"v\":1,\"op\":\"set\",\"name\":\"a\",\"slo_ms\":" + deep + "}", deep,
                                             deep_object, "{\"v\":1,\"op\":\"list\",\"s\":\"[[[[[[[[[[[[[[[[[[[[[[\"}"};
    for (size_t i = 0; i + 1 < bodies.size(); ++i) {
        const std::string m = expect_error(parsed_reply(call_raw(bodies[i])), "bad_request");
        EXPECT_NE(m.find("nested more than"), std::string::npos) << m;
    }
    // Brackets inside a string are not nesting: refused for the unknown field, not the depth.
    const std::string m = expect_error(parsed_reply(call_raw(bodies.back())), "bad_request");
    EXPECT_NE(m.find("unknown field 's'"), std::string::npos) << m;
    // The limit itself is accepted as JSON (then refused by the schema).
    const std::string at_limit = "{\"v\":1,\"op\":\"list\",\"x\":" + std::string(ifm::max_json_depth - 1, '[') +
                                 std::string(ifm::max_json_depth - 1, ']') + "}";
    EXPECT_EQ(expect_error(parsed_reply(call_raw(at_limit)), "bad_request").find("nested"), std::string::npos);
    EXPECT_TRUE(call({{"v", 1}, {"op", "health"}})["ok"].get<bool>());
}

TEST_F(control_test, unknown_fields_are_refused_by_every_operation_and_the_repository_stays_small) {
    ASSERT_TRUE(add("cam", 9100, _model)["ok"].get<bool>());
    const std::vector<json> requests = {
        {{"op", "health"}},       {{"op", "list"}},          {{"op", "describe"}, {"name", "cam"}},
        {{"op", "stats"}},        {{"op", "set"}, {"name", "cam"}, {"slo_ms", 30}},
        {{"op", "remove_model"}, {"name", "cam"}},
        {{"op", "add_model"}, {"name", "b"}, {"port", 9101}, {"onnx", _model}},
        {{"op", "shutdown"}}};
    for (json r : requests) {
        r["v"] = 1;
        r["colour"] = "blue";
        const std::string m = expect_error(call(r), "bad_request");
        EXPECT_NE(m.find("unknown field 'colour'"), std::string::npos) << r.dump() << ": " << m;
    }
    EXPECT_FALSE(_manager->shutdown_requested());
    // Nothing above applied: cam still has its SLO, b was not added.
    const json d = call({{"v", 1}, {"op", "describe"}, {"name", "cam"}});
    EXPECT_EQ(d["result"]["slo_ms"], 100) << d.dump();
    EXPECT_EQ(call({{"v", 1}, {"op", "list"}})["result"]["models"].size(), 1u);
    // set refuses what only add_model takes with its own reason.
    EXPECT_NE(expect_error(call({{"v", 1}, {"op", "set"}, {"name", "cam"}, {"top_k", 3}}), "bad_request")
                  .find("cannot be changed by set"),
              std::string::npos);

    // A 20 kB field once became a config.json of 200 MB after a few sets: now refused, and
    // what is stored is the IF's settings, compact.
    json junk = json::array();
    for (int i = 0; i < 40; ++i) junk.push_back(std::string(500, 'x'));
    expect_error(call({{"v", 1}, {"op", "set"}, {"name", "cam"}, {"notes", junk}}), "bad_request");
    const std::string not_ip = expect_error(call({{"v", 1}, {"op", "set"}, {"name", "cam"}, {"rt_sources", junk}}), "bad_request");
    EXPECT_NE(not_ip.find("is not an IPv4 address"), std::string::npos) << not_ip;
    EXPECT_LT(not_ip.size(), 200u) << "an error message quotes at most an excerpt of what the client sent";
    json many_sources = json::array();
    for (int i = 0; i < 65; ++i) many_sources.push_back("10.0.0." + std::to_string(i));
    const std::string over = expect_error(call({{"v", 1}, {"op", "set"}, {"name", "cam"}, {"rt_sources", many_sources}}), "bad_request");
    EXPECT_NE(over.find("65 entries; the limit is 64"), std::string::npos) << over;
    const std::string long_path = expect_error(add("c", 9102, "/" + std::string(5000, 'p')), "bad_request");
    EXPECT_NE(long_path.find("5001 bytes long; the limit is 4096"), std::string::npos) << long_path;
    const std::string long_key = expect_error(call({{"v", 1}, {"op", "list"}, {std::string(100000, 'k'), 1}}), "bad_request");
    EXPECT_LT(long_key.size(), 300u) << "an error message quotes at most an excerpt of what the client sent";
    for (int i = 0; i < 10; ++i)
        ASSERT_TRUE(call({{"v", 1}, {"op", "set"}, {"name", "cam"}, {"slo_ms", 20 + i}, {"rt_sources", {"10.0.0.1"}}})["ok"].get<bool>());
    const fs::path config = _dir / "repo" / "cam" / "config.json";
    EXPECT_LT(fs::file_size(config), 1024u);
    std::ifstream in(config);
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    EXPECT_EQ(text.find("\n "), std::string::npos) << "persisted indented: " << text;
    const json stored = json::parse(text);
    EXPECT_EQ(stored["slo_ms"], 29);
    EXPECT_EQ(stored["rt_sources"], json({"10.0.0.1"}));
    for (const auto& [key, v] : stored.items())
        EXPECT_TRUE(key == "name" || key == "port" || key == "onnx" || key == "class" || key == "slo_ms" ||
                    key == "batching" || key == "min_batch" || key == "max_batch" || key == "fixed_batch" ||
                    key == "priority" || key == "shed" || key == "rt_sources" || key == "top_k" || key == "mean" ||
                    key == "std" || key == "output" || key == "share")
            << key;
    // A config made huge or deep by hand is refused at start-up, naming the file.
    stop_daemon();
    std::ofstream(config) << "{\"name\":\"cam\",\"x\":\"" << std::string(100 * 1024, 'y') << "\"}";
    start_daemon();
    ASSERT_EQ(_load_problems.size(), 1u);
    EXPECT_NE(_load_problems[0].find("larger than"), std::string::npos) << _load_problems[0];
    stop_daemon();
    std::ofstream(config) << "{\"name\":\"cam\",\"port\":9100,\"colour\":\"blue\"}";
    start_daemon();
    ASSERT_EQ(_load_problems.size(), 1u);
    EXPECT_NE(_load_problems[0].find("unknown field 'colour'"), std::string::npos) << _load_problems[0];
}

TEST_F(control_test, oversized_messages_are_answered_with_their_size_and_the_limit) {
    for (const size_t size : {ifm::max_request_bytes + 1, size_t(3) << 20, ifm::transport_max_message_bytes - 1}) {
        const std::string m = expect_error(parsed_reply(call_raw(std::string(size, '{'))), "bad_request");
        EXPECT_NE(m.find(std::to_string(size) + " bytes"), std::string::npos) << m;
        EXPECT_NE(m.find(std::to_string(ifm::max_request_bytes)), std::string::npos) << m;
    }
    // Beyond the transport's own limit libzmq drops the connection without handing the message
    // over; the daemon goes on answering others.
    void* s = zmq_socket(_ctx, ZMQ_REQ);
    int zero = 0, timeout = 2000;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    ASSERT_EQ(zmq_connect(s, _endpoint.c_str()), 0);
    const std::string huge(ifm::transport_max_message_bytes + 1, ' ');
    zmq_send(s, huge.data(), huge.size(), 0);
    char buf[16];
    EXPECT_LT(zmq_recv(s, buf, sizeof buf, 0), 0);
    zmq_close(s);
    EXPECT_TRUE(call({{"v", 1}, {"op", "health"}})["ok"].get<bool>());
}

// A DEALER socket sees every reply the daemon sends (a REQ socket would hide a second one):
// each input below gets exactly one, and it parses.
TEST_F(control_test, every_odd_input_gets_exactly_one_reply) {
    void* s = zmq_socket(_ctx, ZMQ_DEALER);
    int zero = 0, timeout = 20000;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    ASSERT_EQ(zmq_connect(s, _endpoint.c_str()), 0);
    std::string binary;
    for (int i = 0; i < 512; ++i) binary.push_back(char(i * 37));
    const std::vector<std::vector<std::string>> inputs = {
        {""},
        {binary},
        {std::string(1, '\0')},
        {"{\"v\":1,\"op\":\"list\"}", "second part"},
        {"{\"v\":1,\"op\":\"list\"}", "", std::string(2u << 20, 'x')},
        {std::string(2u << 20, 'x'), "{}"},
        {"{\"v\":1,\"op\":\"add_model\",\"name\":\"n\",\"port\":1e400,\"onnx\":\"x\"}"},
        {"{\"v\":1,\"op\":\"add_model\",\"name\":\"n\",\"port\":18446744073709551616,\"onnx\":\"x\"}"},
        {"{\"v\":1,\"op\":\"add_model\",\"name\":\"n\",\"port\":-9223372036854775809,\"onnx\":\"x\"}"},
        {"{\"v\":1,\"op\":\"add_model\",\"name\":\"n\",\"port\":9100,\"onnx\":\"x\",\"top_k\":1e308}"},
        {"{\"v\":1,\"op\":\"add_model\",\"name\":\"n\",\"port\":9100,\"onnx\":\"x\",\"mean\":[1e308,-1e308,5e-324]}"},
        {"{\"v\":1,\"op\":\"add_model\",\"name\":\"n\",\"port\":9100,\"onnx\":\"x\",\"slo_ms\":1e-320}"},
        {"{\"v\":1,\"op\":\"add_model\",\"name\":[1],\"port\":{},\"onnx\":true}"},
        {"{\"v\":1,\"op\":\"add_model\",\"name\":\"n\",\"port\":9100,\"onnx\":{\"a\":1}}"},
        {"{\"v\":1,\"op\":\"set\",\"name\":\"n\",\"shed\":\"yes\",\"rt_sources\":[1,null,[]]}"},
        {"{\"v\":1,\"op\":\"stats\",\"name\":17}"},
        {"{\"v\":1.0,\"op\":\"list\"}"},
        {"{\"v\":-1e400,\"op\":\"list\"}"},
        {"{\"v\":1,\"op\":null}"},
        {"{\"v\":1,\"op\":\"list\",\"v\":2}"},
        {"{\"v\":1,\"op\":\"list\"} trailing"},
        {"null"},
        {"\"a string\""},
        {"[{\"v\":1,\"op\":\"list\"}]"},
        {"{\"v\":1,\"op\":\"health\"}"},
    };
    for (const auto& parts : inputs) {
        ASSERT_GE(zmq_send(s, "", 0, ZMQ_SNDMORE), 0);  // the envelope delimiter REP expects
        for (size_t i = 0; i < parts.size(); ++i)
            ASSERT_GE(zmq_send(s, parts[i].data(), parts[i].size(), i + 1 < parts.size() ? ZMQ_SNDMORE : 0), 0);
    }
    std::vector<json> replies;
    for (size_t i = 0; i < inputs.size(); ++i) {
        std::vector<std::string> frames;
        for (bool more = true; more;) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, s, 0) < 0) {
                zmq_msg_close(&m);
                FAIL() << "no reply to input " << i << " of " << inputs.size();
            }
            frames.emplace_back(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
            more = zmq_msg_more(&m);
            zmq_msg_close(&m);
        }
        ASSERT_EQ(frames.size(), 2u) << "reply " << i << ": delimiter + one part";
        EXPECT_TRUE(frames[0].empty());
        replies.push_back(parsed_reply(frames[1]));
    }
    // Nothing more arrives.
    int short_wait = 300;
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &short_wait, sizeof short_wait);
    char buf[16];
    EXPECT_LT(zmq_recv(s, buf, sizeof buf, 0), 0) << "an extra reply";
    zmq_close(s);
    for (size_t i = 0; i + 1 < replies.size(); ++i) EXPECT_FALSE(replies[i]["ok"].get<bool>()) << i << ": " << replies[i].dump();
    EXPECT_NE(replies[3]["error"]["message"].get<std::string>().find("2 parts"), std::string::npos);
    EXPECT_TRUE(replies.back()["ok"].get<bool>());
    EXPECT_EQ(replies.back()["result"]["models"], 0);
}


// --- Models: a memory budget, file limits, image inputs ---------------------------------------

TEST_F(control_test, a_model_that_does_not_fit_the_memory_budget_is_refused_before_it_is_loaded) {
    stop_daemon();
    _info.memory_budget_bytes = 24 << 20;
    start_daemon();
    // 12 bytes a pixel at batch 1: 3 MiB a tensor, ~31x that over batch sizes 1..16.
    const std::string big = write_activation_model(_dir / "activations.onnx", {1, 3, 512, 512});
    const auto before = call({{"v", 1}, {"op", "health"}})["result"]["memory"];
    EXPECT_EQ(before["budget_bytes"], 24 << 20) << before.dump();
    EXPECT_EQ(before["used_bytes"], 0);
    EXPECT_EQ(before["free_bytes"], 24 << 20);
    const std::string m = expect_error(add("big", 9100, big, {{"max_batch", 16}}), "bad_model");
    for (const char* part : {"model 'big'", "needs ", "arenas ", "batch sizes 1, 2, 4, 8, 16", "while loading the file ",
                             "and the upload buffer ", "budget 24.0 MiB",
                             "0 B in use", "--memory-budget"})
        EXPECT_NE(m.find(part), std::string::npos) << part << " in: " << m;
    // The same file planned for batch 1 fits; its figures are reported and counted.
    const json r = add("big", 9100, big, {{"max_batch", 1}});
    ASSERT_TRUE(r["ok"].get<bool>()) << r.dump();
    const json mem = r["result"]["memory"];
    EXPECT_GT(mem["instance_bytes"].get<int64_t>(), 6 << 20) << mem.dump();
    EXPECT_EQ(mem["shared_weights"], false);
    const json used = call({{"v", 1}, {"op", "health"}})["result"]["memory"];
    EXPECT_EQ(used["used_bytes"], mem["total_bytes"]) << used.dump();
    EXPECT_EQ(used["free_bytes"].get<int64_t>(), (24 << 20) - mem["total_bytes"].get<int64_t>());
    // Growing it past the budget is refused too, and leaves it as it was.
    const std::string grow = expect_error(call({{"v", 1}, {"op", "set"}, {"name", "big"}, {"max_batch", 16}}), "bad_model");
    EXPECT_NE(grow.find("more for arenas of batch sizes 2, 4, 8, 16"), std::string::npos) << grow;
    const json d = call({{"v", 1}, {"op", "describe"}, {"name", "big"}});
    EXPECT_EQ(d["result"]["max_batch"], 1);
    EXPECT_EQ(d["result"]["memory"]["instance_bytes"], mem["instance_bytes"]);
    // Removing it gives the memory back.
    ASSERT_TRUE(call({{"v", 1}, {"op", "remove_model"}, {"name", "big"}})["ok"].get<bool>());
    EXPECT_EQ(call({{"v", 1}, {"op", "health"}})["result"]["memory"]["used_bytes"], 0);
}

// The admission figure comes from the planner: for every batch size it is what the instance
// then holds (inputs exactly; the gather list at the data plane's worst case), the lane's
// instances share one arena as large as the largest plan's, and a second IF of the same file
// counts its weights once.
TEST_F(control_test, the_footprint_is_what_the_instances_then_hold_and_shared_weights_count_once) {
    const std::string file = write_activation_model(_dir / "activations.onnx", {1, 3, 64, 48});
    const std::vector<int64_t> sizes = {1, 2, 4, 5};
    const std::vector<std::vector<int64_t>> lanes{sizes};
    const ml::memory_footprint f = _runtime->footprint(ml::import_onnx(file), lanes, ifm::model_if::segments_per_request);
    ASSERT_EQ(f.instances.size(), sizes.size());
    ASSERT_EQ(f.arenas.size(), 1u);
    // Each size with an arena of its own would hold about 12x the batch-1 arena in all (1 + 2 +
    // 4 + 5); the lane holds one the size of batch 5's.
    const ml::memory_footprint alone = _runtime->footprint(ml::import_onnx(file), sizes, ifm::model_if::segments_per_request);
    EXPECT_LT(f.instance_bytes(), alone.instance_bytes());
    const json r = add("act", 9100, file, {{"max_batch", 5}});
    ASSERT_TRUE(r["ok"].get<bool>()) << r.dump();
    const json& held = r["result"]["instances"];
    ASSERT_EQ(held.size(), sizes.size()) << held.dump();
    for (size_t i = 0; i < sizes.size(); ++i) {
        EXPECT_EQ(held[i]["batch"], sizes[i]);
        // Nothing ran yet: the gather list is not allocated, the rest is exactly the estimate.
        EXPECT_EQ(held[i]["bytes"].get<int64_t>(),
                  f.instances[i].second - ml::runtime::gather_list_bytes(sizes[i], ifm::model_if::segments_per_request))
            << "batch " << sizes[i];
    }
    const json& arenas = r["result"]["arenas"];
    ASSERT_EQ(arenas.size(), 1u) << arenas.dump();
    EXPECT_EQ(arenas[0]["bytes"].get<int64_t>(), f.arenas[0]);
    EXPECT_EQ(arenas[0]["batch_sizes"], json(sizes));

    const json a = add("a", 9101, _model, {{"max_batch", 2}});
    ASSERT_TRUE(a["ok"].get<bool>()) << a.dump();
    const int64_t weights = a["result"]["memory"]["weight_bytes"].get<int64_t>();
    const int64_t host = a["result"]["memory"]["host_bytes"].get<int64_t>();
    EXPECT_GT(weights, 0);
    EXPECT_GE(host, weights / 2);
    const int64_t used1 = call({{"v", 1}, {"op", "health"}})["result"]["memory"]["used_bytes"].get<int64_t>();
    const json b = add("b", 9102, _model, {{"max_batch", 2}});
    ASSERT_TRUE(b["ok"].get<bool>()) << b.dump();
    EXPECT_EQ(b["result"]["memory"]["shared_weights"], true);
    EXPECT_EQ(call({{"v", 1}, {"op", "describe"}, {"name", "a"}})["result"]["memory"]["shared_weights"], true);
    const int64_t used2 = call({{"v", 1}, {"op", "health"}})["result"]["memory"]["used_bytes"].get<int64_t>();
    EXPECT_EQ(used2 - used1, b["result"]["memory"]["instance_bytes"].get<int64_t>());
}

TEST_F(control_test, a_model_file_is_measured_before_it_is_read) {
    stop_daemon();
    _info.max_model_file_bytes = 64 << 20;
    _info.memory_budget_bytes = 1ull << 30;
    start_daemon();
    // 64 GiB of holes: reading or hashing it first would take minutes and the memory with it.
    const fs::path sparse = _dir / "huge.onnx";
    std::ofstream(sparse).put('x');
    fs::resize_file(sparse, 64ull << 30);
    const auto t0 = std::chrono::steady_clock::now();
    const std::string m = expect_error(add("huge", 9100, sparse.string()), "bad_model");
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
    EXPECT_NE(m.find("is 64.0 GiB; the largest model file this daemon reads is 64.0 MiB (--max-model-file)"),
              std::string::npos) << m;
    // Within the file limit but larger than the budget's free memory: refused before reading.
    fs::resize_file(sparse, 48 << 20);
    stop_daemon();
    _info.memory_budget_bytes = 32 << 20;
    start_daemon();
    const std::string b = expect_error(add("huge", 9100, sparse.string()), "bad_model");
    EXPECT_NE(b.find("reading " + sparse.string() + " needs 48.0 MiB; budget 32.0 MiB"), std::string::npos) << b;
    EXPECT_EQ(call({{"v", 1}, {"op", "health"}})["result"]["models"], 0);
}

TEST_F(control_test, a_model_file_that_is_a_fifo_or_a_directory_is_refused_naming_it_not_waited_on) {
    // Nothing ever writes the FIFO: opening it to read would wait for ever.
    const fs::path fifo = _dir / "fifo.onnx";
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_NE(expect_error(add("f", 9100, fifo.string()), "bad_model").find(fifo.string() + " is a FIFO, not a regular file"),
              std::string::npos);
    EXPECT_NE(expect_error(add("d", 9100, _dir.string()), "bad_model").find("is a directory, not a regular file"),
              std::string::npos);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
    EXPECT_EQ(call({{"v", 1}, {"op", "health"}})["result"]["models"], 0);
}

TEST_F(control_test, an_input_with_a_zero_or_absurd_dimension_is_refused_naming_it) {
    const std::vector<std::pair<std::vector<int64_t>, std::string>> cases = {
        {{1, 3, 0, 32}, "input 'x' f32 [1x3x0x32]: dimension 2 (H) is 0; an image input needs it in 1..65535"},
        {{1, 3, 32, 70000}, "dimension 3 (W) is 70000; an image input needs it in 1..65535"},
        {{0, 3, 32, 32}, "dimension 0 (N) is 0"},
        {{1, 0, 8}, "input 'x' f32 [1x0x8]: a tensor request's dims must each be 1..65535"},
        {{1, 70000, 8}, "a tensor request's dims must each be 1..65535"},
        {{1, 2, 2, 2, 2, 2}, "has rank 6"},
    };
    for (size_t i = 0; i < cases.size(); ++i) {
        const std::string file = write_activation_model(_dir / ("dims" + std::to_string(i) + ".onnx"), cases[i].first);
        const json r = add("d" + std::to_string(i), uint16_t(9100 + i), file);
        if (r["ok"].get<bool>()) {
            ADD_FAILURE() << "accepted " << ml::shape_str(cases[i].first);
            continue;
        }
        EXPECT_EQ(r["error"]["code"], "bad_model") << r.dump();
        const std::string m = r["error"]["message"];
        EXPECT_NE(m.find(cases[i].second), std::string::npos) << m;
        EXPECT_NE(m.find("model 'd" + std::to_string(i) + "'"), std::string::npos) << m;
    }
    EXPECT_EQ(call({{"v", 1}, {"op", "health"}})["result"]["models"], 0);
    // Any other f32 input of fixed dims is a tensor IF: [1, 5, 32, 32] takes 5x32x32 tensors.
    const std::string file = write_activation_model(_dir / "tensor.onnx", {1, 5, 32, 32});
    const json r = add("t", 9200, file);
    ASSERT_TRUE(r["ok"].get<bool>()) << r.dump();
    EXPECT_EQ(r["result"]["input_format"], "tensor_f32");
    EXPECT_EQ(r["result"]["tensor_dims"], json({5, 32, 32}));
}

// Kernel profiles (for DKP and prema): measured once when a model is added, as BE tasks through
// the scheduler, kept in the repository entry, reused at the next start, measured again when
// they were taken on another device.
TEST_F(control_test, kernel_profiles_are_measured_once_and_kept_in_the_repository) {
    stop_daemon();
    _info.profile_budget_ms = 60000;
    start_daemon();
    const json r = add("cam", 9100, _model, {{"max_batch", 2}});
    ASSERT_TRUE(r["ok"].get<bool>()) << r.dump();
    const json p = r["result"]["profile"];
    EXPECT_EQ(p["plans"], 2) << p.dump();  // batch sizes 1 and 2
    EXPECT_EQ(p["measured"], 2) << p.dump();
    EXPECT_EQ(p["not_profiled"], 0) << p.dump();
    const fs::path file = _dir / "repo" / "cam" / "profile.json";
    ASSERT_TRUE(fs::exists(file));
    std::ifstream in(file);
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    const reefline::dkp::model_profile stored = reefline::dkp::model_profile::parse(text);
    EXPECT_EQ(stored.device, "cpu");
    ASSERT_EQ(stored.plans.size(), 2u);
    const int64_t kernels = r["result"]["kernels"].get<int64_t>() - 1;  // without the gather kernel
    for (const auto& plan : stored.plans) {
        EXPECT_EQ(int64_t(plan.launches.size()), kernels) << plan.plan;
        for (const auto& l : plan.launches) EXPECT_GT(l.time_us, 0.0) << plan.plan << " " << l.node;
    }
    // The next start takes them from the repository.
    stop_daemon();
    start_daemon();
    json d = call({{"v", 1}, {"op", "describe"}, {"name", "cam"}})["result"]["profile"];
    EXPECT_EQ(d["from_repository"], 2) << d.dump();
    EXPECT_EQ(d["measured"], 0) << d.dump();
    // Another device's profile describes nothing here: measured again, and rewritten.
    std::ofstream(file) << "{\"device\": \"gpu 0\", \"plan\": \"b1\", \"key\": \"x\", \"launches\": []}";
    stop_daemon();
    start_daemon();
    d = call({{"v", 1}, {"op", "describe"}, {"name", "cam"}})["result"]["profile"];
    EXPECT_EQ(d["measured"], 2) << d.dump();
    std::ifstream again(file);
    const std::string text2((std::istreambuf_iterator<char>(again)), {});
    EXPECT_EQ(reefline::dkp::model_profile::parse(text2).device, "cpu");
}

TEST(byte_size, parses_what_operators_write_and_refuses_the_rest) {
    EXPECT_EQ(ifm::parse_byte_size("2G"), 2ull << 30);
    EXPECT_EQ(ifm::parse_byte_size("512M"), 512ull << 20);
    EXPECT_EQ(ifm::parse_byte_size("1.5GiB"), 3ull << 29);
    EXPECT_EQ(ifm::parse_byte_size("64k"), 64ull << 10);
    EXPECT_EQ(ifm::parse_byte_size("3 TB"), 3ull << 40);
    EXPECT_EQ(ifm::parse_byte_size("4096"), 4096u);
    for (const char* bad : {"", "G", "2X", "-1G", "0", "0.1", "nan", "inf", "0x10M", "1e30G", "2 G B", "2GiBs"})
        EXPECT_THROW(ifm::parse_byte_size(bad), std::invalid_argument) << bad;
    EXPECT_EQ(ifm::format_byte_size(3.1 * (1ull << 30)), "3.1 GiB");
    EXPECT_EQ(ifm::format_byte_size(98 << 20), "98.0 MiB");
    EXPECT_EQ(ifm::format_byte_size(512), "512 B");
    EXPECT_GT(ifm::read_available_memory().host_bytes, 0u);
}

// A /proc and cgroup tree of the test's own: meminfo, self/cgroup, self/mountinfo and the
// cgroup files they name.
struct fake_proc {
    fs::path root = fs::temp_directory_path() / ("available_memory_" + std::to_string(::getpid()) + "_" +
                                                  std::to_string(std::rand()));
    explicit fake_proc(uint64_t mem_available_kib) {
        fs::create_directories(root / "proc" / "self");
        write("proc/meminfo", "MemTotal: 99999999 kB\nMemAvailable: " + std::to_string(mem_available_kib) + " kB\n");
    }
    ~fake_proc() { fs::remove_all(root); }
    void write(const std::string& rel, const std::string& text) const {
        fs::create_directories((root / rel).parent_path());
        std::ofstream(root / rel) << text;
    }
    std::string proc() const { return (root / "proc").string(); }
    std::string at(const std::string& rel) const { return (root / rel).string(); }
};

TEST(available_memory, a_cgroup_v2_limit_up_the_tree_binds_and_reclaimable_cache_counts_as_free) {
    fake_proc p(20u << 20);  // the host: 20 GiB available
    p.write("proc/self/cgroup", "0::/kubepods/pod1/ctr\n");
    p.write("proc/self/mountinfo", "30 1 0:26 / " + p.at("cg") + " rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n");
    // The container has no limit; its pod has 3 GiB, 1.5 GiB charged of which 0.5 GiB is
    // inactive page cache.
    p.write("cg/kubepods/pod1/ctr/memory.max", "max\n");
    p.write("cg/kubepods/pod1/ctr/memory.current", "1000\n");
    p.write("cg/kubepods/pod1/memory.max", std::to_string(3ull << 30) + "\n");
    p.write("cg/kubepods/pod1/memory.current", std::to_string(3ull << 29) + "\n");
    p.write("cg/kubepods/pod1/memory.stat", "anon 100\ninactive_file " + std::to_string(1ull << 29) + "\nactive_file 7\n");
    const ifm::available_memory m = ifm::read_available_memory(p.proc());
    EXPECT_EQ(m.host_bytes, 20ull << 30);
    ASSERT_TRUE(m.cgroup_bytes.has_value());
    EXPECT_EQ(*m.cgroup_bytes, (3ull << 30) - (1ull << 30));
    EXPECT_EQ(m.bytes(), 2ull << 30);
    EXPECT_STREQ(m.source(), "cgroup");
    EXPECT_NE(m.describe().find("v2 " + p.at("cg/kubepods/pod1")), std::string::npos) << m.describe();
    EXPECT_NE(m.describe().find("limit 3.0 GiB"), std::string::npos) << m.describe();
}

TEST(available_memory, a_cgroup_v1_limit_seen_from_a_container_and_its_hierarchical_limit) {
    fake_proc p(8u << 20);
    // A container: its memory cgroup is the mount's root, the limit its parent's
    // (hierarchical_memory_limit).
    p.write("proc/self/cgroup", "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n");
    p.write("proc/self/mountinfo", "40 30 0:33 /docker/abc " + p.at("memory") +
                                       " rw,nosuid shared:5 - cgroup cgroup rw,memory\n"
                                       "41 30 0:34 /docker/abc " + p.at("cpu") + " rw - cgroup cgroup rw,cpu,cpuacct\n");
    p.write("memory/memory.limit_in_bytes", "9223372036854771712\n");
    p.write("memory/memory.usage_in_bytes", std::to_string(1ull << 30) + "\n");
    p.write("memory/memory.stat", "cache 5\nhierarchical_memory_limit " + std::to_string(3ull << 30) +
                                      "\ntotal_inactive_file 0\n");
    const ifm::available_memory m = ifm::read_available_memory(p.proc());
    ASSERT_TRUE(m.cgroup_bytes.has_value());
    EXPECT_EQ(*m.cgroup_bytes, 2ull << 30);
    EXPECT_EQ(m.bytes(), 2ull << 30);
    EXPECT_STREQ(m.source(), "cgroup");
}

TEST(available_memory, without_a_limit_the_host_decides) {
    fake_proc p(4u << 20);
    p.write("proc/self/cgroup", "0::/user.slice\n");
    p.write("proc/self/mountinfo", "30 1 0:26 / " + p.at("cg") + " rw - cgroup2 cgroup2 rw\n");
    p.write("cg/user.slice/memory.max", "max\n");
    p.write("cg/user.slice/memory.current", "123\n");
    const ifm::available_memory m = ifm::read_available_memory(p.proc());
    EXPECT_FALSE(m.cgroup_bytes.has_value());
    EXPECT_EQ(m.bytes(), 4ull << 30);
    EXPECT_STREQ(m.source(), "host");
    // A limit looser than the host's free memory: still the host.
    p.write("cg/user.slice/memory.max", std::to_string(64ull << 30) + "\n");
    const ifm::available_memory loose = ifm::read_available_memory(p.proc());
    ASSERT_TRUE(loose.cgroup_bytes.has_value());
    EXPECT_STREQ(loose.source(), "host");
    EXPECT_EQ(loose.bytes(), 4ull << 30);
}

}  // namespace
