// A model IF end to end in one process: image requests as UDP fragments into a net_ring
// ethdev, reassembly, the gather kernel reading the payloads in place, the model on the cpu
// device, top-k responses out of the tx ring. Every answer must equal running the same image
// directly through libml (host-side normalisation + infer_batch), and bad requests get an
// error datagram that says why. Pools are full again at the end.
#include <gtest/gtest.h>
#include <rte_eth_ring.h>
#include <rte_ethdev.h>
#include <rte_ring.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <random>
#include <thread>

#include "ifmanager/model_if.h"
#include "tests/onnx_builder.h"
#include "tests/ring_port.h"
#include "tests/tiny_zoo.h"
#include "tools/reefgen/packet.h"
#include "tools/reefgen/payload.h"

namespace dp = reefline::dp;
namespace ml = reefline::ml;
namespace ifm = reefline::ifm;
namespace wire = reefline::wire;
namespace gen = reefline::reefgen;
namespace fs = std::filesystem;

namespace {

constexpr uint16_t port = 9100;

struct answer {
    wire::fields head;
    std::vector<std::pair<uint32_t, float>> topk;
    std::vector<float> tensor;  // result_tensor_f32 (one datagram's worth)
    std::string message;
};

reefline::reefgen::request_payload token_payload(const std::vector<int32_t>& tokens) {
    reefline::reefgen::request_payload p;
    p.format = wire::format::tokens_i32;
    p.dims[0] = uint16_t(tokens.size());
    p.bytes.resize(tokens.size() * 4);
    for (size_t i = 0; i < tokens.size(); ++i) reefline::reefgen::store_token(p.bytes.data() + 4 * i, tokens[i]);
    return p;
}

class model_if_test : public ::testing::Test {
protected:
    void SetUp() override {
        const char* zoo = std::getenv("REEFLINE_ZOO");
        if (!zoo) GTEST_SKIP() << "REEFLINE_ZOO (path of build/tools/zoo) not set";
        _dir = reefline::testing::write_tiny_zoo(zoo, "model_if_test", "resnet50_tiny,distilbert_tiny,sensor_tcn_tiny");
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
            } else if (a.head.format == uint8_t(wire::format::result_tensor_f32)) {
                a.tensor.resize(p.fragment.size() / 4);
                std::memcpy(a.tensor.data(), p.fragment.data(), a.tensor.size() * 4);
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

    // Serves (this thread is the EAL lcore that owns the rx queue) and collects answers until
    // `done` or a minute; with `answered_at`, when each answer came out.
    void serve(std::vector<answer>& answers, const std::function<bool()>& done,
               std::vector<std::chrono::steady_clock::time_point>* answered_at = nullptr) {
        using clock = std::chrono::steady_clock;
        const auto deadline = clock::now() + std::chrono::seconds(60);
        while (!done() && clock::now() < deadline) {
            _plane->poll_rx(0);
            _if->poll();
            _plane->poll_tx();
            const size_t before = answers.size();
            collect(answers);
            if (answered_at) answered_at->resize(answers.size(), clock::now());
            if (answers.size() == before) std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
    }

    // The reference: host-side u8 HWC -> normalised f32 NCHW, then libml directly.
    std::vector<float> reference_scores(const std::vector<uint8_t>& img, std::shared_ptr<ml::model> model = nullptr) {
        const float mean[3] = {123.675f, 116.28f, 103.53f}, sd[3] = {58.395f, 57.12f, 57.375f};
        const int64_t h = _if->input().height, w = _if->input().width, c = _if->input().channels;
        ml::bytes_t b(size_t(c * h * w) * 4);
        auto* x = reinterpret_cast<float*>(b.data());
        for (int64_t p = 0; p < h * w; ++p)
            for (int64_t ch = 0; ch < c; ++ch) x[ch * h * w + p] = (float(img[size_t(p * c + ch)]) - mean[ch]) * (1.0f / sd[ch]);
        auto in = _runtime->link_model(model ? model : _if->model());
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
    const uint16_t h = uint16_t(_if->input().height), w = uint16_t(_if->input().width), c = uint16_t(_if->input().channels);
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
        c.settings.batching.policy = ifm::batching_policy::fixed;
        c.settings.batching.fixed_batch = 4;
        c.settings.batching.min_batch = 3;
    });
    const uint16_t h = uint16_t(_if->input().height), w = uint16_t(_if->input().width), c = uint16_t(_if->input().channels);
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
    const uint16_t h = uint16_t(_if->input().height), w = uint16_t(_if->input().width), c = uint16_t(_if->input().channels);
    const auto images = reefline::testing::random_images(7, size_t(h) * w * c, 11);
    for (size_t i = 0; i < images.size(); ++i) send_image(1000 + i, images[i], h, w, c);
    const auto answers = pump_and_collect(images.size());
    ASSERT_EQ(answers.size(), images.size());
    check_answers(answers, images);
}

TEST_F(model_if_test, reefgen_images_answer_equal_libml) {
    const uint16_t h = uint16_t(_if->input().height), w = uint16_t(_if->input().width), c = uint16_t(_if->input().channels);
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
    const uint16_t h = uint16_t(_if->input().height), w = uint16_t(_if->input().width), c = uint16_t(_if->input().channels);
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

// Under the abacus policy a batch carries its oldest request's deadline: one the scheduler sees
// it cannot meet is dropped, and every request in it answered deadline_exceeded (with shedding
// off, so that the IF itself does not answer them overloaded first); with time to spare the
// answers are libml's.
TEST_F(model_if_test, abacus_drops_hopeless_batches_and_serves_the_rest) {
    _plane->rx_offline(0);
    _plane->ifs().publish({});
    _if.reset();
    reefline::gpu::scheduler_options o;
    o.pol = reefline::gpu::policy::abacus;
    _scheduler = std::make_unique<reefline::gpu::scheduler>(*_device, o);
    start_if([](reefline::ifm::model_if_config& c) {
        c.settings.batching.slo_ms = 0.001;
        c.settings.shed = false;
    });
    const uint16_t h = uint16_t(_if->input().height), w = uint16_t(_if->input().width), c = uint16_t(_if->input().channels);
    const auto images = reefline::testing::random_images(5, size_t(h) * w * c, 19);
    for (uint64_t i = 0; i < 5; ++i) send_image(i, images[i], h, w, c);
    auto answers = pump_and_collect(5);
    ASSERT_EQ(answers.size(), 5u);
    for (const answer& a : answers) {
        EXPECT_EQ(a.head.kind, uint8_t(wire::kind::error));
        EXPECT_EQ(a.head.status, uint8_t(wire::status::deadline_exceeded)) << a.message;
        EXPECT_NE(a.message.find("could not finish within"), std::string::npos) << a.message;
    }
    EXPECT_EQ(_if->stats()["deadline_exceeded_total"], 5);
    EXPECT_EQ(_if->stats()["shed_total"], 0);
    EXPECT_GE(_scheduler->stats().abacus_dropped, 1u);

    start_if([](reefline::ifm::model_if_config& c) { c.settings.batching.slo_ms = 5000; });
    for (size_t i = 0; i < images.size(); ++i) send_image(1000 + i, images[i], h, w, c);
    answers = pump_and_collect(images.size());
    ASSERT_EQ(answers.size(), images.size());
    check_answers(answers, images);
    EXPECT_EQ(_if->stats()["deadline_exceeded_total"], 0);
    EXPECT_GE(_scheduler->stats().abacus_groups, 1u);
}

// Shedding rests on the controller's prediction, which only batches that run refresh: a lane
// that has run nothing for half a second serves its next request whatever the prediction says
// (a probe), so a prediction learned in a slow spell cannot shed every request for good.
TEST_F(model_if_test, a_lane_that_sheds_everything_probes_the_device_again) {
    start_if([](reefline::ifm::model_if_config& c) { c.settings.batching.slo_ms = 0.001; });
    const uint16_t h = uint16_t(_if->input().height), w = uint16_t(_if->input().width), c = uint16_t(_if->input().channels);
    std::vector<uint8_t> img(size_t(h) * w * c, 4);
    for (uint64_t i = 0; i < 3; ++i) send_image(i, img, h, w, c);
    auto answers = pump_and_collect(3);
    ASSERT_EQ(answers.size(), 3u);
    for (const answer& a : answers) EXPECT_EQ(a.head.status, uint8_t(wire::status::overloaded)) << a.message;
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    send_image(10, img, h, w, c);
    answers = pump_and_collect(1);
    ASSERT_EQ(answers.size(), 1u);
    EXPECT_EQ(answers[0].head.kind, uint8_t(wire::kind::response)) << "the probe ran: " << answers[0].message;
    send_image(11, img, h, w, c);  // right after the probe: shed again (the probe was late too)
    answers = pump_and_collect(1);
    ASSERT_EQ(answers.size(), 1u);
    EXPECT_EQ(answers[0].head.status, uint8_t(wire::status::overloaded));
    EXPECT_EQ(_if->stats()["shed_total"], 4);
    EXPECT_EQ(_if->stats()["responses_total"], 1);
}

// Requests from an RT source run as RT tasks in a BE IF; `update` moves the whole IF to RT.
TEST_F(model_if_test, rt_sources_and_class_changes_reach_the_scheduler) {
    const uint16_t h = uint16_t(_if->input().height), w = uint16_t(_if->input().width), c = uint16_t(_if->input().channels);
    std::vector<uint8_t> img(size_t(h) * w * c, 5);
    send_image(1, img, h, w, c);
    ASSERT_EQ(pump_and_collect(1).size(), 1u);
    EXPECT_EQ(_scheduler->stats().completed_be, 1u);
    EXPECT_EQ(_scheduler->stats().completed_rt, 0u);
    auto s = _if->settings();
    s.rt_sources_be = {htonl(reefline::testing::camera_ip)};
    _if->update(s);  // plans the RT lane, warming it up with BE tasks
    const uint64_t be_after_update = _scheduler->stats().completed_be;
    EXPECT_GT(be_after_update, 1u) << "the RT lane's warm-up ran outside the scheduler";
    send_image(2, img, h, w, c);
    ASSERT_EQ(pump_and_collect(1).size(), 1u);
    EXPECT_EQ(_scheduler->stats().completed_rt, 1u);
    s.rt_sources_be.clear();
    s.cls = reefline::gpu::task_class::rt;
    _if->update(s);
    send_image(3, img, h, w, c);
    ASSERT_EQ(pump_and_collect(1).size(), 1u);
    EXPECT_EQ(_scheduler->stats().completed_rt, 2u);
    EXPECT_EQ(_scheduler->stats().completed_be, be_after_update);
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
            if (j) {
                EXPECT_GE(a.topk[j - 1].second, a.topk[j].second);
            }
        }
        const float best = *std::max_element(want.begin(), want.end());
        EXPECT_NEAR(a.topk[0].second, best, 1e-4f * (1 + std::fabs(best)));
    }
}

// A `set` that adds batch sizes builds them on the side, like GSLICE's shadow IF: requests go
// on being answered while the new instances are planned and warmed up (before, the IF was held
// for all of it and nothing was served), every answer equals libml, none is lost or doubled,
// the switch-over holds the IF for a small part of the change, and the same image alone
// answers bit-identically before and after it. The sender and the change run on threads of
// their own; this thread serves (the EAL lcore that owns the rx queue).
TEST_F(model_if_test, set_plans_on_the_side_while_requests_are_answered) {
    using clock = std::chrono::steady_clock;
    start_if([](reefline::ifm::model_if_config& c) {
        c.settings.batching.max_batch = 1;
        c.settings.shed = false;  // every request served, however long it waited
    });
    const uint16_t h = uint16_t(_if->input().height), w = uint16_t(_if->input().width), c = uint16_t(_if->input().channels);
    auto images = reefline::testing::random_images(400, size_t(h) * w * c, 13);
    std::vector<answer> answers;
    std::vector<clock::time_point> answered_at;
    auto serve_until = [&](const std::function<bool()>& done) { serve(answers, done, &answered_at); };
    // Before: image 0 alone.
    send_image(1000, images[0], h, w, c);
    serve_until([&] { return answers.size() >= 1; });
    ASSERT_EQ(answers.size(), 1u);

    reefline::ifm::model_settings s = _if->settings();
    s.batching.max_batch = 64;  // plans and warms up batch sizes 2, 4, 8, 16, 32 and 64
    std::atomic<bool> changed{false}, stop_sending{false};
    std::atomic<size_t> sent{1};
    clock::time_point change_start, change_end;
    std::thread control([&] {
        change_start = clock::now();
        _if->update(s);
        change_end = clock::now();
        changed = true;
    });
    // A request every 2 ms until the change is done (ids 1001..), at most 390.
    std::thread sender([&] {
        while (!stop_sending && sent < 390) {
            send_image(1000 + sent, images[sent], h, w, c);
            ++sent;
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
    });
    serve_until([&] { return changed.load(); });
    stop_sending = true;
    sender.join();
    control.join();
    ASSERT_TRUE(changed.load());
    serve_until([&] { return answers.size() >= sent; });
    // After: image 0 alone again.
    images[sent] = images[0];
    const size_t again = sent;
    send_image(1000 + again, images[again], h, w, c);
    serve_until([&] { return answers.size() >= again + 1; });
    serve_until([&, until = clock::now() + std::chrono::milliseconds(100)] { return clock::now() > until; });

    ASSERT_EQ(answers.size(), again + 1) << "lost or doubled answers";
    std::set<uint64_t> ids;
    for (const answer& a : answers) ids.insert(a.head.request_id);
    EXPECT_EQ(ids.size(), answers.size()) << "a request was answered twice";
    check_answers(answers, images);
    const double change_ms = std::chrono::duration<double, std::milli>(change_end - change_start).count();
    size_t during = 0;
    for (const auto& t : answered_at) during += t > change_start && t < change_end;
    std::printf("the change took %.1f ms; %zu of %zu requests answered while it ran\n", change_ms, during, sent.load() - 1);
    EXPECT_GT(during, 0u) << "nothing was answered during the " << change_ms << " ms the change took";
    const auto st = _if->stats();
    EXPECT_EQ(st["settings_switches_total"], 1);
    EXPECT_LT(st["switch_us_max"].get<double>(), 100.0 * change_ms) << "the switch-over held the IF for most of the change";
    // The same image at batch 1 before and after: bit-identical scores.
    const answer* first = nullptr;
    const answer* last = nullptr;
    for (const answer& a : answers) {
        if (a.head.request_id == 1000) first = &a;
        if (a.head.request_id == 1000 + again) last = &a;
    }
    ASSERT_TRUE(first && last);
    ASSERT_EQ(first->topk.size(), last->topk.size());
    for (size_t j = 0; j < first->topk.size(); ++j) {
        EXPECT_EQ(first->topk[j].first, last->topk[j].first);
        EXPECT_EQ(std::memcmp(&first->topk[j].second, &last->topk[j].second, 4), 0) << "score " << j << " changed";
    }
    EXPECT_EQ(_if->settings().batching.max_batch, 64u);
}

// A new version of the model (the zoo's resnet50_tiny with other weights) replaces the old one
// as `set --onnx` does: planned and warmed up on the side while the IF serves, then switched
// over between two batches. No request is lost or answered twice; every answer equals libml on
// one of the two versions: the old one's until the switch, the new one's after it, never the
// old one's again. A model that takes other requests is refused, naming the difference.
TEST_F(model_if_test, a_new_model_version_takes_over_between_two_batches) {
    using clock = std::chrono::steady_clock;
    const fs::path v2_dir = _dir / "v2";
    const std::string cmd = std::string(std::getenv("REEFLINE_ZOO")) + " --out " + v2_dir.string() +
                            " --tiny --only resnet50_tiny --seed 2 -q";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    start_if([](reefline::ifm::model_if_config& c) {
        c.settings.batching.max_batch = 2;
        c.settings.shed = false;  // every request served, however long it waited
    });
    const std::shared_ptr<ml::model> v1 = _if->model();
    const std::shared_ptr<ml::model> v2 =
        _runtime->load_model((v2_dir / "resnet50_tiny.onnx").string(), reefline::ifm::model_if::import_options());
    const uint16_t h = uint16_t(_if->input().height), w = uint16_t(_if->input().width), c = uint16_t(_if->input().channels);
    const auto images = reefline::testing::random_images(300, size_t(h) * w * c, 17);
    std::vector<answer> answers;
    auto serve_until = [&](const std::function<bool()>& done) { serve(answers, done); };
    send_image(1000, images[0], h, w, c);
    serve_until([&] { return answers.size() >= 1; });

    std::atomic<bool> changed{false}, stop_sending{false};
    std::atomic<size_t> sent{1};
    std::thread sender([&] {
        while (sent < images.size() && !stop_sending) {
            send_image(1000 + sent, images[sent], h, w, c);
            ++sent;
            std::this_thread::sleep_for(std::chrono::milliseconds(3));
        }
    });
    serve_until([&] { return answers.size() >= 30; });  // the old version under traffic
    std::thread control([&] {
        _if->commit(_if->prepare(_if->settings(), v2));
        changed = true;
    });
    serve_until([&] { return changed.load(); });
    // Some requests after the switch, then every answer.
    const size_t at_switch = sent;
    serve_until([&] { return sent >= std::min(images.size(), at_switch + 20); });
    stop_sending = true;
    sender.join();
    control.join();
    serve_until([&] { return answers.size() >= sent; });
    serve_until([&, until = clock::now() + std::chrono::milliseconds(100)] { return clock::now() > until; });
    ASSERT_TRUE(changed.load());
    ASSERT_EQ(answers.size(), sent.load()) << "lost or doubled answers";
    std::set<uint64_t> ids;
    for (const answer& a : answers) ids.insert(a.head.request_id);
    EXPECT_EQ(ids.size(), answers.size()) << "a request was answered twice";

    const auto matches = [&](const answer& a, const std::shared_ptr<ml::model>& m) {
        const std::vector<float> want = reference_scores(images[size_t(a.head.request_id - 1000)], m);
        if (a.topk.size() != std::min<size_t>(5, want.size())) return false;
        for (const auto& [cls, score] : a.topk)
            if (cls >= want.size() || std::fabs(score - want[cls]) > 1e-4f * (1 + std::fabs(want[cls]))) return false;
        return true;
    };
    size_t old_answers = 0, new_answers = 0;
    for (const answer& a : answers) {  // in the order they were sent out
        ASSERT_EQ(a.head.kind, uint8_t(wire::kind::response)) << a.message;
        const bool old_one = matches(a, v1), new_one = matches(a, v2);
        ASSERT_NE(old_one, new_one) << "request " << a.head.request_id << " matches " << (old_one ? "both" : "neither");
        if (old_one) {
            EXPECT_EQ(new_answers, 0u) << "request " << a.head.request_id << " answered by the old model after the switch";
            ++old_answers;
        } else {
            ++new_answers;
        }
    }
    std::printf("%zu answers by the old version, %zu by the new one\n", old_answers, new_answers);
    EXPECT_GE(old_answers, 30u);
    EXPECT_GE(new_answers, 20u);
    EXPECT_EQ(_if->model(), v2);
    EXPECT_EQ(_if->stats()["settings_switches_total"], 1);

    const auto tokens = _runtime->load_model((_dir / "distilbert_tiny.onnx").string(), reefline::ifm::model_if::import_options());
    try {
        (void)_if->prepare(_if->settings(), tokens);
        ADD_FAILURE() << "a model of token requests replaced an image IF";
    } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("tokens_i32 instead of image_u8_hwc"), std::string::npos) << e.what();
    }
    EXPECT_EQ(_if->model(), v2);
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

// ---- sequence and tensor IFs ------------------------------------------------------------

// libml directly on host-built inputs at the request's own length, unpadded.
std::vector<float> sequence_reference(ml::runtime& rt, const std::string& onnx, const std::vector<int32_t>& tokens) {
    ml::import_options o;
    const int64_t n = int64_t(tokens.size());
    o.input_shapes = {{"input_ids", {1, n}}, {"attention_mask", {1, n}}};
    auto m = rt.load_model(onnx, o);
    auto in = rt.link_model(m);
    std::vector<int64_t> ids(tokens.begin(), tokens.end()), ones(tokens.size(), 1);
    std::vector<ml::tensor> ys;
    rt.infer_batch(*in, std::vector<ml::tensor>{ml::tensor::from_i64(ids, {1, n}), ml::tensor::from_i64(ones, {1, n})}, ys);
    auto v = ys[0].view<float>();
    return {v.begin(), v.end()};
}

TEST_F(model_if_test, token_sequences_of_any_length_answer_as_libml_and_bad_ones_get_errors) {
    const std::string onnx = (_dir / "distilbert_tiny.onnx").string();
    start_if([&](reefline::ifm::model_if_config& c) {
        c.name = "bert";
        c.onnx = onnx;
        c.settings.batching.max_batch = 8;
    });
    EXPECT_STREQ(_if->input().format_name(), "tokens_i32");
    EXPECT_EQ(_if->describe()["input_format"], "tokens_i32");
    EXPECT_EQ(_if->describe()["max_tokens"], 64);
    std::mt19937 rng(3);
    std::vector<std::vector<int32_t>> good;
    for (int len : {1, 7, 16, 17, 40, 64, 3, 33}) {
        std::vector<int32_t> t(static_cast<size_t>(len));
        for (auto& v : t) v = int32_t(rng() % 1024);
        good.push_back(t);
    }
    for (size_t i = 0; i < good.size(); ++i)
        reefline::testing::enqueue_request(*_plane, _rx, 1000 + i, port, token_payload(good[i]), 13);
    std::vector<int32_t> oov = good[4];
    oov[21] = 1024;
    reefline::testing::enqueue_request(*_plane, _rx, 2000, port, token_payload(oov));
    reefline::testing::enqueue_request(*_plane, _rx, 2001, port, token_payload(std::vector<int32_t>(65, 1)));
    reefline::testing::enqueue_image(*_plane, _rx, 2002, port, std::vector<uint8_t>(12, 0), 2, 2, 3);
    const auto answers = pump_and_collect(good.size() + 3);
    ASSERT_EQ(answers.size(), good.size() + 3);
    for (const answer& a : answers) {
        if (a.head.request_id >= 2000) {
            ASSERT_EQ(a.head.kind, uint8_t(wire::kind::error));
            const std::string want = a.head.request_id == 2000   ? "token 1024 at position 21 is outside the vocabulary [0, 1024)"
                                     : a.head.request_id == 2001 ? "expected 1..64 tokens, got 65"
                                                                 : "this IF takes tokens_i32 requests (1..64 tokens)";
            EXPECT_EQ(a.message, want);
            EXPECT_EQ(a.head.status, uint8_t(a.head.request_id == 2002 ? wire::status::unsupported_format : wire::status::bad_request));
            continue;
        }
        ASSERT_EQ(a.head.kind, uint8_t(wire::kind::response)) << a.message;
        const std::vector<float> want = sequence_reference(*_runtime, onnx, good[size_t(a.head.request_id - 1000)]);
        ASSERT_EQ(a.topk.size(), 5u);
        for (const auto& [cls, score] : a.topk) EXPECT_NEAR(score, want[cls], 1e-4f * (1 + std::fabs(want[cls])));
        EXPECT_NEAR(a.topk[0].second, *std::max_element(want.begin(), want.end()), 1e-4f);
    }
    EXPECT_GE(_if->stats()["batches_total"].get<int>(), 2) << "lengths 1..64 need more than one bucket";
}

TEST_F(model_if_test, sensor_tensors_answer_their_output_tensor) {
    start_if([&](reefline::ifm::model_if_config& c) {
        c.name = "sensor";
        c.onnx = (_dir / "sensor_tcn_tiny.onnx").string();
        c.settings.tensor_output = true;
    });
    EXPECT_STREQ(_if->input().format_name(), "tensor_f32");
    std::mt19937 rng(8);
    std::normal_distribution<float> nd;
    std::vector<std::vector<float>> windows(3, std::vector<float>(64 * 6));
    for (size_t i = 0; i < windows.size(); ++i) {
        for (auto& v : windows[i]) v = nd(rng);
        reefline::reefgen::request_payload p;
        p.format = wire::format::tensor_f32;
        p.dims[0] = 64;
        p.dims[1] = 6;
        p.bytes.resize(64 * 6 * 4);
        std::memcpy(p.bytes.data(), windows[i].data(), p.bytes.size());
        reefline::testing::enqueue_request(*_plane, _rx, 1000 + i, port, p, 100);
    }
    reefline::reefgen::request_payload wrong;
    wrong.format = wire::format::tensor_f32;
    wrong.dims[0] = 6;
    wrong.dims[1] = 64;
    wrong.bytes.assign(64 * 6 * 4, 0);
    reefline::testing::enqueue_request(*_plane, _rx, 2000, port, wrong);
    const auto answers = pump_and_collect(4);
    ASSERT_EQ(answers.size(), 4u);
    auto in = _runtime->link_model(_if->model());
    for (const answer& a : answers) {
        if (a.head.request_id == 2000) {
            EXPECT_EQ(a.head.status, uint8_t(wire::status::bad_request));
            EXPECT_EQ(a.message, "expected a tensor of dims 64x6, got 6x64");
            continue;
        }
        ASSERT_EQ(a.head.format, uint8_t(wire::format::result_tensor_f32)) << a.message;
        EXPECT_EQ(a.head.dims[0], 8);
        EXPECT_EQ(a.head.dims[1], 0);
        const auto& x = windows[size_t(a.head.request_id - 1000)];
        ml::bytes_t b(x.size() * 4);
        std::memcpy(b.data(), x.data(), b.size());
        std::vector<ml::tensor> ys;
        _runtime->infer_batch(*in, std::vector<ml::tensor>{ml::tensor::make(ml::dtype::f32, {1, 64, 6}, std::move(b))}, ys);
        const auto want = ys[0].view<float>();
        ASSERT_EQ(a.tensor.size(), want.size());
        for (size_t j = 0; j < want.size(); ++j) EXPECT_NEAR(a.tensor[j], want[j], 1e-5f * (1 + std::fabs(want[j])));
    }
}

}  // namespace

// ---- answers under transmit pressure -----------------------------------------------------

namespace {

// A tensor model whose answer is the largest a response can carry: y[N, 8, 45824] = x[N, 8, 4]
// x W, 8 x 45824 x 4 bytes = 1024 fragments of 1432 bytes (wire::max_fragments at a
// 1500-byte MTU).
constexpr int64_t big_rows = 8, big_k = 4, big_cols = 45824;

float big_weight(int64_t k, int64_t j) { return float((j % 97) - 48) * 0.01f + float(k) * 0.5f; }

fs::path write_big_answer_model(const fs::path& dir) {
    ml::test_models::builder b;
    b.input("x", {-1, big_rows, big_k});
    std::vector<float> w(size_t(big_k * big_cols));
    for (int64_t k = 0; k < big_k; ++k)
        for (int64_t j = 0; j < big_cols; ++j) w[size_t(k * big_cols + j)] = big_weight(k, j);
    b.init_f32("w", {big_k, big_cols}, w);
    b.node("MatMul", {"x", "w"}, {"y"});
    b.output("y", {-1, big_rows, big_cols});
    const fs::path path = dir / "big_answer.onnx";
    std::ofstream(path, std::ios::binary) << b.bytes();
    return path;
}

reefline::reefgen::request_payload big_request(uint64_t seed, std::vector<float>& x) {
    x.resize(size_t(big_rows * big_k));
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(int((seed * 7 + i * 3) % 11) - 5) * 0.25f;
    reefline::reefgen::request_payload p;
    p.format = wire::format::tensor_f32;
    p.dims[0] = uint16_t(big_rows);
    p.dims[1] = uint16_t(big_k);
    p.bytes.resize(x.size() * 4);
    std::memcpy(p.bytes.data(), x.data(), p.bytes.size());
    return p;
}

// Tensor answers reassembled from their datagrams, by request id.
struct reassembled {
    std::vector<float> values;
    std::set<uint16_t> fragments;
    uint16_t count = 0;
    uint16_t dims[4] = {};
    bool error = false;
    bool complete() const { return count && fragments.size() == count; }
};

}  // namespace

TEST_F(model_if_test, a_batch_of_the_largest_answers_is_delivered_whole_through_a_small_tx_pool) {
    const fs::path onnx = write_big_answer_model(_dir);
    constexpr uint32_t batch = 8;
    start_if([&](reefline::ifm::model_if_config& c) {
        c.name = "big";
        c.onnx = onnx.string();
        c.settings.tensor_output = true;
        c.settings.batching.policy = ifm::batching_policy::fixed;
        c.settings.batching.max_batch = batch;
        c.settings.batching.fixed_batch = batch;
        c.settings.shed = false;
    });
    // The fixture's tx pool holds 1023 mbufs: less than one answer's 1024 datagrams, an
    // eighth of the batch's.
    ASSERT_LT(_plane->eth().tx_pool()->size, wire::max_fragments);
    std::vector<std::vector<float>> xs(batch);
    for (uint32_t i = 0; i < batch; ++i) reefline::testing::enqueue_request(*_plane, _rx, 500 + i, port, big_request(i, xs[i]));

    std::map<uint64_t, reassembled> got;
    auto drain = [&] {
        void* obj;
        while (rte_ring_dequeue(_tx, &obj) == 0) {
            auto* m = static_cast<rte_mbuf*>(obj);
            const gen::parsed_frame p = gen::parse_frame({rte_pktmbuf_mtod(m, const uint8_t*), m->data_len});
            EXPECT_EQ(p.error, gen::frame_error::none);
            const wire::fields h = wire::decode(&p.header);
            reassembled& r = got[h.request_id];
            r.error |= h.kind == uint8_t(wire::kind::error);
            r.count = h.frag_count;
            std::copy(h.dims, h.dims + 4, r.dims);
            r.values.resize(h.total_length / 4);
            EXPECT_TRUE(r.fragments.insert(h.frag_index).second) << "fragment sent twice";
            if (!r.error) std::memcpy(reinterpret_cast<uint8_t*>(r.values.data()) + h.payload_offset, p.fragment.data(), p.fragment.size());
            rte_pktmbuf_free(m);
        }
    };
    auto all_complete = [&] {
        return got.size() == batch && std::all_of(got.begin(), got.end(), [](const auto& kv) { return kv.second.complete(); });
    };
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!all_complete() && std::chrono::steady_clock::now() < deadline) {
        _plane->poll_rx(0);
        _if->poll();
        _plane->poll_tx();
        drain();
    }
    ASSERT_EQ(got.size(), batch);
    for (uint32_t i = 0; i < batch; ++i) {
        const reassembled& r = got.at(500 + i);
        ASSERT_FALSE(r.error);
        ASSERT_EQ(r.count, wire::max_fragments) << "request " << 500 + i;
        ASSERT_TRUE(r.complete()) << "request " << 500 + i << ": " << r.fragments.size() << " of " << r.count << " datagrams";
        EXPECT_EQ(r.dims[0], big_rows);
        EXPECT_EQ(r.dims[1], big_cols);
        ASSERT_EQ(r.values.size(), size_t(big_rows * big_cols));
        for (int64_t row = 0; row < big_rows; ++row)
            for (int64_t j = 0; j < big_cols; j += 331) {
                float want = 0;
                for (int64_t k = 0; k < big_k; ++k) want += xs[i][size_t(row * big_k + k)] * big_weight(k, j);
                ASSERT_NEAR(r.values[size_t(row * big_cols + j)], want, 1e-4f * (1 + std::fabs(want)));
            }
    }
    const auto stats = _if->stats();
    EXPECT_EQ(stats["responses_total"], batch);
    EXPECT_EQ(stats["send_failures_total"], 0);
    EXPECT_EQ(stats["batches_total"], 1) << "one batch of eight";
    EXPECT_EQ(_if->queued(), 0u);
}

TEST_F(model_if_test, answers_a_port_never_takes_are_given_up_once_as_send_failures_and_the_if_recovers) {
    start_if([&](reefline::ifm::model_if_config& c) {
        c.settings.batching.max_batch = 4;
        c.settings.shed = false;
    });
    // No transmit buffer to be had (what a link that is down leaves once the driver holds
    // them all): the test holds every mbuf of the tx pool.
    std::vector<rte_mbuf*> hoard;
    for (rte_mbuf* m; (m = rte_pktmbuf_alloc(_plane->eth().tx_pool())) != nullptr;) hoard.push_back(m);
    const uint16_t h = uint16_t(_if->input().height), w = uint16_t(_if->input().width), c = uint16_t(_if->input().channels);
    const auto images = reefline::testing::random_images(4, size_t(h) * w * c, 5);
    for (uint64_t i = 0; i < 4; ++i) send_image(10 + i, images[i], h, w, c);
    const auto t0 = std::chrono::steady_clock::now();
    while (_if->stats()["send_failures_total"].get<uint64_t>() < 4 &&
           std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
        _plane->poll_rx(0);
        _if->poll();
        _plane->poll_tx();
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    const double waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    auto stats = _if->stats();
    EXPECT_EQ(stats["send_failures_total"], 4) << "each answer given up once";
    EXPECT_EQ(stats["responses_total"], 0) << "an answer that was not sent is not a response";
    EXPECT_GE(waited_s, 0.9) << "given up before a second without progress";
    EXPECT_EQ(_if->queued(), 0u);

    // The link comes back: new requests are answered.
    for (rte_mbuf* m : hoard) rte_pktmbuf_free(m);
    for (uint64_t i = 0; i < 4; ++i) send_image(20 + i, images[i], h, w, c);
    const auto answers = pump_and_collect(4);
    ASSERT_EQ(answers.size(), 4u);
    for (const answer& a : answers) EXPECT_EQ(a.head.kind, uint8_t(wire::kind::response)) << a.message;
    stats = _if->stats();
    EXPECT_EQ(stats["responses_total"], 4);
    EXPECT_EQ(stats["send_failures_total"], 4);
}

// ---- per-token outputs and new versions of token models -----------------------------------

namespace {

// A token model whose output is per token: y[N, L] = table[ids] * mask, `vocab` rows of
// table[i] = i / 2.
fs::path write_token_tagger(const fs::path& dir, int64_t vocab, const std::string& name) {
    ml::test_models::builder b;
    b.input("input_ids", {-1, -1}, onnx::TensorProto::INT64);
    b.input("attention_mask", {-1, -1}, onnx::TensorProto::INT64);
    for (int i = 0; i < 2; ++i)  // [N, L]: two symbols, not one
        b.g->mutable_input(i)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1)->set_dim_param("L");
    std::vector<float> table(static_cast<size_t>(vocab), 0.0f);
    for (int64_t i = 0; i < vocab; ++i) table[size_t(i)] = float(i) * 0.5f;
    b.init_f32("table", {vocab}, table);
    b.node("Gather", {"table", "input_ids"}, {"tags"});
    ml::test_models::attr_i(b.node("Cast", {"attention_mask"}, {"maskf"}), "to", onnx::TensorProto::FLOAT);
    b.node("Mul", {"tags", "maskf"}, {"y"});
    b.output("y", {-1, -1});
    b.g->mutable_output(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1)->set_dim_param("L");
    const fs::path path = dir / (name + ".onnx");
    std::ofstream(path, std::ios::binary) << b.bytes();
    return path;
}

}  // namespace

TEST_F(model_if_test, a_per_token_output_of_rank_two_is_cut_to_the_requests_tokens) {
    const fs::path onnx = write_token_tagger(_dir, 50, "tagger");
    start_if([&](reefline::ifm::model_if_config& c) {
        c.name = "tagger";
        c.onnx = onnx.string();
        c.settings.tensor_output = true;
        c.settings.batching.max_batch = 4;
    });
    ASSERT_STREQ(_if->input().format_name(), "tokens_i32");
    EXPECT_TRUE(_if->input().per_token_output);
    const std::vector<std::vector<int32_t>> requests = {{3, 1, 4, 1, 5}, {9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2}, {7}};
    for (size_t i = 0; i < requests.size(); ++i)
        reefline::testing::enqueue_request(*_plane, _rx, 300 + i, port, token_payload(requests[i]));
    const auto answers = pump_and_collect(requests.size());
    ASSERT_EQ(answers.size(), requests.size());
    for (const answer& a : answers) {
        ASSERT_EQ(a.head.kind, uint8_t(wire::kind::response)) << a.message;
        const auto& tokens = requests.at(size_t(a.head.request_id - 300));
        EXPECT_EQ(a.head.dims[0], tokens.size()) << "request " << a.head.request_id << ": dims";
        EXPECT_EQ(a.head.dims[1], 0);
        ASSERT_EQ(a.tensor.size(), tokens.size()) << "request " << a.head.request_id << ": values (its bucket is 16 or 32)";
        for (size_t j = 0; j < tokens.size(); ++j) EXPECT_EQ(a.tensor[j], float(tokens[j]) * 0.5f);
    }
}

TEST_F(model_if_test, a_new_version_must_take_the_same_token_requests_vocabulary_included) {
    const fs::path v1 = write_token_tagger(_dir, 50, "tagger_v1");
    start_if([&](reefline::ifm::model_if_config& c) {
        c.name = "tagger";
        c.onnx = v1.string();
        c.settings.tensor_output = true;
    });
    ASSERT_EQ(_if->input().vocab, 50);
    auto load = [&](const fs::path& p) { return _runtime->load_model(p.string(), reefline::ifm::model_if::import_options()); };
    for (const int64_t vocab : {40, 60}) {
        const auto other = load(write_token_tagger(_dir, vocab, "tagger_" + std::to_string(vocab)));
        try {
            (void)_if->prepare(_if->settings(), other);
            ADD_FAILURE() << "a version with a vocabulary of " << vocab << " replaced one of 50";
        } catch (const std::invalid_argument& e) {
            EXPECT_NE(std::string(e.what()).find("vocabulary of " + std::to_string(vocab) + " instead of 50"), std::string::npos)
                << e.what();
        }
    }
    // The same vocabulary, other weights: taken.
    const auto same = load(write_token_tagger(_dir, 50, "tagger_v2"));
    _if->commit(_if->prepare(_if->settings(), same));
    EXPECT_EQ(_if->model(), same);
}
