// Plain and residual CNNs: VGG-19, AlexNet (with LRN), ResNet-50/152 (bottleneck, v1.5),
// MobileNet-v2. Tensor names follow torchvision's state_dict keys where there is one.
#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "tools/zoo/zoo.h"

namespace reefline::zoo {
namespace {

constexpr double kReluGain = 1.41421356237;  // Kaiming: std = sqrt(2 / fan_in) before a ReLU
constexpr double kLinearGain = 1.0;          // before no nonlinearity (logits, projections)

// Tiny variants divide every width by the same factor, so structural decisions taken on the
// full widths (a residual where in == out, a downsample where they differ) stay the same.
int64_t width(int64_t c, int64_t div) { return std::max<int64_t>(1, c / div); }

std::string idx(const std::string& prefix, int i) { return prefix + "." + std::to_string(i); }

}  // namespace

// VGG-19 (configuration E): 16 conv3x3 (bias, ReLU) in 5 stages with max pooling, then
// 3 fully connected layers with ReLU and Dropout. No batch norm (torchvision's vgg19).
void build_vgg19(graph_builder& g, const variant_options& v, model_meta& m) {
    const int64_t div = v.tiny ? 8 : 1, size = v.tiny ? 32 : 224;
    const int64_t fc = v.tiny ? 256 : 4096, classes = v.tiny ? 10 : 1000;
    constexpr int M = 0;  // max pool
    const std::vector<int> cfg{64,  64,  M,   128, 128, M,   256, 256, 256, 256, M,
                               512, 512, 512, 512, M,   512, 512, 512, 512, M};
    std::string x = image_input(g, m, size);
    int64_t cin = 3, spatial = size;
    int i = 0;  // index into torchvision's vgg.features
    for (int c : cfg) {
        if (c == M) {
            x = g.maxpool(x, idx("features", i++), window2d::square(2, 2));
            spatial /= 2;
        } else {
            const int64_t cout = width(c, div);
            x = g.conv(x, idx("features", i++), cin, cout, window2d::square(3, 1, 1), 1, true);
            x = g.relu(x, idx("features", i++));
            cin = cout;
        }
    }
    // torchvision's AdaptiveAvgPool2d((7, 7)) is the identity at 224x224 and not exported.
    x = g.flatten(x, "flatten");
    x = g.relu(g.gemm(x, "classifier.0", cin * spatial * spatial, fc, kReluGain), "classifier.1");
    x = g.dropout(x, "classifier.2");
    x = g.relu(g.gemm(x, "classifier.3", fc, fc, kReluGain), "classifier.4");
    x = g.dropout(x, "classifier.5");
    x = g.gemm(x, "classifier.6", fc, classes, kLogitRms);
    image_output(g, m, x, classes);
}

// AlexNet: torchvision's widths (64, 192, 384, 256, 256), plus the original paper's local
// response normalisation after the first two ReLUs: size 5, beta 0.75, k (bias) 2, but
// alpha 1 rather than 1e-4. The paper's activations were ~50x larger (raw pixel scale) than
// these unit-scale ones; with alpha 1e-4 the squared-sum term would change outputs by ~1e-5,
// below any test tolerance, and an LRN that ignored it would pass. ONNX divides alpha by size.
void build_alexnet(graph_builder& g, const variant_options& v, model_meta& m) {
    const int64_t div = v.tiny ? 8 : 1, size = v.tiny ? 64 : 224;
    const int64_t fc = v.tiny ? 256 : 4096, classes = v.tiny ? 10 : 1000;
    const auto out = [](int64_t s, const window2d& k) {
        return (s + k.pt + k.pb - k.kh) / k.sh + 1;
    };
    std::string x = image_input(g, m, size);
    int64_t s = size;
    const int64_t c1 = width(64, div), c2 = width(192, div), c3 = width(384, div),
                  c4 = width(256, div), c5 = width(256, div);
    const window2d k1 = window2d::square(11, 4, 2), pool = window2d::square(3, 2);
    x = g.relu(g.conv(x, "features.0", 3, c1, k1, 1, true), "features.1");
    s = out(s, k1);
    x = g.lrn(x, "features.lrn1", 5, 1.0f, 0.75f, 2.0f);
    x = g.maxpool(x, "features.2", pool);
    s = out(s, pool);
    x = g.relu(g.conv(x, "features.3", c1, c2, window2d::square(5, 1, 2), 1, true), "features.4");
    x = g.lrn(x, "features.lrn2", 5, 1.0f, 0.75f, 2.0f);
    x = g.maxpool(x, "features.5", pool);
    s = out(s, pool);
    x = g.relu(g.conv(x, "features.6", c2, c3, window2d::square(3, 1, 1), 1, true), "features.7");
    x = g.relu(g.conv(x, "features.8", c3, c4, window2d::square(3, 1, 1), 1, true), "features.9");
    x = g.relu(g.conv(x, "features.10", c4, c5, window2d::square(3, 1, 1), 1, true), "features.11");
    x = g.maxpool(x, "features.12", pool);
    s = out(s, pool);  // 6 at 224x224, where torchvision's AdaptiveAvgPool2d((6, 6)) is a no-op
    x = g.flatten(x, "flatten");
    x = g.dropout(x, "classifier.0");
    x = g.relu(g.gemm(x, "classifier.1", c5 * s * s, fc, kReluGain), "classifier.2");
    x = g.dropout(x, "classifier.3");
    x = g.relu(g.gemm(x, "classifier.4", fc, fc, kReluGain), "classifier.5");
    x = g.gemm(x, "classifier.6", fc, classes, kLogitRms);
    image_output(g, m, x, classes);
}

// ResNet v1.5 (torchvision): bottleneck blocks 1x1 -> 3x3 (stride here) -> 1x1 (x4), each conv
// followed by its own BatchNormalization node; projection shortcut (1x1 conv + BN) on the
// first block of each stage.
static void build_resnet(graph_builder& g, const variant_options& v, model_meta& m,
                         const std::array<int, 4>& blocks) {
    const int64_t div = v.tiny ? 8 : 1, size = v.tiny ? 64 : 224, classes = v.tiny ? 10 : 1000;
    // The residual branch's last BN starts small, gamma ~ 1/sqrt(blocks) (as zero_init_residual
    // and Fixup do, but not zero, so that every branch still counts): with gamma ~ 1 the sum's
    // variance would double per block, 2^50 over ResNet-152's 50 blocks.
    int total = 0;
    for (int n : blocks) total += n;
    const bn_init last_bn{1e-5f, static_cast<float>(1.0 / std::sqrt(static_cast<double>(total)))};
    std::string x = image_input(g, m, size);
    int64_t inplanes = width(64, div);
    x = g.conv(x, "conv1", 3, inplanes, window2d::square(7, 2, 3));
    x = g.relu(g.bn(x, "bn1", inplanes), "relu");
    x = g.maxpool(x, "maxpool", window2d::square(3, 2, 1));
    for (int li = 0; li < 4; ++li) {
        const int64_t w = width(64 << li, div), outc = 4 * w;
        for (int b = 0; b < blocks[li]; ++b) {
            const std::string p = "layer" + std::to_string(li + 1) + "." + std::to_string(b);
            const int64_t stride = (li > 0 && b == 0) ? 2 : 1;
            std::string y = g.conv(x, p + ".conv1", inplanes, w, window2d::square(1));
            y = g.relu(g.bn(y, p + ".bn1", w), p + ".relu1");
            y = g.conv(y, p + ".conv2", w, w, window2d::square(3, stride, 1));
            y = g.relu(g.bn(y, p + ".bn2", w), p + ".relu2");
            y = g.conv(y, p + ".conv3", w, outc, window2d::square(1));
            y = g.bn(y, p + ".bn3", outc, last_bn);
            std::string shortcut = x;
            if (b == 0) {  // stride 2, or inplanes != 4 * w (layer1: 64 -> 256)
                shortcut =
                    g.conv(x, p + ".downsample.0", inplanes, outc, window2d::square(1, stride));
                shortcut = g.bn(shortcut, p + ".downsample.1", outc);
            }
            x = g.relu(g.add(y, shortcut, p + ".add"), p + ".relu");
            inplanes = outc;
        }
    }
    x = g.flatten(g.global_avgpool(x, "avgpool"), "flatten");
    x = g.gemm(x, "fc", inplanes, classes, kLogitRms);
    image_output(g, m, x, classes);
}

void build_resnet50(graph_builder& g, const variant_options& v, model_meta& m) {
    build_resnet(g, v, m, {3, 4, 6, 3});
}
void build_resnet152(graph_builder& g, const variant_options& v, model_meta& m) {
    build_resnet(g, v, m, {3, 8, 36, 3});
}

// MobileNet-v2 (torchvision, width 1.0): inverted residuals 1x1 expand -> 3x3 depthwise
// (group = channels) -> 1x1 linear projection, ReLU6 as Clip(x, 0, 6) with min/max inputs,
// residual add where stride is 1 and in == out.
void build_mobilenet_v2(graph_builder& g, const variant_options& v, model_meta& m) {
    const int64_t div = v.tiny ? 4 : 1, size = v.tiny ? 64 : 224, classes = v.tiny ? 10 : 1000;
    struct stage {
        int t, c, n, s;
    };
    const std::vector<stage> stages{{1, 16, 1, 1}, {6, 24, 2, 2},  {6, 32, 3, 2}, {6, 64, 4, 2},
                                    {6, 96, 3, 1}, {6, 160, 3, 2}, {6, 320, 1, 1}};
    const bn_init res_bn{1e-5f, 0.5f};
    // BN before ReLU6 with gamma ~3: about 2% of its outputs exceed 6, so Clip's max matters
    // (with unit-scale activations a Clip read as Relu would go unnoticed).
    const bn_init pre_relu6_bn{1e-5f, 3.0f};
    const auto cbr6 = [&](const std::string& x, const std::string& p, int64_t cin, int64_t cout,
                          window2d k, int64_t groups) {
        std::string y = g.conv(x, p + ".0", cin, cout, k, groups);
        y = g.bn(y, p + ".1", cout, pre_relu6_bn);
        return g.relu6(y, p + ".2");
    };
    std::string x = image_input(g, m, size);
    int64_t cin = width(32, div), full_cin = 32;
    x = cbr6(x, "features.0", 3, cin, window2d::square(3, 2, 1), 1);
    int fi = 1;
    for (const stage& st : stages) {
        for (int i = 0; i < st.n; ++i, ++fi) {
            const std::string p = idx("features", fi) + ".conv";
            const int64_t stride = i == 0 ? st.s : 1, cout = width(st.c, div);
            const bool residual = stride == 1 && full_cin == st.c;
            const int64_t hidden = cin * st.t;
            std::string y = x;
            int li = 0;
            if (st.t != 1) y = cbr6(y, idx(p, li++), cin, hidden, window2d::square(1), 1);
            y = cbr6(y, idx(p, li++), hidden, hidden, window2d::square(3, stride, 1), hidden);
            y = g.conv(y, idx(p, li++), hidden, cout, window2d::square(1), 1, false, kLinearGain);
            y = g.bn(y, idx(p, li++), cout, residual ? res_bn : bn_init{});
            x = residual ? g.add(x, y, idx("features", fi) + ".add") : y;
            cin = cout;
            full_cin = st.c;
        }
    }
    const int64_t last = width(1280, div);
    x = cbr6(x, idx("features", fi), cin, last, window2d::square(1), 1);
    x = g.flatten(g.global_avgpool(x, "avgpool"), "flatten");
    x = g.dropout(x, "classifier.0");
    x = g.gemm(x, "classifier.1", last, classes, kLogitRms);
    image_output(g, m, x, classes);
}

}  // namespace reefline::zoo
