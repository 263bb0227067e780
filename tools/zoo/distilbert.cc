// DistilBERT sequence classifier (DistilBertForSequenceClassification, distilbert-base-uncased
// shapes), exported as torch.onnx exports HuggingFace's model: input_ids and attention_mask int64
// [N, L] (L symbolic, at most max_pos) -> word embedding Gather + position embedding Gather
// (position ids sliced to L, see position_embeddings) -> LayerNorm -> 6 transformer layers ->
// hidden[:, 0] -> pre_classifier Linear + ReLU -> classifier Linear -> logits [N, labels].
// Post-LN layers as in the model:
//   sa = LN(x + Wo * Attention(Wq x, Wk x, Wv x)),  out = LN(sa + W2 * GELU(W1 sa)),
// with 12 heads of 64 (Reshape / Transpose to [N, heads, L, 64], q / sqrt(64) with Div,
// MatMul, masked_fill of the padded keys, Softmax over the last axis), Linear layers as MatMul +
// Add on [N, L, hidden] (Gemm on the 2-D head) and GELU in its exact Erf form.
//
// Masking as HF DistilBERT: Equal(mask, 0) -> Unsqueeze to [N, 1, 1, L] -> Where(that, float32
// lowest, scores). A padded key's score is then exactly the lowest float and its softmax weight
// exactly 0, so a padded sequence's logits equal the unpadded sequence's (up to rounding).
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "tools/zoo/zoo.h"

namespace reefline::zoo {

void build_distilbert(graph_builder& g, const variant_options& v, model_meta& m) {
    const int64_t vocab = v.tiny ? 1024 : 30522, max_pos = v.tiny ? 64 : 512;
    const int64_t hidden = v.tiny ? 64 : 768, heads = v.tiny ? 4 : 12;
    const int64_t ffn = 4 * hidden, layers = 6, dh = hidden / heads, labels = 8;
    const float eps = 1e-12f;

    const std::string ids = sequence_input(g, m, "input_ids", vocab);
    const std::string mask = sequence_input(g, m, "attention_mask", 2);
    m.max_sequence_length = max_pos;

    // Embeddings: unit-scale tables (LayerNorm follows), summed: [N, L, H] + [1, L, H].
    const std::string word = g.normal("embeddings.word_embeddings.weight", {vocab, hidden}, 1.0);
    const std::string pos =
        g.normal("embeddings.position_embeddings.weight", {max_pos, hidden}, 1.0);
    std::string x = g.add(g.op("Gather", {word, ids}, "embeddings.word", {attr("axis", 0)}),
                          position_embeddings(g, ids, pos, max_pos), "embeddings.add");
    x = g.layernorm(x, "embeddings.LayerNorm", hidden, eps);

    // True where a key is padding: [N, 1, 1, L], broadcast over heads and queries by Where.
    std::string padded =
        g.op("Equal", {mask, g.const_i64("const.zero_i64", {}, {0})}, "mask.is_padding");
    padded = g.op("Unsqueeze", {padded, g.const_i64("const.axes_1_2", {2}, {1, 2})},
                  "mask.unsqueeze");
    const std::string lowest =
        g.scalar("const.float_lowest", std::numeric_limits<float>::lowest());

    // [N, L, hidden] <-> [N, L, heads, dh]; 0 copies the batch dimension.
    const std::string split = g.const_i64("shape.split_heads", {4}, {0, -1, heads, dh});
    const std::string merge = g.const_i64("shape.merge_heads", {3}, {0, -1, hidden});
    const std::string scale = g.scalar("const.sqrt_head_dim", std::sqrt(static_cast<float>(dh)));

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
        std::string q = heads_of("q_lin", {0, 2, 1, 3});  // [N, heads, L, dh]
        std::string k = heads_of("k_lin", {0, 2, 3, 1});  // [N, heads, dh, L]
        std::string vv = heads_of("v_lin", {0, 2, 1, 3});
        q = g.op("Div", {q, scale}, a + ".q_scale");
        std::string s = g.op("MatMul", {q, k}, a + ".scores");  // [N, heads, L, L]
        s = g.op("Where", {padded, lowest, s}, a + ".masked_fill");
        s = g.op("Softmax", {s}, a + ".softmax", {attr("axis", -1)});
        std::string ctx = g.op("MatMul", {s, vv}, a + ".context");
        ctx = g.op("Transpose", {ctx}, a + ".context.transpose", {attr("perm", {0, 2, 1, 3})});
        ctx = g.op("Reshape", {ctx, merge}, a + ".context.reshape");
        ctx = g.linear(ctx, a + ".out_lin", hidden, hidden, 1.0);
        x = g.layernorm(g.add(ctx, x, p + ".sa_residual"), p + ".sa_layer_norm", hidden, eps);

        const std::string f = p + ".ffn";
        std::string h = g.linear(x, f + ".lin1", hidden, ffn, 1.41421356);
        h = gelu(g, h, f + ".gelu");
        h = g.linear(h, f + ".lin2", ffn, hidden, 1.0);
        x = g.layernorm(g.add(h, x, p + ".ffn_residual"), p + ".output_layer_norm", hidden, eps);
    }

    // Head: the first token's hidden state (hidden_state[:, 0], a Gather with a scalar index),
    // Linear + ReLU, Linear. The ReLU's output has mean square ~1, so a gain of kLogitRms gives
    // logits of rms ~kLogitRms.
    std::string h = g.op("Gather", {x, g.const_i64("const.index_0", {}, {0})}, "pooled",
                         {attr("axis", 1)});  // [N, hidden]
    h = g.relu(g.gemm(h, "pre_classifier", hidden, hidden, 1.41421356), "pre_classifier.relu");
    image_output(g, m, g.gemm(h, "classifier", hidden, labels, kLogitRms), labels);
}

}  // namespace reefline::zoo
