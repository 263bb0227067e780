// Inception-v3 (torchvision, without the training-only auxiliary classifier): stem, then
// Mixed_5b-d (A), 6a (B), 6b-e (C, factorised 1x7 / 7x1 convs), 7a (D), 7b-c (E, parallel
// 1x3 / 3x1 convs concatenated). Every conv is BasicConv2d: Conv (no bias) + BN (eps 1e-3) +
// ReLU. Pool branches use AveragePool 3x3/1 pad 1 with count_include_pad = 1 (PyTorch's
// default); the grid reductions use MaxPool 3x3/2.
//
// 299x299 gives 35/17/8 grids. The smallest valid input is 75x75 (grids 7/3/1), but its 1x1
// grid in the E modules reduces their 3x3, 1x3 and 3x1 convs to the centre tap (a padding bug
// there would go unseen) and makes the calibrated scales erratic on new inputs; the tiny
// variant takes 139x139 (grids 15/7/3), still ~2 ms in onnxruntime.
#include <algorithm>
#include <string>
#include <vector>

#include "tools/zoo/zoo.h"

namespace reefline::zoo {
namespace {

struct inception_builder {
    graph_builder& g;
    int64_t div;

    int64_t w(int64_t c) const { return std::max<int64_t>(1, c / div); }

    // BasicConv2d; cin and cout are full-size widths.
    std::string conv(const std::string& x, const std::string& name, int64_t cin, int64_t cout,
                     window2d k) {
        return conv_bn_relu(g, x, name, w(cin), w(cout), k, 1, bn_init{1e-3f, 1.0f});
    }
    std::string avgpool3(const std::string& x, const std::string& name) {
        return g.avgpool(x, name, window2d::square(3, 1, 1), true);
    }

    std::string a(const std::string& x, const std::string& p, int64_t cin, int64_t pool_features) {
        std::string b1 = conv(x, p + ".branch1x1", cin, 64, window2d::square(1));
        std::string b5 = conv(x, p + ".branch5x5_1", cin, 48, window2d::square(1));
        b5 = conv(b5, p + ".branch5x5_2", 48, 64, window2d::same(5, 5));
        std::string b3 = conv(x, p + ".branch3x3dbl_1", cin, 64, window2d::square(1));
        b3 = conv(b3, p + ".branch3x3dbl_2", 64, 96, window2d::same(3, 3));
        b3 = conv(b3, p + ".branch3x3dbl_3", 96, 96, window2d::same(3, 3));
        std::string bp = avgpool3(x, p + ".branch_pool.avgpool");
        bp = conv(bp, p + ".branch_pool", cin, pool_features, window2d::square(1));
        return g.concat({b1, b5, b3, bp}, p + ".cat");  // 224 + pool_features
    }

    std::string b(const std::string& x, const std::string& p, int64_t cin) {
        std::string b3 = conv(x, p + ".branch3x3", cin, 384, window2d::square(3, 2));
        std::string bd = conv(x, p + ".branch3x3dbl_1", cin, 64, window2d::square(1));
        bd = conv(bd, p + ".branch3x3dbl_2", 64, 96, window2d::same(3, 3));
        bd = conv(bd, p + ".branch3x3dbl_3", 96, 96, window2d::square(3, 2));
        std::string bp = g.maxpool(x, p + ".branch_pool", window2d::square(3, 2));
        return g.concat({b3, bd, bp}, p + ".cat");  // 480 + cin
    }

    std::string c(const std::string& x, const std::string& p, int64_t c7) {
        std::string b1 = conv(x, p + ".branch1x1", 768, 192, window2d::square(1));
        std::string b7 = conv(x, p + ".branch7x7_1", 768, c7, window2d::square(1));
        b7 = conv(b7, p + ".branch7x7_2", c7, c7, window2d::same(1, 7));
        b7 = conv(b7, p + ".branch7x7_3", c7, 192, window2d::same(7, 1));
        std::string bd = conv(x, p + ".branch7x7dbl_1", 768, c7, window2d::square(1));
        bd = conv(bd, p + ".branch7x7dbl_2", c7, c7, window2d::same(7, 1));
        bd = conv(bd, p + ".branch7x7dbl_3", c7, c7, window2d::same(1, 7));
        bd = conv(bd, p + ".branch7x7dbl_4", c7, c7, window2d::same(7, 1));
        bd = conv(bd, p + ".branch7x7dbl_5", c7, 192, window2d::same(1, 7));
        std::string bp = avgpool3(x, p + ".branch_pool.avgpool");
        bp = conv(bp, p + ".branch_pool", 768, 192, window2d::square(1));
        return g.concat({b1, b7, bd, bp}, p + ".cat");  // 768
    }

    std::string d(const std::string& x, const std::string& p) {
        std::string b3 = conv(x, p + ".branch3x3_1", 768, 192, window2d::square(1));
        b3 = conv(b3, p + ".branch3x3_2", 192, 320, window2d::square(3, 2));
        std::string b7 = conv(x, p + ".branch7x7x3_1", 768, 192, window2d::square(1));
        b7 = conv(b7, p + ".branch7x7x3_2", 192, 192, window2d::same(1, 7));
        b7 = conv(b7, p + ".branch7x7x3_3", 192, 192, window2d::same(7, 1));
        b7 = conv(b7, p + ".branch7x7x3_4", 192, 192, window2d::square(3, 2));
        std::string bp = g.maxpool(x, p + ".branch_pool", window2d::square(3, 2));
        return g.concat({b3, b7, bp}, p + ".cat");  // 1280
    }

    std::string e(const std::string& x, const std::string& p, int64_t cin) {
        std::string b1 = conv(x, p + ".branch1x1", cin, 320, window2d::square(1));
        std::string b3 = conv(x, p + ".branch3x3_1", cin, 384, window2d::square(1));
        b3 = g.concat({conv(b3, p + ".branch3x3_2a", 384, 384, window2d::same(1, 3)),
                       conv(b3, p + ".branch3x3_2b", 384, 384, window2d::same(3, 1))},
                      p + ".branch3x3.cat");
        std::string bd = conv(x, p + ".branch3x3dbl_1", cin, 448, window2d::square(1));
        bd = conv(bd, p + ".branch3x3dbl_2", 448, 384, window2d::same(3, 3));
        bd = g.concat({conv(bd, p + ".branch3x3dbl_3a", 384, 384, window2d::same(1, 3)),
                       conv(bd, p + ".branch3x3dbl_3b", 384, 384, window2d::same(3, 1))},
                      p + ".branch3x3dbl.cat");
        std::string bp = avgpool3(x, p + ".branch_pool.avgpool");
        bp = conv(bp, p + ".branch_pool", cin, 192, window2d::square(1));
        return g.concat({b1, b3, bd, bp}, p + ".cat");  // 2048
    }
};

}  // namespace

void build_inception_v3(graph_builder& g, const variant_options& v, model_meta& m) {
    const int64_t div = v.tiny ? 8 : 1, size = v.tiny ? 139 : 299, classes = v.tiny ? 10 : 1000;
    inception_builder n{g, div};
    std::string x = image_input(g, m, size);
    x = n.conv(x, "Conv2d_1a_3x3", 3 * div, 32,
               window2d::square(3, 2));  // 3 * div: 3 input channels
    x = n.conv(x, "Conv2d_2a_3x3", 32, 32, window2d::square(3));
    x = n.conv(x, "Conv2d_2b_3x3", 32, 64, window2d::square(3, 1, 1));
    x = g.maxpool(x, "maxpool1", window2d::square(3, 2));
    x = n.conv(x, "Conv2d_3b_1x1", 64, 80, window2d::square(1));
    x = n.conv(x, "Conv2d_4a_3x3", 80, 192, window2d::square(3));
    x = g.maxpool(x, "maxpool2", window2d::square(3, 2));
    x = n.a(x, "Mixed_5b", 192, 32);
    x = n.a(x, "Mixed_5c", 256, 64);
    x = n.a(x, "Mixed_5d", 288, 64);
    x = n.b(x, "Mixed_6a", 288);
    x = n.c(x, "Mixed_6b", 128);
    x = n.c(x, "Mixed_6c", 160);
    x = n.c(x, "Mixed_6d", 160);
    x = n.c(x, "Mixed_6e", 192);
    x = n.d(x, "Mixed_7a");
    x = n.e(x, "Mixed_7b", 1280);
    x = n.e(x, "Mixed_7c", 2048);
    x = g.flatten(g.global_avgpool(x, "avgpool"), "flatten");
    x = g.dropout(x, "dropout");
    x = g.gemm(x, "fc", n.w(2048), classes, kLogitRms);
    image_output(g, m, x, classes);
}

}  // namespace reefline::zoo
