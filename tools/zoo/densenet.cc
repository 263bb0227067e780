// DenseNet-121 and DenseNet-201 (torchvision): growth 32, blocks (6, 12, 24, 16) and
// (6, 12, 48, 32), 64 initial features,
// bottleneck 4 x growth. Each dense layer is BN-ReLU-Conv1x1-BN-ReLU-Conv3x3 on the Concat of
// all earlier features of its block (one multi-input Concat per layer, as torchvision exports);
// transitions are BN-ReLU-Conv1x1 (halving channels) then AveragePool 2x2/2.
#include <algorithm>
#include <string>
#include <vector>

#include "tools/zoo/zoo.h"

namespace reefline::zoo {

namespace {

void build_densenet(graph_builder& g, const variant_options& v, model_meta& m, const std::vector<int>& blocks) {
    const int64_t div = v.tiny ? 8 : 1, size = v.tiny ? 64 : 224, classes = v.tiny ? 10 : 1000;
    const int64_t growth = 32 / div, bottleneck = 4 * 32 / div;

    std::string x = image_input(g, m, size);
    int64_t c = 64 / div;
    x = g.conv(x, "features.conv0", 3, c, window2d::square(7, 2, 3));
    x = g.relu(g.bn(x, "features.norm0", c), "features.relu0");
    x = g.maxpool(x, "features.pool0", window2d::square(3, 2, 1));
    for (size_t bi = 0; bi < blocks.size(); ++bi) {
        const std::string bp = "features.denseblock" + std::to_string(bi + 1);
        std::vector<std::string> feats{x};
        for (int l = 0; l < blocks[bi]; ++l) {
            const std::string p = bp + ".denselayer" + std::to_string(l + 1);
            const int64_t cin = c + l * growth;
            std::string y = feats.size() == 1 ? feats[0] : g.concat(feats, p + ".cat");
            y = g.relu(g.bn(y, p + ".norm1", cin), p + ".relu1");
            y = g.conv(y, p + ".conv1", cin, bottleneck, window2d::square(1));
            y = g.relu(g.bn(y, p + ".norm2", bottleneck), p + ".relu2");
            y = g.conv(y, p + ".conv2", bottleneck, growth, window2d::square(3, 1, 1));
            feats.push_back(y);
        }
        x = g.concat(feats, bp + ".cat");
        c += blocks[bi] * growth;
        if (bi + 1 < blocks.size()) {
            const std::string p = "features.transition" + std::to_string(bi + 1);
            x = g.relu(g.bn(x, p + ".norm", c), p + ".relu");
            x = g.conv(x, p + ".conv", c, c / 2, window2d::square(1));
            c /= 2;
            x = g.avgpool(x, p + ".pool", window2d::square(2, 2), false);
        }
    }
    x = g.relu(g.bn(x, "features.norm5", c), "relu");
    x = g.flatten(g.global_avgpool(x, "avgpool"), "flatten");
    x = g.gemm(x, "classifier", c, classes, kLogitRms);
    image_output(g, m, x, classes);
}

}  // namespace

void build_densenet121(graph_builder& g, const variant_options& v, model_meta& m) { build_densenet(g, v, m, {6, 12, 24, 16}); }

void build_densenet201(graph_builder& g, const variant_options& v, model_meta& m) { build_densenet(g, v, m, {6, 12, 48, 32}); }

}  // namespace reefline::zoo
