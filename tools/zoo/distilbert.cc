// DistilBERT encoder (distilbert-base-uncased shapes): token ids int64 [N, 128] -> word
// embedding Gather + position embedding Gather (constant position ids) -> LayerNorm -> 6
// transformer layers -> last hidden state [N, 128, 768]. Post-LN layers as in the model:
//   sa = LN(x + Wo * Attention(Wq x, Wk x, Wv x)),  out = LN(sa + W2 * GELU(W1 sa)),
// with 12 heads of 64 (Reshape / Transpose to [N, heads, seq, 64], q / sqrt(64) with Div,
// MatMul, Softmax over the last axis), Linear layers as MatMul + Add and GELU in its exact Erf
// form 0.5 x (1 + erf(x / sqrt 2)) (opset 17 has no Gelu op; LayerNormalization it has).
// There is no attention mask input: every token attends to every token.
#include <cmath>
#include <string>
#include <vector>

#include "tools/zoo/zoo.h"

namespace reefline::zoo {

void build_distilbert(graph_builder& g, const variant_options& v, model_meta& m) {
    const int64_t vocab = v.tiny ? 1024 : 30522, seq = v.tiny ? 16 : 128;
    const int64_t hidden = v.tiny ? 64 : 768, heads = v.tiny ? 4 : 12;
    const int64_t ffn = 4 * hidden, layers = 6, dh = hidden / heads;
    const float eps = 1e-12f;

    const std::string ids =
        g.input("input_ids", onnx::TensorProto::INT64, {shape_dim{"N"}, shape_dim{seq}});
    m.inputs.push_back({ids, onnx::TensorProto::INT64, {shape_dim{"N"}, shape_dim{seq}}});
    m.int_range_hi = vocab;

    // Embeddings: unit-scale tables (LayerNorm follows), summed.
    const std::string word = g.normal("embeddings.word_embeddings.weight", {vocab, hidden}, 1.0);
    const std::string pos = g.normal("embeddings.position_embeddings.weight", {seq, hidden}, 1.0);
    std::vector<int64_t> pos_ids(seq);
    for (int64_t i = 0; i < seq; ++i) pos_ids[i] = i;
    const std::string pos_idx = g.const_i64("embeddings.position_ids", {seq}, pos_ids);
    std::string x = g.add(g.op("Gather", {word, ids}, "embeddings.word", {attr("axis", 0)}),
                          g.op("Gather", {pos, pos_idx}, "embeddings.position", {attr("axis", 0)}),
                          "embeddings.add");
    x = g.layernorm(x, "embeddings.LayerNorm", hidden, eps);

    // [N, seq, hidden] <-> [N, seq, heads, dh]; 0 copies the batch dimension.
    const std::string split = g.const_i64("shape.split_heads", {4}, {0, -1, heads, dh});
    const std::string merge = g.const_i64("shape.merge_heads", {3}, {0, -1, hidden});
    const std::string scale = g.scalar("const.sqrt_head_dim", std::sqrt(static_cast<float>(dh)));
    const std::string sqrt2 = g.scalar("const.sqrt2", std::sqrt(2.0f));
    const std::string one = g.scalar("const.one", 1.0f);
    const std::string half = g.scalar("const.half", 0.5f);

    for (int64_t l = 0; l < layers; ++l) {
        const std::string p = "transformer.layer." + std::to_string(l);
        const std::string a = p + ".attention";
        // Projections: std 1/sqrt(fan_in) keeps q, k, v at the scale of the normalised input, so
        // scores are O(1) and the softmax is neither uniform nor one-hot.
        const auto heads_of = [&](const std::string& name, std::vector<int64_t> perm) {
            std::string t = g.linear(x, a + "." + name, hidden, hidden, 1.0);
            t = g.op("Reshape", {t, split}, a + "." + name + ".reshape");
            return g.op("Transpose", {t}, a + "." + name + ".transpose", {attr("perm", perm)});
        };
        std::string q = heads_of("q_lin", {0, 2, 1, 3});  // [N, heads, seq, dh]
        std::string k = heads_of("k_lin", {0, 2, 3, 1});  // [N, heads, dh, seq]
        std::string vv = heads_of("v_lin", {0, 2, 1, 3});
        q = g.op("Div", {q, scale}, a + ".q_scale");
        std::string s = g.op("MatMul", {q, k}, a + ".scores");
        s = g.op("Softmax", {s}, a + ".softmax", {attr("axis", -1)});
        std::string ctx = g.op("MatMul", {s, vv}, a + ".context");
        ctx = g.op("Transpose", {ctx}, a + ".context.transpose", {attr("perm", {0, 2, 1, 3})});
        ctx = g.op("Reshape", {ctx, merge}, a + ".context.reshape");
        ctx = g.linear(ctx, a + ".out_lin", hidden, hidden, 1.0);
        x = g.layernorm(g.add(ctx, x, p + ".sa_residual"), p + ".sa_layer_norm", hidden, eps);

        const std::string f = p + ".ffn";
        std::string h = g.linear(x, f + ".lin1", hidden, ffn, 1.41421356);
        // GELU(h) = h * 0.5 * (1 + erf(h / sqrt 2)), as torch.onnx exports nn.GELU().
        std::string e = g.op("Erf", {g.op("Div", {h, sqrt2}, f + ".gelu.div")}, f + ".gelu.erf");
        e = g.op("Add", {e, one}, f + ".gelu.add");
        h = g.op("Mul", {g.op("Mul", {h, e}, f + ".gelu.mul"), half}, f + ".gelu");
        h = g.linear(h, f + ".lin2", ffn, hidden, 1.0);
        x = g.layernorm(g.add(h, x, p + ".ffn_residual"), p + ".output_layer_norm", hidden, eps);
    }
    const std::string out = g.rename(x, "last_hidden_state");
    const std::vector<shape_dim> oshape{shape_dim{"N"}, shape_dim{seq}, shape_dim{hidden}};
    g.output(out, onnx::TensorProto::FLOAT, oshape);
    m.outputs.push_back({out, onnx::TensorProto::FLOAT, oshape});
}

}  // namespace reefline::zoo
