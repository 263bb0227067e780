// The whole appliance in-process (ifmanager/appliance.h), as the daemon runs it, on a net_ring
// port: start, serve a request through the crc32 IF, stop with every mbuf back in its pool; and
// a start that fails on a bad model file says why and leaves the process able to start another.
#include <gtest/gtest.h>

#include <arpa/inet.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "clients/c/wire/crc32c.h"
#include "ifmanager/appliance.h"
#include "tests/ring_port.h"

namespace {

namespace fs = std::filesystem;
namespace gen = reefline::reefgen;
namespace wire = reefline::wire;
using reefline::ifm::appliance;
using reefline::ifm::appliance_config;

constexpr uint16_t crc32_port = 9000;

class appliance_test : public ::testing::Test {
protected:
    void SetUp() override {
        _dir = fs::temp_directory_path() / ("reefline-appliance-" + std::to_string(::getpid()));
        fs::create_directories(_dir);
    }
    void TearDown() override { fs::remove_all(_dir); }

    appliance_config config(const reefline::testing::ring_port& port) const {
        appliance_config c;
        c.dataplane = port.config();
        c.builtins.push_back({"crc32", crc32_port});
        c.repo_dir = (_dir / "models").string();
        c.control.endpoint = "ipc://" + (_dir / "control").string();
        c.memory_budget = uint64_t(256) << 20;
        c.backend_options.compute_units = 1;
        c.duration_s = 20;  // a safety net: the tests raise their stop flag long before
        return c;
    }

    fs::path _dir;
};

TEST_F(appliance_test, serves_a_request_and_returns_every_mbuf_at_stop) {
    reefline::testing::ring_port port("appl");
    ASSERT_GE(port.port_id, 0);
    appliance a(config(port));
    a.start();

    gen::request_payload payload;
    payload.format = wire::format::image_u8_hwc;
    payload.dims[0] = 10;
    payload.dims[1] = 100;
    payload.dims[2] = 3;
    payload.bytes.resize(3000);
    std::mt19937 rng(7);
    for (auto& b : payload.bytes) b = uint8_t(rng());
    reefline::testing::enqueue_request(a.plane(), port.rx, 42, crc32_port, payload);

    // The answer is taken off the tx ring (and its mbuf freed) by another thread while this
    // one, the EAL lcore, serves; serving stops once it is in.
    std::atomic<bool> answered{false};
    wire::fields head{};
    uint32_t length = 0, crc = 0;
    std::thread collector([&] {
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
        while (!answered.load() && std::chrono::steady_clock::now() < until) {
            void* obj;
            if (rte_ring_dequeue(port.tx, &obj) != 0) {
                std::this_thread::sleep_for(std::chrono::microseconds(100));
                continue;
            }
            auto* m = static_cast<rte_mbuf*>(obj);
            const gen::parsed_frame p = gen::parse_frame({rte_pktmbuf_mtod(m, const uint8_t*), m->data_len});
            if (p.error == gen::frame_error::none && p.fragment.size() == 8) {
                head = wire::decode(&p.header);
                std::memcpy(&length, p.fragment.data(), 4);
                std::memcpy(&crc, p.fragment.data() + 4, 4);
                answered.store(true);
            }
            rte_pktmbuf_free(m);
        }
        answered.store(true);  // given up: serve() must return either way
    });
    a.serve(answered);
    collector.join();

    EXPECT_EQ(head.kind, uint8_t(wire::kind::response));
    EXPECT_EQ(head.request_id, 42u);
    EXPECT_EQ(head.format, uint8_t(wire::format::result_crc32));
    EXPECT_EQ(ntohl(length), 3000u);
    EXPECT_EQ(ntohl(crc), reefline::crc32c(payload.bytes.data(), payload.bytes.size()));

    const reefline::ifm::appliance_report report = a.stop();
    EXPECT_EQ(report.counters.requests_completed, 1u);
    EXPECT_EQ(report.counters.responses_sent, 1u);
    EXPECT_EQ(report.counters.drops_total(), 0u);
    EXPECT_EQ(report.mbufs_in_use, 0u) << report.json();
    EXPECT_NE(report.json().find("\"mbufs_in_use_at_exit\":0"), std::string::npos) << report.json();
    EXPECT_THROW(a.stop(), std::logic_error);
}

TEST_F(appliance_test, a_start_that_fails_names_the_problem_and_releases_everything) {
    {
        reefline::testing::ring_port port("applbad");
        appliance_config c = config(port);
        c.models.push_back({{"name", "broken"}, {"port", 9001}, {"onnx", (_dir / "missing.onnx").string()}, {"max_batch", 1}});
        appliance a(std::move(c));
        try {
            a.start();
            ADD_FAILURE() << "start() accepted a model file that does not exist";
        } catch (const std::exception& e) {
            EXPECT_NE(std::string(e.what()).find("missing.onnx"), std::string::npos) << e.what();
        }
    }
    // Nothing of the failed start is left holding the control endpoint or the lcores.
    reefline::testing::ring_port port("applgood");
    appliance a(config(port));
    ASSERT_NO_THROW(a.start());
    EXPECT_EQ(a.stop().mbufs_in_use, 0u);
}

}  // namespace
