// BERT sequence classifier (BertForSequenceClassification, bert-base-uncased shapes), exported
// as torch.onnx exports HuggingFace's model: input_ids, attention_mask and token_type_ids int64
// [N, L] (L symbolic, at most max_pos) -> word + token type + position embeddings (position ids
// sliced to L, see position_embeddings) -> LayerNorm -> 12 post-LN encoder layers ->
// pooler (hidden[:, 0] -> Linear -> Tanh) -> classifier Linear -> logits [N, labels].
//   a = LN(x + Wo * Attention(Wq x, Wk x, Wv x)),  out = LN(a + W2 * GELU(W1 a)),
// with scores = (q k^T) / sqrt(dh) + extended mask, Softmax over the last axis.
//
// The mask as HF BERT's "extended attention mask": Unsqueeze(mask, [1, 2]) -> Cast to float ->
// 1 - that -> * float32 lowest, added to the scores: 0 on real tokens, the lowest float on
// padding, whose softmax weight is then exactly 0 (a score of O(1) added to it rounds back to
// the lowest float, finite), so a padded sequence's logits equal the unpadded sequence's.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "tools/zoo/zoo.h"

namespace reefline::zoo {

void build_bert(graph_builder& g, const variant_options& v, model_meta& m) {
    const int64_t vocab = v.tiny ? 1024 : 30522, max_pos = v.tiny ? 64 : 512, type_vocab = 2;
    const int64_t hidden = v.tiny ? 64 : 768, heads = v.tiny ? 4 : 12;
    const int64_t ffn = 4 * hidden, layers = 12, dh = hidden / heads, labels = 8;
    const float eps = 1e-12f;

    const std::string ids = sequence_input(g, m, "input_ids", vocab);
    const std::string mask = sequence_input(g, m, "attention_mask", 2);
    const std::string types = sequence_input(g, m, "token_type_ids", type_vocab);
    m.max_sequence_length = max_pos;

    // Embeddings: unit-scale tables (LayerNorm follows), summed in HF's order: words + token
    // types [N, L, H], + positions [1, L, H].
    const std::string e = "embeddings";
    const std::string word = g.normal(e + ".word_embeddings.weight", {vocab, hidden}, 1.0);
    const std::string type =
        g.normal(e + ".token_type_embeddings.weight", {type_vocab, hidden}, 1.0);
    const std::string pos = g.normal(e + ".position_embeddings.weight", {max_pos, hidden}, 1.0);
    std::string x = g.add(g.op("Gather", {word, ids}, e + ".word", {attr("axis", 0)}),
                          g.op("Gather", {type, types}, e + ".token_type", {attr("axis", 0)}),
                          e + ".add");
    x = g.add(x, position_embeddings(g, ids, pos, max_pos), e + ".add_position");
    x = g.layernorm(x, e + ".LayerNorm", hidden, eps);

    // Extended attention mask [N, 1, 1, L]: 0 where attended, float32 lowest where padding.
    std::string ext =
        g.op("Unsqueeze", {mask, g.const_i64("const.axes_1_2", {2}, {1, 2})}, "mask.unsqueeze");
    ext = g.op("Cast", {ext}, "mask.cast", {attr("to", int64_t{onnx::TensorProto::FLOAT})});
    ext = g.op("Sub", {g.scalar("const.one", 1.0f), ext}, "mask.invert");
    ext = g.op("Mul", {ext, g.scalar("const.float_lowest", std::numeric_limits<float>::lowest())},
               "mask.extended");

    // [N, L, hidden] <-> [N, L, heads, dh]; 0 copies the batch dimension.
    const std::string split = g.const_i64("shape.split_heads", {4}, {0, -1, heads, dh});
    const std::string merge = g.const_i64("shape.merge_heads", {3}, {0, -1, hidden});
    const std::string scale = g.scalar("const.sqrt_head_dim", std::sqrt(static_cast<float>(dh)));

    for (int64_t l = 0; l < layers; ++l) {
        const std::string p = "encoder.layer." + std::to_string(l);
        const std::string a = p + ".attention";
        // Projections: std 1/sqrt(fan_in) keeps q, k, v at the scale of the normalised input, so
        // scores are O(1) and the softmax is neither uniform nor one-hot.
        const auto heads_of = [&](const std::string& name, std::vector<int64_t> perm) {
            std::string t = g.linear(x, a + ".self." + name, hidden, hidden, 1.0);
            t = g.op("Reshape", {t, split}, a + ".self." + name + ".reshape");
            return g.op("Transpose", {t}, a + ".self." + name + ".transpose", {attr("perm", perm)});
        };
        const std::string q = heads_of("query", {0, 2, 1, 3});  // [N, heads, L, dh]
        const std::string k = heads_of("key", {0, 2, 3, 1});    // [N, heads, dh, L]
        const std::string vv = heads_of("value", {0, 2, 1, 3});
        std::string s = g.op("MatMul", {q, k}, a + ".scores");  // [N, heads, L, L]
        s = g.op("Div", {s, scale}, a + ".scores.scale");
        s = g.op("Add", {s, ext}, a + ".scores.mask");
        s = g.op("Softmax", {s}, a + ".softmax", {attr("axis", -1)});
        std::string ctx = g.op("MatMul", {s, vv}, a + ".context");
        ctx = g.op("Transpose", {ctx}, a + ".context.transpose", {attr("perm", {0, 2, 1, 3})});
        ctx = g.op("Reshape", {ctx, merge}, a + ".context.reshape");
        ctx = g.linear(ctx, a + ".output.dense", hidden, hidden, 1.0);
        x = g.layernorm(g.add(ctx, x, a + ".output.residual"), a + ".output.LayerNorm", hidden,
                        eps);

        std::string h = g.linear(x, p + ".intermediate.dense", hidden, ffn, 1.41421356);
        h = gelu(g, h, p + ".intermediate.gelu");
        h = g.linear(h, p + ".output.dense", ffn, hidden, 1.0);
        x = g.layernorm(g.add(h, x, p + ".output.residual"), p + ".output.LayerNorm", hidden, eps);
    }

    // Pooler: the first token's hidden state (hidden_state[:, 0], a Gather with a scalar index),
    // Linear + Tanh; then the classifier. tanh of a unit normal has rms ~0.63, hence the
    // classifier's gain kLogitRms / 0.63 for logits of rms ~kLogitRms.
    std::string h = g.op("Gather", {x, g.const_i64("const.index_0", {}, {0})}, "pooler.first_token",
                         {attr("axis", 1)});  // [N, hidden]
    h = g.op("Tanh", {g.gemm(h, "pooler.dense", hidden, hidden, 1.0)}, "pooler.activation");
    image_output(g, m, g.gemm(h, "classifier", hidden, labels, kLogitRms / 0.63), labels);
}

}  // namespace reefline::zoo
