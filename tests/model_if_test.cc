// A model IF end to end in one process: image requests as UDP fragments into a net_ring
// ethdev, reassembly, the gather kernel reading the payloads in place, the model on the cpu
// device, top-k responses out of the tx ring. Every answer must equal running the same image
// directly through libml (host-side normalisation + infer_batch), and bad requests get an
// error datagram that says why. Pools are full again at the end.
#include <gtest/gtest.h>
#include <rte_eth_ring.h>
#include <rte_ethdev.h>
#include <rte_ring.h>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <thread>

#include "ifmanager/model_if.h"
#include "tests/ring_port.h"
#include "tests/tiny_zoo.h"
#include "tools/reefgen/packet.h"
#include "tools/reefgen/payload.h"

namespace dp = reefline::dp;
namespace ml = reefline::ml;
namespace wire = reefline::wire;
namespace gen = reefline::reefgen;
namespace fs = std::filesystem;

namespace {

constexpr uint16_t port = 9100;

struct answer {
    wire::fields head;
    std::vector<std::pair<uint32_t, float>> topk;
    std::string message;
};

class model_if_test : public ::testing::Test {
protected:
    void SetUp() override {
        const char* zoo = std::getenv("REEFLINE_ZOO");
        if (!zoo) GTEST_SKIP() << "REEFLINE_ZOO (path of build/tools/zoo) not set";
        _dir = reefline::testing::write_tiny_zoo(zoo, "model_if_test", "resnet50_tiny");
        ASSERT_FALSE(_dir.empty()) << "the zoo tool failed";
        _ring = std::make_unique<reefline::testing::ring_port>("mif");
        ASSERT_GE(_ring->port_id, 0);
        _rx = _ring->rx;
        _tx = _ring->tx;
        auto c = _ring->config(8191, 1023);
        _plane = std::make_unique<dp::dataplane>(c);
        _device = reefline::gpu::make_cpu_device();
        _runtime = std::make_unique<ml::runtime>(*_device);
        _scheduler = std::make_unique<reefline::gpu::scheduler>(*_device);
        start_if([](reefline::ifm::model_if_config&) {});
    }

    template <typename F>
    void start_if(F&& adjust) {
        if (_if) {
            _plane->rx_offline(0);
            _plane->ifs().publish({});
            _if.reset();
        }
        reefline::ifm::model_if_config mc;
        mc.name = "resnet50_tiny";
        mc.onnx = (_dir / "resnet50_tiny.onnx").string();
        mc.udp_port = port;
        mc.settings.batching.max_batch = 4;
        adjust(mc);
        _if = std::make_unique<reefline::ifm::model_if>(*_plane, *_runtime, *_scheduler, mc);
        _plane->ifs().publish({_if->binding()});
        _plane->rx_online(0);
    }

    void TearDown() override {
        if (!_plane) return;
        _plane->flush(0);
        _plane->rx_offline(0);
        _if.reset();
        _scheduler.reset();
        rte_mempool* rx = _plane->eth().rx_pool();
        rte_mempool* tx = _plane->eth().tx_pool();
        _plane->eth().close();
        EXPECT_EQ(rte_mempool_avail_count(rx), rx->size);
        EXPECT_EQ(rte_mempool_avail_count(tx), tx->size);
        _plane.reset();
        _ring.reset();
        fs::remove_all(_dir);
    }

    void send_image(uint64_t id, const std::vector<uint8_t>& img, uint16_t h, uint16_t w, uint16_t c) {
        reefline::testing::enqueue_image(*_plane, _rx, id, port, img, h, w, c);
    }

    // Polls until `expected` answers came out (batches run asynchronously on the scheduler),
    // then a little longer to catch extra ones.
    std::vector<answer> pump_and_collect(size_t expected) {
        std::vector<answer> out;
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        for (int extra = 0; extra < 200 && std::chrono::steady_clock::now() < deadline;) {
            _plane->poll_rx(0);
            _if->poll();
            _plane->poll_tx();
            collect(out);
            if (out.size() >= expected) ++extra;
            std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
        return out;
    }

    void collect(std::vector<answer>& out) {
        void* obj;
        while (rte_ring_dequeue(_tx, &obj) == 0) {
            auto* m = static_cast<rte_mbuf*>(obj);
            const gen::parsed_frame p = gen::parse_frame({rte_pktmbuf_mtod(m, const uint8_t*), m->data_len});
            EXPECT_EQ(p.error, gen::frame_error::none);
            answer a;
            a.head = wire::decode(&p.header);
            if (a.head.kind == uint8_t(wire::kind::error)) {
                a.message.assign(p.fragment.begin(), p.fragment.end());
            } else {
                for (size_t j = 0; j + 8 <= p.fragment.size(); j += 8) {
                    uint32_t cls, bits;
                    std::memcpy(&cls, p.fragment.data() + j, 4);
                    std::memcpy(&bits, p.fragment.data() + j + 4, 4);
                    bits = ntohl(bits);
                    float score;
                    std::memcpy(&score, &bits, 4);
                    a.topk.push_back({ntohl(cls), score});
                }
            }
            out.push_back(a);
            rte_pktmbuf_free(m);
        }
    }

    void check_answers(const std::vector<answer>& answers, const std::vector<std::vector<uint8_t>>& images);

    // The reference: host-side u8 HWC -> normalised f32 NCHW, then libml directly.
    std::vector<float> reference_scores(const std::vector<uint8_t>& img) {
        const float mean[3] = {123.675f, 116.28f, 103.53f}, sd[3] = {58.395f, 57.12f, 57.375f};
        const int64_t h = _if->height(), w = _if->width(), c = _if->channels();
        ml::bytes_t b(size_t(c * h * w) * 4);
        auto* x = reinterpret_cast<float*>(b.data());
        for (int64_t p = 0; p < h * w; ++p)
            for (int64_t ch = 0; ch < c; ++ch) x[ch * h * w + p] = (float(img[size_t(p * c + ch)]) - mean[ch]) * (1.0f / sd[ch]);
        auto in = _runtime->link_model(_if->model());
        std::vector<ml::tensor> ys;
        _runtime->infer_batch(*in, std::vector<ml::tensor>{ml::tensor::make(ml::dtype::f32, {1, c, h, w}, std::move(b))}, ys);
        auto v = ys[0].view<float>();
        return {v.begin(), v.end()};
    }

    fs::path _dir;
    std::unique_ptr<reefline::testing::ring_port> _ring;
    rte_ring* _rx = nullptr;
    rte_ring* _tx = nullptr;
    std::unique_ptr<dp::dataplane> _plane;
    std::unique_ptr<reefline::gpu::device> _device;
    std::unique_ptr<ml::runtime> _runtime;
    std::unique_ptr<reefline::gpu::scheduler> _scheduler;
    std::unique_ptr<reefline::ifm::model_if> _if;
};

TEST_F(model_if_test, answers_equal_libml_on_the_same_images) {
    const uint16_t h = _if->height(), w = _if->width(), c = _if->channels();
    const auto images = reefline::testing::random_images(6, size_t(h) * w * c, 7);
    for (size_t i = 0; i < images.size(); ++i) send_image(1000 + i, images[i], h, w, c);
    const auto answers = pump_and_collect(images.size());
    ASSERT_EQ(answers.size(), images.size());
    check_answers(answers, images);
    EXPECT_EQ(_if->counters().responses_sent.get(), images.size());
}

// Fixed batches of 4 with 3 requests: the batch is padded (the last image repeated) and
// the padding changes no answer.
TEST_F(model_if_test, padded_batches_give_the_same_answers) {
    start_if([](reefline::ifm::model_if_config& c) {
        c.settings.batching.policy = ml::batching_policy::fixed;
        c.settings.batching.fixed_batch = 4;
        c.settings.batching.min_batch = 3;
    });
    const uint16_t h = _if->height(), w = _if->width(), c = _if->channels();
    const auto images = reefline::testing::random_images(3, size_t(h) * w * c, 9);
    for (size_t i = 0; i < images.size(); ++i) send_image(1000 + i, images[i], h, w, c);
    const auto answers = pump_and_collect(images.size());
    ASSERT_EQ(answers.size(), images.size());
    check_answers(answers, images);
    const auto st = _if->stats();
    EXPECT_EQ(st["batches_total"], 1);
    // One batch: every request waited for it, so the exact maximum is positive and at least
    // the interpolated median's bucket floor; the histogram counts all three.
    EXPECT_EQ(st["latency_seconds"]["count"], 3);
    EXPECT_GT(st["latency_ms"]["max"].get<double>(), 0.0);
    EXPECT_LE(st["latency_ms"]["max"].get<double>(), 1e3 * st["latency_seconds"]["sum"].get<double>());
    for (const char* p : {"p50", "p90", "p99"}) EXPECT_LE(st["latency_ms"][p], st["latency_ms"]["max"]) << p;
}

// The settings the end-to-end test uses: RT class, SLAB up to 16.
TEST_F(model_if_test, rt_slab_answers_equal_libml) {
    start_if([](reefline::ifm::model_if_config& c) {
        c.settings.cls = reefline::gpu::task_class::rt;
        c.settings.batching.max_batch = 16;
    });
    const uint16_t h = _if->height(), w = _if->width(), c = _if->channels();
    const auto images = reefline::testing::random_images(7, size_t(h) * w * c, 11);
    for (size_t i = 0; i < images.size(); ++i) send_image(1000 + i, images[i], h, w, c);
    const auto answers = pump_and_collect(images.size());
    ASSERT_EQ(answers.size(), images.size());
    check_answers(answers, images);
}

TEST_F(model_if_test, reefgen_images_answer_equal_libml) {
    const uint16_t h = _if->height(), w = _if->width(), c = _if->channels();
    gen::payload_options po;
    po.shape = {h, w, c};
    po.seed = 21;
    gen::payload_source src(po);
    std::vector<std::vector<uint8_t>> images;
    for (uint64_t i = 0; i < 3; ++i) images.push_back(src.make(i).bytes);
    for (size_t i = 0; i < images.size(); ++i) send_image(1000 + i, images[i], h, w, c);
    const auto answers = pump_and_collect(images.size());
    ASSERT_EQ(answers.size(), images.size());
    check_answers(answers, images);
}

// An SLO no batch can meet: every request is answered with status overloaded, none served late.
TEST_F(model_if_test, requests_that_cannot_meet_the_slo_are_shed) {
    start_if([](reefline::ifm::model_if_config& c) { c.settings.batching.slo_ms = 0.001; });
    const uint16_t h = _if->height(), w = _if->width(), c = _if->channels();
    std::vector<uint8_t> img(size_t(h) * w * c, 3);
    for (uint64_t i = 0; i < 5; ++i) send_image(i, img, h, w, c);
    const auto answers = pump_and_collect(5);
    ASSERT_EQ(answers.size(), 5u);
    for (const answer& a : answers) {
        EXPECT_EQ(a.head.kind, uint8_t(wire::kind::error));
        EXPECT_EQ(a.head.status, uint8_t(wire::status::overloaded)) << a.message;
    }
    EXPECT_EQ(_if->stats()["shed_total"], 5);
    EXPECT_EQ(_if->stats()["responses_total"], 0);
}

// Requests from an RT source run as RT tasks in a BE IF; `update` moves the whole IF to RT.
TEST_F(model_if_test, rt_sources_and_class_changes_reach_the_scheduler) {
    const uint16_t h = _if->height(), w = _if->width(), c = _if->channels();
    std::vector<uint8_t> img(size_t(h) * w * c, 5);
    send_image(1, img, h, w, c);
    ASSERT_EQ(pump_and_collect(1).size(), 1u);
    EXPECT_EQ(_scheduler->stats().completed_be, 1u);
    EXPECT_EQ(_scheduler->stats().completed_rt, 0u);
    auto s = _if->settings();
    s.rt_sources_be = {htonl(reefline::testing::camera_ip)};
    _if->update(s);
    send_image(2, img, h, w, c);
    ASSERT_EQ(pump_and_collect(1).size(), 1u);
    EXPECT_EQ(_scheduler->stats().completed_rt, 1u);
    s.rt_sources_be.clear();
    s.cls = reefline::gpu::task_class::rt;
    _if->update(s);
    send_image(3, img, h, w, c);
    ASSERT_EQ(pump_and_collect(1).size(), 1u);
    EXPECT_EQ(_scheduler->stats().completed_rt, 2u);
    EXPECT_EQ(_scheduler->stats().completed_be, 1u);
    EXPECT_THROW({
        s.batching.min_batch = 9;
        _if->update(s);
    }, std::invalid_argument);
}

void model_if_test::check_answers(const std::vector<answer>& answers, const std::vector<std::vector<uint8_t>>& images) {
    for (const answer& a : answers) {
        ASSERT_EQ(a.head.kind, uint8_t(wire::kind::response)) << a.message;
        ASSERT_EQ(a.head.format, uint8_t(wire::format::result_topk));
        const size_t i = size_t(a.head.request_id - 1000);
        ASSERT_LT(i, images.size());
        const std::vector<float> want = reference_scores(images[i]);
        ASSERT_EQ(a.topk.size(), std::min<size_t>(5, want.size()));
        for (size_t j = 0; j < a.topk.size(); ++j) {
            EXPECT_NEAR(a.topk[j].second, want[a.topk[j].first], 1e-4f * (1 + std::fabs(want[a.topk[j].first])));
            if (j) EXPECT_GE(a.topk[j - 1].second, a.topk[j].second);
        }
        const float best = *std::max_element(want.begin(), want.end());
        EXPECT_NEAR(a.topk[0].second, best, 1e-4f * (1 + std::fabs(best)));
    }
}

TEST_F(model_if_test, wrong_shape_gets_an_error_naming_it) {
    std::vector<uint8_t> img(16 * 16 * 3, 7);
    send_image(77, img, 16, 16, 3);
    const auto answers = pump_and_collect(1);
    ASSERT_EQ(answers.size(), 1u);
    EXPECT_EQ(answers[0].head.kind, uint8_t(wire::kind::error));
    EXPECT_EQ(answers[0].head.status, uint8_t(wire::status::bad_request));
    EXPECT_NE(answers[0].message.find("16x16x3"), std::string::npos) << answers[0].message;
    EXPECT_EQ(_if->counters().error_responses.get(), 1u);
}

}  // namespace
