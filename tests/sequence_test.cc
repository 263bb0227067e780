// Sequence and tensor models through the runtime, as a model IF runs them:
// - what requests a model takes is derived from its inputs (tokens, tensors, images), and
//   models no request format fits are refused naming why;
// - a batch of token requests of mixed lengths, read in place from fragmented payloads by the
//   token gather kernel at a length bucket, answers each request as that request run alone,
//   unpadded, at its own length (the attention mask hides the padding), and bit-identically
//   to the same padded batch given as host-built tensors;
// - a token outside the vocabulary is reported (request, position, token) and never changes
//   the other requests' answers;
// - tensor requests gathered in place equal the floats given directly;
// - an instance's memory is what the footprint said before anything was allocated.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include "libml/libml.h"
#include "tests/tiny_zoo.h"

namespace ml = reefline::ml;
namespace k = reefline::ml::kernels;
namespace fs = std::filesystem;

namespace {

class sequence_test : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        const char* zoo = std::getenv("REEFLINE_ZOO");
        if (!zoo) return;
        _dir = reefline::testing::write_tiny_zoo(zoo, "sequence_test", "distilbert,bert,sensor_tcn,resnet50");
    }
    static void TearDownTestSuite() {
        if (!_dir.empty()) fs::remove_all(_dir);
    }
    void SetUp() override {
        if (!std::getenv("REEFLINE_ZOO")) GTEST_SKIP() << "REEFLINE_ZOO (path of build/tools/zoo) not set";
        ASSERT_FALSE(_dir.empty()) << "the zoo tool failed";
        _device = reefline::gpu::make_cpu_device();
        _rt = std::make_unique<ml::runtime>(*_device);
    }
    std::shared_ptr<ml::model> load(const std::string& name, const ml::import_options& o = serving()) {
        return _rt->load_model((_dir / (name + ".onnx")).string(), o);
    }
    static ml::import_options serving() {
        ml::import_options o;
        o.unbound_dim = ml::sequence_buckets[0];
        return o;
    }

    static fs::path _dir;
    std::unique_ptr<reefline::gpu::device> _device;
    std::unique_ptr<ml::runtime> _rt;
};
fs::path sequence_test::_dir;

// Little-endian i32 tokens, cut into fragments of `frag` bytes (tokens straddle fragments).
struct token_requests {
    std::vector<std::vector<uint8_t>> payloads;
    std::vector<k::gather_segment> segments;
    std::vector<uint32_t> first{0};

    void add(const std::vector<int32_t>& tokens, uint32_t frag = 7) {
        std::vector<uint8_t> b;
        for (int32_t t : tokens)
            for (int i = 0; i < 4; ++i) b.push_back(uint8_t(uint32_t(t) >> (8 * i)));
        payloads.push_back(std::move(b));
    }
    void cut(uint32_t frag = 7) {
        segments.clear();
        first.assign(1, 0);
        for (const auto& p : payloads) {
            for (uint32_t off = 0; off < p.size(); off += frag)
                segments.push_back({p.data() + off, uint32_t(std::min<size_t>(frag, p.size() - off)), off});
            first.push_back(uint32_t(segments.size()));
        }
    }
};

std::vector<int32_t> random_tokens(size_t n, int32_t vocab, unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> t(n);
    for (auto& v : t) v = int32_t(rng() % uint32_t(vocab));
    return t;
}

// The model's inputs for `rows` padded to `length`, built on the host (ids, mask 1/0, types 0).
std::vector<ml::tensor> host_inputs(const ml::request_input& r, const ml::graph& g,
                                    const std::vector<std::vector<int32_t>>& rows, int64_t length) {
    std::vector<ml::tensor> in(g.inputs.size());
    const int64_t n = int64_t(rows.size());
    for (size_t i = 0; i < g.inputs.size(); ++i) {
        std::vector<int64_t> v(size_t(n * length), 0);
        for (int64_t b = 0; b < n; ++b)
            for (int64_t p = 0; p < int64_t(rows[size_t(b)].size()); ++p)
                v[size_t(b * length + p)] = int(i) == r.ids ? rows[size_t(b)][size_t(p)] : int(i) == r.mask ? 1 : 0;
        in[i] = ml::tensor::from_i64(v, {n, length}, g.values[size_t(g.inputs[i])].type);
    }
    return in;
}

TEST_F(sequence_test, request_formats_are_derived_from_the_inputs) {
    const ml::request_input d = load("distilbert_tiny")->requests();
    EXPECT_EQ(d.kind, ml::request_kind::sequence);
    EXPECT_STREQ(d.format_name(), "tokens_i32");
    EXPECT_EQ(d.ids, 0);
    EXPECT_EQ(d.mask, 1);
    EXPECT_EQ(d.types, -1);
    // The tiny model's position table has 64 rows: longer lengths fail shape inference.
    EXPECT_EQ(d.lengths, (std::vector<int64_t>{16, 32, 64}));
    EXPECT_TRUE(d.vocab_known);
    EXPECT_EQ(d.vocab, 1024);
    EXPECT_FALSE(d.exact_length);
    EXPECT_EQ(d.bucket_for(1), 16);
    EXPECT_EQ(d.bucket_for(17), 32);
    EXPECT_EQ(d.bucket_for(64), 64);
    EXPECT_EQ(d.bucket_for(65), 0);
    const ml::request_input b = load("bert_tiny")->requests();
    EXPECT_EQ(b.types, 2);
    EXPECT_EQ(b.mask, 1);
    EXPECT_EQ(b.vocab, 1024);
    const ml::request_input t = load("sensor_tcn_tiny")->requests();
    EXPECT_EQ(t.kind, ml::request_kind::tensor);
    EXPECT_EQ(t.item, (ml::shape_t{64, 6}));
    const ml::request_input i = load("resnet50_tiny")->requests();
    EXPECT_EQ(i.kind, ml::request_kind::image);
    EXPECT_EQ(i.channels, 3);
    EXPECT_EQ(i.height, 64);
}

TEST_F(sequence_test, mixed_lengths_in_one_batch_answer_as_each_request_alone) {
    for (const char* name : {"distilbert_tiny", "bert_tiny"}) {
        SCOPED_TRACE(name);
        auto m = load(name);
        const ml::request_input& r = m->requests();
        auto in = _rt->link_model(m);
        _rt->configure_batch(*in, 4, r.lengths);
        const std::vector<std::vector<int32_t>> rows = {random_tokens(5, 1024, 1), random_tokens(17, 1024, 2),
                                                        random_tokens(32, 1024, 3), random_tokens(1, 1024, 4)};
        token_requests q;
        for (const auto& t : rows) q.add(t);
        q.cut();
        ml::runtime::request_batch batch;
        batch.segments = q.segments;
        batch.first = q.first;
        batch.length = r.bucket_for(32);
        ASSERT_EQ(batch.length, 32);
        std::vector<ml::tensor> got, host;
        _rt->infer_requests(*in, batch, got);
        EXPECT_EQ(in->length(), 32);
        for (const auto& e : _rt->token_errors(*in)) EXPECT_EQ(e.position, -1);
        // The token gather writes exactly what the host would.
        _rt->infer_batch(*in, host_inputs(r, m->imported(), rows, 32), host);
        ASSERT_EQ(got.size(), host.size());
        EXPECT_TRUE(got[0] == host[0]) << "the token gather's batch differs from the host-built one";
        // Each request alone at its own length, unpadded, in a model imported for that shape.
        const auto all = got[0].view<float>();
        const int64_t per = got[0].elements() / 4;
        for (size_t b = 0; b < rows.size(); ++b) {
            const int64_t len = int64_t(rows[b].size());
            ml::import_options o;
            for (int gi : m->imported().inputs) o.input_shapes[m->imported().values[size_t(gi)].name] = {1, len};
            auto single = load(name, o);
            auto one = _rt->link_model(single);
            std::vector<ml::tensor> want;
            _rt->infer_batch(*one, host_inputs(r, single->imported(), {rows[b]}, len), want);
            const auto w = want[0].view<float>();
            ASSERT_EQ(int64_t(w.size()), per);
            double scale = 0, err = 0;
            for (int64_t j = 0; j < per; ++j) {
                scale = std::max(scale, double(std::fabs(w[size_t(j)])));
                err = std::max(err, double(std::fabs(all[size_t(int64_t(b) * per + j)] - w[size_t(j)])));
            }
            EXPECT_LE(err, 1e-4 * scale) << "request " << b << " (" << len << " tokens) padded to 32";
        }
    }
}

TEST_F(sequence_test, a_token_outside_the_vocabulary_is_reported_and_disturbs_no_other_request) {
    auto m = load("distilbert_tiny");
    const ml::request_input& r = m->requests();
    auto in = _rt->link_model(m);
    _rt->configure_batch(*in, 3, r.lengths);
    std::vector<std::vector<int32_t>> rows = {random_tokens(9, 1024, 5), random_tokens(20, 1024, 6), random_tokens(3, 1024, 7)};
    rows[1][4] = 5000;
    rows[1][11] = -1;
    token_requests q;
    for (const auto& t : rows) q.add(t);
    q.cut(5);
    ml::runtime::request_batch batch;
    batch.segments = q.segments;
    batch.first = q.first;
    batch.length = 32;
    std::vector<ml::tensor> bad;
    _rt->infer_requests(*in, batch, bad);
    const auto errors = _rt->token_errors(*in);
    ASSERT_EQ(errors.size(), 3u);
    EXPECT_EQ(errors[0].position, -1);
    EXPECT_EQ(errors[1].position, 4);
    EXPECT_EQ(errors[1].token, 5000);
    EXPECT_EQ(errors[2].position, -1);
    // The same batch with the bad tokens replaced by 0 (what the kernel fed the model).
    rows[1][4] = rows[1][11] = 0;
    std::vector<ml::tensor> clean;
    _rt->infer_batch(*in, host_inputs(r, m->imported(), rows, 32), clean);
    EXPECT_TRUE(bad[0] == clean[0]);
}

TEST_F(sequence_test, tensor_requests_are_gathered_as_given) {
    auto m = load("sensor_tcn_tiny");
    ASSERT_EQ(m->requests().kind, ml::request_kind::tensor);
    auto in = _rt->link_model(m);
    _rt->configure_batch(*in, 2);
    const int64_t elements = 64 * 6;
    std::mt19937 rng(9);
    std::normal_distribution<float> n;
    std::vector<float> x(size_t(2 * elements));
    for (auto& v : x) v = n(rng);
    std::vector<std::vector<uint8_t>> payloads(2);
    std::vector<k::gather_segment> segments;
    std::vector<uint32_t> first{0};
    for (int r = 0; r < 2; ++r) {
        payloads[size_t(r)].resize(size_t(elements) * 4);
        std::memcpy(payloads[size_t(r)].data(), x.data() + r * elements, size_t(elements) * 4);
        for (uint32_t off = 0; off < payloads[size_t(r)].size(); off += 9)
            segments.push_back({payloads[size_t(r)].data() + off, uint32_t(std::min<size_t>(9, payloads[size_t(r)].size() - off)), off});
        first.push_back(uint32_t(segments.size()));
    }
    ml::runtime::request_batch batch;
    batch.segments = segments;
    batch.first = first;
    std::vector<ml::tensor> got, want;
    _rt->infer_requests(*in, batch, got);
    ml::bytes_t bytes(x.size() * 4);
    std::memcpy(bytes.data(), x.data(), bytes.size());
    _rt->infer_batch(*in, std::vector<ml::tensor>{ml::tensor::make(ml::dtype::f32, {2, 64, 6}, std::move(bytes))}, want);
    EXPECT_TRUE(got[0] == want[0]);
}

TEST_F(sequence_test, an_instance_holds_what_its_footprint_said) {
    auto m = load("bert_tiny");
    const std::vector<int64_t> batches = {1, 4};
    const std::vector<int64_t>& lengths = m->requests().lengths;
    const ml::memory_footprint f = _rt->footprint(*m, batches, 1024, lengths);
    for (size_t i = 0; i < batches.size(); ++i) {
        auto in = _rt->link_model(m);
        _rt->configure_batch(*in, batches[i], lengths);
        // Nothing ran yet: the gather list is not allocated; the rest is exactly the estimate.
        EXPECT_EQ(in->memory_bytes(), f.instances[i].second - ml::runtime::gather_list_bytes(batches[i], 1024, lengths.back()));
        EXPECT_EQ(in->lengths(), lengths);
    }
}

}  // namespace
