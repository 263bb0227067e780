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

#include "ifmanager/model_if.h"
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
        _dir = fs::temp_directory_path() / ("model_if_test." + std::to_string(getpid()));
        fs::create_directories(_dir);
        ASSERT_EQ(std::system((std::string(zoo) + " --out " + _dir.string() + " --tiny --only resnet50_tiny -q").c_str()), 0);
        static int seq = 0;
        const std::string n = std::to_string(seq++);
        _rx = rte_ring_create(("mrx" + n).c_str(), 4096, 0, RING_F_SP_ENQ | RING_F_SC_DEQ);
        _tx = rte_ring_create(("mtx" + n).c_str(), 4096, 0, RING_F_SP_ENQ | RING_F_SC_DEQ);
        const int pid = rte_eth_from_rings(("mring" + n).c_str(), &_rx, 1, &_tx, 1, 0);
        ASSERT_GE(pid, 0);
        dp::dataplane_config c;
        c.port.port_id = uint16_t(pid);
        c.port.rx_mbufs = 8191;
        c.port.tx_mbufs = 1023;
        c.port.rx_descriptors = c.port.tx_descriptors = 512;
        _plane = std::make_unique<dp::dataplane>(c);
        _device = reefline::gpu::make_cpu_device();
        _runtime = std::make_unique<ml::runtime>(*_device);
        reefline::ifm::model_if_config mc;
        mc.name = "resnet50_tiny";
        mc.onnx = (_dir / "resnet50_tiny.onnx").string();
        mc.udp_port = port;
        mc.max_batch = 4;
        _if = std::make_unique<reefline::ifm::model_if>(*_plane, *_runtime, mc);
        _plane->ifs().publish({_if->binding()});
        _plane->rx_online(0);
    }

    void TearDown() override {
        if (!_plane) return;
        _plane->flush(0);
        _plane->rx_offline(0);
        _if.reset();
        rte_mempool* rx = _plane->eth().rx_pool();
        rte_mempool* tx = _plane->eth().tx_pool();
        _plane->eth().close();
        EXPECT_EQ(rte_mempool_avail_count(rx), rx->size);
        EXPECT_EQ(rte_mempool_avail_count(tx), tx->size);
        _plane.reset();
        rte_ring_free(_rx);
        rte_ring_free(_tx);
        fs::remove_all(_dir);
    }

    void send_image(uint64_t id, const std::vector<uint8_t>& img, uint16_t h, uint16_t w, uint16_t c) {
        gen::frame_addresses a;
        a.src_mac = {0x02, 0, 0, 0, 0, 0x01};
        a.dst_mac = {0x02, 0, 0, 0, 0, 0x02};
        a.src_ip = 0xc6120001;
        a.dst_ip = 0xc6120002;
        a.src_port = 40000;
        a.dst_port = port;
        gen::request_payload payload;
        payload.format = wire::format::image_u8_hwc;
        payload.dims[0] = h; payload.dims[1] = w; payload.dims[2] = c;
        payload.bytes = img;
        constexpr uint32_t frag = 1000;
        for (const wire::fields& f : gen::plan_fragments(payload, id, frag)) {
            std::vector<uint8_t> udp;
            gen::append_udp_payload(udp, f, {img.data() + f.payload_offset, gen::fragment_length(f, frag)});
            const auto frame = gen::build_frame(a, 1, udp);
            rte_mbuf* m = rte_pktmbuf_alloc(_plane->eth().rx_pool());
            ASSERT_NE(m, nullptr);
            std::memcpy(rte_pktmbuf_append(m, uint16_t(frame.size())), frame.data(), frame.size());
            ASSERT_EQ(rte_ring_enqueue(_rx, m), 0);
        }
    }

    std::vector<answer> pump_and_collect() {
        for (int i = 0; i < 64; ++i) {
            _plane->poll_rx(0);
            _if->poll();
            _plane->poll_tx();
        }
        std::vector<answer> out;
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
        return out;
    }

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
    rte_ring* _rx = nullptr;
    rte_ring* _tx = nullptr;
    std::unique_ptr<dp::dataplane> _plane;
    std::unique_ptr<reefline::gpu::device> _device;
    std::unique_ptr<ml::runtime> _runtime;
    std::unique_ptr<reefline::ifm::model_if> _if;
};

TEST_F(model_if_test, answers_equal_libml_on_the_same_images) {
    const uint16_t h = _if->height(), w = _if->width(), c = _if->channels();
    std::mt19937 rng(7);
    std::vector<std::vector<uint8_t>> images(6);
    for (auto& img : images) {
        img.resize(size_t(h) * w * c);
        for (auto& v : img) v = uint8_t(rng());
    }
    for (size_t i = 0; i < images.size(); ++i) send_image(1000 + i, images[i], h, w, c);
    const auto answers = pump_and_collect();
    ASSERT_EQ(answers.size(), images.size());  // batches of up to 4: 4 + 2
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
    EXPECT_EQ(_if->counters().responses_sent.get(), images.size());
}

TEST_F(model_if_test, wrong_shape_gets_an_error_naming_it) {
    std::vector<uint8_t> img(16 * 16 * 3, 7);
    send_image(77, img, 16, 16, 3);
    const auto answers = pump_and_collect();
    ASSERT_EQ(answers.size(), 1u);
    EXPECT_EQ(answers[0].head.kind, uint8_t(wire::kind::error));
    EXPECT_EQ(answers[0].head.status, uint8_t(wire::status::bad_request));
    EXPECT_NE(answers[0].message.find("16x16x3"), std::string::npos) << answers[0].message;
    EXPECT_EQ(_if->counters().error_responses.get(), 1u);
}

}  // namespace
