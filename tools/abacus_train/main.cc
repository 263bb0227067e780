// abacus_train: trains Abacus's group predictor (preempt/abacus.h) for a set of models on this
// machine's device: samples operator groups of them (tools/abacus_train/sampling.h, Abacus §5.4),
// fits the MLP and the linear baseline on 80% of the groups, reports both fits' error on the
// 20% held out, and writes the predictor file.
//
//   build/tools/abacus_train --repo DIR [--groups 400] [--compute-units N]     # -> DIR/abacus.json
//   build/tools/abacus_train A.onnx B.onnx ... [--batches 1,2,4] --out abacus.json
//
// With --repo, the models are the repository's (each served at the batch sizes its IF plans,
// up to its max_batch), and the file goes where the daemon looks for it (`reefline --policy
// abacus` loads <repo>/abacus.json at start). The policy uses a predictor only for groups of
// models it was trained on (matched by the files' content), and profiles otherwise.
// Last line: groups=N mlp_err_pct=A mlp_p95_pct=B linear_err_pct=C linear_p95_pct=D.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "preempt/backend_option.h"
#include "ifmanager/repository.h"
#include "tools/abacus_train/sampling.h"
#include "libml/libml.h"

namespace fs = std::filesystem;
namespace ml = reefline::ml;
namespace ab = reefline::gpu::abacus;

namespace {

std::string read_file(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read " + p.string());
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

std::vector<int64_t> powers_up_to(int64_t most) {
    std::vector<int64_t> v;
    for (int64_t b = 1; b < most; b *= 2) v.push_back(b);
    v.push_back(std::max<int64_t>(1, most));
    return v;
}

// A model loaded as the daemon loads it, with the lengths a sequence model is planned at.
ml::sampled_model load(ml::runtime& rt, const std::string& name, const fs::path& file, std::vector<int64_t> batches) {
    ml::sampled_model s;
    s.name = name;
    s.key = ab::model_key(read_file(file));
    ml::import_options io;
    io.unbound_dim = ml::sequence_buckets[0];
    s.m = rt.load_model(file.string(), io);
    try {
        const ml::request_input& r = s.m->requests();
        if (r.kind == ml::request_kind::sequence) s.lengths = r.lengths;
    } catch (const std::exception&) {
    }
    s.batches = std::move(batches);
    return s;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"abacus_train: Abacus's group predictor for a set of models, trained on this device"};
    std::vector<std::string> files;
    std::string repo, out, batches_text = "1,2,4";
    size_t groups = 400;
    unsigned units = 0, max_group = 4, max_batch_cap = 8;
    uint64_t seed = 1;
    int epochs = 3000;
    app.add_option("MODELS", files, "ONNX models (instead of --repo)");
    app.add_option("--repo", repo, "a model repository: its models, and the file written to <repo>/abacus.json");
    app.add_option("--out", out, "where to write the predictor (default <repo>/abacus.json, or stdout)");
    app.add_option("--batches", batches_text, "batch sizes sampled for models given as files")->capture_default_str();
    app.add_option("--max-batch", max_batch_cap, "with --repo: sample batch sizes up to this (or the IF's max_batch)")
        ->capture_default_str()
        ->check(CLI::Range(1u, 4096u));
    app.add_option("--groups", groups, "groups to sample (80% train, 20% held out)")->capture_default_str()->check(CLI::Range(size_t(20), size_t(100000)));
    app.add_option("--max-group", max_group, "queries per group, at most")->capture_default_str()->check(CLI::Range(1u, 8u));
    app.add_option("--epochs", epochs, "MLP training epochs")->capture_default_str()->check(CLI::Range(10, 100000));
    app.add_option("--seed", seed, "sampling and training seed")->capture_default_str();
    app.add_option("--compute-units", units, "compute units of the cpu device (default: cores - 1, as the daemon)");
    std::string backend = "cpu";
    reefline::gpu::add_backend_option(app, backend);
    CLI11_PARSE(app, argc, argv);
    if (files.empty() == repo.empty()) {
        std::fprintf(stderr, "abacus_train: give either model files or --repo DIR\n");
        return 2;
    }
    try {
        reefline::gpu::backend_options o;
        o.compute_units = units;
        auto device = reefline::gpu::make_backend(backend, o);
        ml::runtime rt(*device);
        std::vector<ml::sampled_model> models;
        if (!repo.empty()) {
            reefline::ifm::model_repository r(repo);
            std::vector<std::string> problems;
            for (const auto& e : r.entries(problems)) {
                uint32_t mb = 16;
                if (e.config.contains("max_batch") && e.config["max_batch"].is_number_unsigned())
                    mb = e.config["max_batch"].get<uint32_t>();
                models.push_back(load(rt, e.name, e.onnx, powers_up_to(std::min<int64_t>(mb, max_batch_cap))));
            }
            for (const auto& p : problems) std::fprintf(stderr, "abacus_train: repository: %s\n", p.c_str());
            if (models.empty()) throw std::runtime_error("the repository " + repo + " holds no model");
            if (out.empty()) out = (fs::path(repo) / "abacus.json").string();
        } else {
            std::vector<int64_t> batches;
            std::stringstream ss(batches_text);
            for (std::string t; std::getline(ss, t, ',');) {
                const int64_t b = std::stoll(t);
                if (b < 1 || b > 4096) throw std::invalid_argument("--batches: " + t + " is not a batch size 1..4096");
                batches.push_back(b);
            }
            if (batches.empty()) throw std::invalid_argument("--batches: none given");
            for (const auto& f : files) models.push_back(load(rt, fs::path(f).stem().string(), f, batches));
        }
        std::fprintf(stderr, "abacus_train: %zu model(s) on %s, %zu groups of up to %u\n", models.size(),
                     device->caps().name.c_str(), groups, max_group);
        ml::sampling_options so;
        so.groups = groups;
        so.max_group = max_group;
        so.seed = seed;
        so.progress = [](size_t done, size_t total) {
            if (done % 50 == 0 || done == total) std::fprintf(stderr, "abacus_train: sampled %zu/%zu groups\n", done, total);
        };
        std::vector<ab::sample> samples = ml::sample_abacus_groups(rt, models, so);
        std::mt19937_64 rng(seed);
        std::shuffle(samples.begin(), samples.end(), rng);
        const size_t held = std::max<size_t>(1, samples.size() / 5);
        const std::span<const ab::sample> test(samples.data(), held), train(samples.data() + held, samples.size() - held);
        ab::fit_options fo;
        fo.epochs = epochs;
        fo.seed = seed;
        ab::predictor p = ab::predictor::train(ml::abacus_entries(models), train, fo);
        p.device = device->caps().name;
        p.held_out_mlp = p.mlp_error(test);
        p.held_out_linear = p.linear_error(test);
        const std::string json = p.to_json();
        if (out.empty()) {
            std::fputs(json.c_str(), stdout);
        } else {
            const fs::path tmp = out + ".tmp";
            {
                std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
                f << json;
                if (!f) throw std::runtime_error("cannot write " + tmp.string());
            }
            fs::rename(tmp, out);
            std::fprintf(stderr, "abacus_train: wrote %s\n", out.c_str());
        }
        std::printf("groups=%zu mlp_err_pct=%.1f mlp_p95_pct=%.1f linear_err_pct=%.1f linear_p95_pct=%.1f\n", test.size(),
                    p.held_out_mlp.mean_pct, p.held_out_mlp.p95_pct, p.held_out_linear.mean_pct, p.held_out_linear.p95_pct);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "abacus_train: %s\n", e.what());
        return 1;
    }
    return 0;
}
