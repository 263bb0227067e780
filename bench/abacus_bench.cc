// abacus_bench: Abacus (SC'21) on this machine's cpu device: how well its group predictor
// predicts, and what the abacus policy does for several latency-bound services against the
// other policies on the same arrivals.
//
// 1. The predictor: operator groups of the services' models sampled on this device
//    (tools/abacus_train/sampling.h, as build/tools/abacus_train does), the MLP and the linear
//    baseline fitted on 80%, their error (mean and p95 of |predicted - measured| / measured)
//    on the 20% held out, overall and by group size (pairs, triples, ...).
// 2. Serving: one service per model (the zoo's tiny ResNet-50, MobileNet-v2 and DistilBERT by
//    default), each query a batch of 1, 2 or 4 with a deadline of --slo-factor x the model's
//    isolated time at batch 4, Poisson arrivals whose work adds up to --load of the device;
//    the first service RT, the others BE (so that reef has something to preempt). Policies
//    abacus, reef, seq, streams, prema (--policies), each on the same arrival sequences.
//    Per policy: QoS violations (queries not answered within their deadline: late, dropped
//    or not answered at all) in percent of the arrivals, throughput within the deadline,
//    queries dropped by abacus, RT violations.
//
//   build/bench/abacus_bench [--quick] [--models a,b,c] [--groups N] [--seconds S] [--load F]
//                            [--slo-factor F] [--policies abacus,reef,...] [--compute-units N]
//                            [--csv FILE]
//
// Last line: predictor_err_pct=A lr_err_pct=B abacus_violations_pct=C reef_violations_pct=D
// (held-out mean errors; violations over the whole run).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <thread>
#include <unistd.h>

#include "bench/bench_report.h"
#include "tools/abacus_train/sampling.h"
#include "libml/libml.h"
#include "libml/runtime/synthetic_inputs.h"
#include "preempt/backend_option.h"
#include "preempt/scheduler.h"

namespace fs = std::filesystem;
namespace ml = reefline::ml;
namespace gpu = reefline::gpu;
namespace ab = reefline::gpu::abacus;
namespace report = reefline::bench;
using clk = std::chrono::steady_clock;

namespace {

int64_t now_ns() { return std::chrono::duration_cast<std::chrono::nanoseconds>(clk::now().time_since_epoch()).count(); }

std::vector<std::string> split(const std::string& text) {
    std::vector<std::string> out;
    std::stringstream ss(text);
    for (std::string t; std::getline(ss, t, ',');)
        if (!t.empty()) out.push_back(t);
    return out;
}

std::string read_file(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

const int64_t batch_sizes[] = {1, 2, 4};

// A service: a model, an instance pool per batch size (profiled), its deadline and rate.
struct service {
    ml::sampled_model sm;
    int32_t predictor_index = -1;
    gpu::task_class cls = gpu::task_class::be;
    std::map<int64_t, std::vector<std::unique_ptr<ml::instance>>> pool;  // batch -> instances
    std::map<int64_t, double> alone_ms;                                  // batch -> isolated time
    double slo_ms = 0, rate = 0;
};

struct policy_result {
    std::string policy;
    uint64_t arrivals = 0, in_slo = 0, late = 0, dropped = 0, unanswered = 0;
    uint64_t rt_arrivals = 0, rt_in_slo = 0;
    double seconds = 0;
    gpu::scheduler_stats sched;
    double violations_pct() const { return arrivals ? 100.0 * double(arrivals - in_slo) / double(arrivals) : 0; }
    double rt_violations_pct() const {
        return rt_arrivals ? 100.0 * double(rt_arrivals - rt_in_slo) / double(rt_arrivals) : 0;
    }
    double goodput() const { return seconds > 0 ? double(in_slo) / seconds : 0; }
};

struct arrival {
    double at_s;
    size_t svc;
    int64_t batch;
};

policy_result run_policy(ml::runtime& rt, gpu::device& dev, std::vector<service>& svcs, const std::vector<arrival>& arrivals,
                         gpu::policy pol, const std::shared_ptr<const ab::predictor>& predictor, double seconds) {
    gpu::scheduler_options so;
    so.pol = pol;
    if (pol == gpu::policy::abacus) so.predictor = predictor;
    gpu::scheduler sched(dev, so);
    policy_result r;
    r.policy = gpu::policy_name(pol);
    r.seconds = seconds;
    // Free instances per (service, batch); a query that finds none waits for one (its wait
    // counts against its deadline, as a request waiting in an IF's queue).
    std::mutex mu;
    std::condition_variable cv;
    std::map<std::pair<size_t, int64_t>, std::vector<ml::instance*>> free;
    for (size_t i = 0; i < svcs.size(); ++i)
        for (auto& [b, v] : svcs[i].pool)
            for (auto& in : v) free[{i, b}].push_back(in.get());
    uint64_t outstanding = 0;
    const int64_t t0 = now_ns() + 20'000'000;
    for (const arrival& a : arrivals) {
        const int64_t at = t0 + int64_t(a.at_s * 1e9);
        while (now_ns() < at) std::this_thread::sleep_for(std::chrono::nanoseconds(std::min<int64_t>(at - now_ns(), 200'000)));
        service& s = svcs[a.svc];
        const int64_t deadline = at + int64_t(s.slo_ms * 1e6);
        ml::instance* in;
        {
            std::unique_lock lk(mu);
            ++r.arrivals;
            if (s.cls == gpu::task_class::rt) ++r.rt_arrivals;
            auto& f = free[{a.svc, a.batch}];
            cv.wait(lk, [&] { return !f.empty(); });
            in = f.back();
            f.pop_back();
            ++outstanding;
        }
        gpu::task t;
        t.cls = s.cls;
        t.launches = rt.task_launches(*in);
        for (const auto& l : t.launches) t.est_us += l.est_us;
        t.deadline_ns = deadline;
        t.model = s.predictor_index;
        t.batch = uint32_t(a.batch);
        t.length = uint32_t(in->length());
        const bool is_rt = s.cls == gpu::task_class::rt;
        const std::pair<size_t, int64_t> key{a.svc, a.batch};
        t.on_done = [&, in, deadline, is_rt, key](const gpu::task_result& res) {
            std::lock_guard lk(mu);
            if (res.status == gpu::task_status::completed) {
                if (res.end_ns <= deadline) {
                    ++r.in_slo;
                    if (is_rt) ++r.rt_in_slo;
                } else {
                    ++r.late;
                }
            } else if (res.status == gpu::task_status::dropped) {
                ++r.dropped;
            } else {
                ++r.unanswered;
            }
            free[key].push_back(in);
            --outstanding;
            cv.notify_all();
        };
        sched.submit(std::move(t));
    }
    {
        std::unique_lock lk(mu);
        cv.wait_for(lk, std::chrono::seconds(60), [&] { return outstanding == 0; });
    }
    sched.shutdown();
    r.sched = sched.stats();
    return r;
}

// The command line (see add_options for what each means).
struct bench_options {
    std::string models_text = "resnet50_tiny,mobilenet_v2_tiny,distilbert_tiny",
                policies_text = "abacus,reef,seq,streams,prema", zoo_dir, csv_path;
    size_t groups = 400;
    double seconds = 8, load = 0.7, slo_factor = 4;
    unsigned units = 0;
    uint64_t seed = 1;
    bool quick = false;
    std::string backend = "cpu";
};

void add_options(CLI::App& app, bench_options& o) {
    app.add_option("--models", o.models_text, "the services' models (zoo names)")->capture_default_str();
    app.add_option("--zoo", o.zoo_dir, "directory of the zoo's models (default: written by build/tools/zoo)");
    app.add_option("--groups", o.groups, "groups sampled to train and test the predictor")
        ->capture_default_str()
        ->check(CLI::Range(size_t(20), size_t(100000)));
    app.add_option("--seconds", o.seconds, "arrivals per policy, in seconds")
        ->capture_default_str()
        ->check(CLI::Range(0.5, 3600.0));
    app.add_option("--load", o.load, "offered work as a fraction of the device")
        ->capture_default_str()
        ->check(CLI::Range(0.05, 2.0));
    app.add_option("--slo-factor", o.slo_factor, "a query's deadline: this x its model's isolated time at batch 4")
        ->capture_default_str()
        ->check(CLI::Range(1.0, 1000.0));
    app.add_option("--policies", o.policies_text, "policies to compare")->capture_default_str();
    app.add_option("--compute-units", o.units, "compute units of the cpu device (default: cores - 1)");
    app.add_option("--seed", o.seed, "arrivals, sampling and training seed")->capture_default_str();
    app.add_option("--csv", o.csv_path, "write the per-policy table as CSV");
    app.add_flag("--quick", o.quick, "150 groups, 4 s per policy, abacus and reef only");
    gpu::add_backend_option(app, o.backend);
}

// --policies as policies; nothing (after saying why on stderr) when one is not a policy to compare.
std::optional<std::vector<gpu::policy>> parse_policies(const std::string& text) {
    std::vector<gpu::policy> policies;
    for (const std::string& p : split(text)) {
        gpu::policy pol;
        if (!gpu::parse_policy(p.c_str(), pol) || pol == gpu::policy::rt_only) {
            std::fprintf(stderr, "abacus_bench: --policies: '%s' is not one of abacus, reef, seq, streams, prema\n",
                         p.c_str());
            return std::nullopt;
        }
        policies.push_back(pol);
    }
    return policies;
}

// The zoo's tiny models `names`, written to a fresh temp dir (`work`, set before it is created so
// that the caller removes it whatever happens); returns the directory.
std::string write_zoo_models(const std::vector<std::string>& names, report::progress& progress, fs::path& work) {
    auto step = progress.begin("tiny zoo models written");
    work = fs::temp_directory_path() / ("abacus_bench." + std::to_string(getpid()));
    fs::create_directories(work);
    const fs::path zoo = fs::canonical("/proc/self/exe").parent_path().parent_path() / "tools" / "zoo";
    std::string only;
    for (const auto& n : names) only += (only.empty() ? "" : ",") + n;
    const std::string cmd = zoo.string() + " --out " + work.string() + " --tiny --only " + only + " -q";
    if (std::system(cmd.c_str()) != 0) throw std::runtime_error("the zoo tool failed: " + cmd);
    return work.string();
}

// The model in `file` as a service: three profiled instances per batch size with their inputs
// written, its isolated time per batch size (the median of 5 runs) and its deadline.
service load_service(ml::runtime& rt, const fs::path& file, const std::string& name, gpu::task_class cls,
                     double slo_factor) {
    service s;
    s.sm.name = name;
    s.sm.key = ab::model_key(read_file(file));
    ml::import_options io;
    io.unbound_dim = ml::sequence_buckets[0];
    s.sm.m = rt.load_model(file.string(), io);
    try {
        const ml::request_input& req = s.sm.m->requests();
        if (req.kind == ml::request_kind::sequence) s.sm.lengths = {req.max_length()};
    } catch (const std::exception&) {
    }
    s.sm.batches.assign(std::begin(batch_sizes), std::end(batch_sizes));
    s.cls = cls;
    for (const int64_t b : batch_sizes) {
        for (int k = 0; k < 3; ++k) {
            auto in = rt.link_model(s.sm.m);
            rt.configure_batch(*in, b, s.sm.lengths);
            const auto inputs = ml::synthetic_inputs(in->inputs(), 7);
            if (k == 0) {
                rt.apply_profile(*in, rt.profile(*in, 3));
                std::vector<double> ms;
                std::vector<ml::tensor> ys;
                for (int r = 0; r < 5; ++r) {
                    const auto a = clk::now();
                    rt.infer_batch(*in, inputs, ys);
                    ms.push_back(std::chrono::duration<double, std::milli>(clk::now() - a).count());
                }
                std::sort(ms.begin(), ms.end());
                s.alone_ms[b] = ms[2];
            } else {
                rt.apply_profile(*in, rt.profile(*in, 1));
            }
            rt.write_inputs(*in, inputs);
            s.pool[b].push_back(std::move(in));
        }
    }
    s.slo_ms = slo_factor * s.alone_ms[4];
    return s;
}

// One service per model; the first is RT, the others BE (so that reef has something to preempt).
std::vector<service> load_services(ml::runtime& rt, const std::string& zoo_dir, const std::vector<std::string>& names,
                                   double slo_factor, report::progress& progress) {
    std::vector<service> svcs;
    auto step = progress.begin("models loaded, profiled and timed alone");
    for (size_t i = 0; i < names.size(); ++i) {
        const fs::path file = fs::path(zoo_dir) / (names[i] + ".onnx");
        if (!fs::exists(file)) throw std::runtime_error("no model " + file.string());
        const gpu::task_class cls = i == 0 ? gpu::task_class::rt : gpu::task_class::be;
        svcs.push_back(load_service(rt, file, names[i], cls, slo_factor));
    }
    return svcs;
}

// The predictor, fitted on 80% of the sampled groups, and the 20% held out to test it.
struct trained_predictor {
    std::shared_ptr<ab::predictor> predictor;
    std::vector<ab::sample> test, train;
};

trained_predictor train_predictor(ml::runtime& rt, const std::vector<service>& svcs, const bench_options& o,
                                  report::progress& progress) {
    std::vector<ml::sampled_model> sms;
    for (const service& s : svcs) sms.push_back(s.sm);
    std::vector<ab::sample> samples;
    {
        auto step = progress.begin(std::to_string(o.groups) + " groups sampled");
        ml::sampling_options so;
        so.groups = o.groups;
        so.seed = o.seed;
        samples = ml::sample_abacus_groups(rt, sms, so);
    }
    std::mt19937_64 rng(o.seed);
    std::shuffle(samples.begin(), samples.end(), rng);
    const size_t held = std::max<size_t>(1, samples.size() / 5);
    trained_predictor tp;
    tp.test.assign(samples.begin(), samples.begin() + long(held));
    tp.train.assign(samples.begin() + long(held), samples.end());
    auto step = progress.begin("predictor trained on " + std::to_string(tp.train.size()) + " groups");
    tp.predictor =
        std::make_shared<ab::predictor>(ab::predictor::train(ml::abacus_entries(sms), tp.train, ab::fit_options{}));
    return tp;
}

// The predictor's error on the held-out groups, by group size and over all of them.
void print_predictor_errors(const trained_predictor& tp, const ab::error_stats& mlp, const ab::error_stats& lin) {
    std::printf("%-10s %8s %10s %10s %10s %10s\n", "groups", "count", "MLP mean%", "MLP p95%", "LR mean%", "LR p95%");
    for (size_t parts = 1; parts <= 4; ++parts) {
        std::vector<ab::sample> some;
        for (const auto& s : tp.test)
            if (s.group.size() == parts) some.push_back(s);
        if (some.empty()) continue;
        const auto m = tp.predictor->mlp_error(some), l = tp.predictor->linear_error(some);
        const char* label[] = {"", "singles", "pairs", "triples", "quadruples"};
        std::printf("%-10s %8zu %10.1f %10.1f %10.1f %10.1f\n", label[parts], some.size(), m.mean_pct, m.p95_pct,
                    l.mean_pct, l.p95_pct);
    }
    std::printf("%-10s %8zu %10.1f %10.1f %10.1f %10.1f\n", "all", tp.test.size(), mlp.mean_pct, mlp.p95_pct,
                lin.mean_pct, lin.p95_pct);
}

// The arrivals every policy serves (sorted by time); sets each service's rate.
std::vector<arrival> plan_arrivals(std::vector<service>& svcs, double units_n, const bench_options& o) {
    std::vector<arrival> arrivals;
    // Each service gets an equal part of the load: rate_i x mean isolated time_i = load / n.
    std::mt19937_64 arng(o.seed + 1);
    for (size_t i = 0; i < svcs.size(); ++i) {
        double mean_ms = 0;
        for (const int64_t b : batch_sizes) mean_ms += svcs[i].alone_ms[b] / double(std::size(batch_sizes));
        svcs[i].rate = o.load / double(svcs.size()) / (mean_ms / 1e3) * std::min(units_n, 1.0);
        std::exponential_distribution<double> gap(svcs[i].rate);
        for (double t = gap(arng); t < o.seconds; t += gap(arng))
            arrivals.push_back({t, i, batch_sizes[arng() % std::size(batch_sizes)]});
    }
    std::sort(arrivals.begin(), arrivals.end(), [](const arrival& a, const arrival& b) { return a.at_s < b.at_s; });
    return arrivals;
}

void print_services(const std::vector<service>& svcs, const bench_options& o) {
    std::printf("\nservices (deadline = %.1f x alone at batch 4, %.0f%% of the device offered, %.1f s per policy):\n",
                o.slo_factor, 100 * o.load, o.seconds);
    for (const service& s : svcs)
        std::printf("  %-18s %s  alone %.2f / %.2f / %.2f ms at batch 1/2/4, deadline %.1f ms, %.0f queries/s\n",
                    s.sm.name.c_str(), s.cls == gpu::task_class::rt ? "RT" : "BE", s.alone_ms.at(1), s.alone_ms.at(2),
                    s.alone_ms.at(4), s.slo_ms, s.rate);
}

// The last line's violations (-1: the policy did not run).
struct headline_violations {
    double abacus = -1, reef = -1;
};

// The per-policy table (and its CSV rows).
headline_violations print_policy_results(const std::vector<policy_result>& results, report::csv_writer* csv) {
    std::printf("\n%-8s %8s %8s %6s %8s %10s %11s %8s %12s %8s\n", "policy", "queries", "in time", "late", "dropped",
                "violations", "RT viol.", "groups", "within/s", "pred/meas");
    headline_violations v;
    for (const policy_result& r : results) {
        const double ratio =
            r.sched.abacus_measured_us > 0 ? r.sched.abacus_predicted_us / r.sched.abacus_measured_us : 0;
        std::printf("%-8s %8llu %8llu %6llu %8llu %9.2f%% %10.2f%% %8llu %12.1f %8.2f\n", r.policy.c_str(),
                    (unsigned long long)r.arrivals, (unsigned long long)r.in_slo, (unsigned long long)r.late,
                    (unsigned long long)r.dropped, r.violations_pct(), r.rt_violations_pct(),
                    (unsigned long long)r.sched.abacus_groups, r.goodput(), ratio);
        if (r.policy == "abacus") v.abacus = r.violations_pct();
        if (r.policy == "reef") v.reef = r.violations_pct();
        if (csv)
            csv->row({r.policy, r.arrivals, r.in_slo, r.late, r.dropped, r.unanswered,
                      report::csv_cell::fixed(r.violations_pct(), 2), report::csv_cell::fixed(r.rt_violations_pct(), 2),
                      report::csv_cell::fixed(r.goodput(), 1), r.sched.abacus_groups});
    }
    return v;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"abacus_bench: Abacus's predictor and policy against reef, seq, streams and prema (cpu device)"};
    bench_options o;
    add_options(app, o);
    CLI11_PARSE(app, argc, argv);
    if (o.quick) {
        o.groups = std::min<size_t>(o.groups, 150);
        o.seconds = std::min(o.seconds, 4.0);
        if (app.count("--policies") == 0) o.policies_text = "abacus,reef";
    }
    const std::optional<std::vector<gpu::policy>> policies = parse_policies(o.policies_text);
    if (!policies) return 2;
    const std::vector<std::string> names = split(o.models_text);
    if (names.empty() || names.size() > 8) {
        std::fprintf(stderr, "abacus_bench: --models: 1 to 8 zoo models\n");
        return 2;
    }
    report::progress progress("abacus_bench", unsigned((o.zoo_dir.empty() ? 1 : 0) + 3 + policies->size()));
    fs::path work;
    try {
        std::unique_ptr<report::csv_writer> csv;
        if (!o.csv_path.empty())
            csv = std::make_unique<report::csv_writer>(
                o.csv_path, std::vector<std::string>{"policy", "arrivals", "in_slo", "late", "dropped", "unanswered",
                                                     "violations_pct", "rt_violations_pct", "goodput_per_s", "groups"});
        if (o.zoo_dir.empty()) o.zoo_dir = write_zoo_models(names, progress, work);
        gpu::backend_options dopt;
        dopt.compute_units = o.units;
        auto device = gpu::make_backend(o.backend, dopt);
        ml::runtime rt(*device);
        std::vector<service> svcs = load_services(rt, o.zoo_dir, names, o.slo_factor, progress);
        // 1. The predictor.
        const trained_predictor tp = train_predictor(rt, svcs, o, progress);
        const ab::error_stats mlp = tp.predictor->mlp_error(tp.test), lin = tp.predictor->linear_error(tp.test);
        std::printf("models %s on %s; predictor: %zu groups to train, %zu held out\n", o.models_text.c_str(),
                    device->caps().name.c_str(), tp.train.size(), tp.test.size());
        print_predictor_errors(tp, mlp, lin);
        for (service& s : svcs) s.predictor_index = tp.predictor->index_of(s.sm.key);

        // 2. Serving: the same arrivals for every policy.
        const std::vector<arrival> arrivals = plan_arrivals(svcs, double(device->caps().compute_units), o);
        print_services(svcs, o);
        std::vector<policy_result> results;
        for (const gpu::policy pol : *policies) {
            auto step = progress.begin(std::string("policy ") + gpu::policy_name(pol));
            results.push_back(run_policy(rt, *device, svcs, arrivals, pol, tp.predictor, o.seconds));
            const policy_result& r = results.back();
            char line[128];
            std::snprintf(line, sizeof line, "%.2f%% violations, %.1f queries/s within the deadline",
                          r.violations_pct(), r.goodput());
            step.result(line);
        }
        const headline_violations v = print_policy_results(results, csv.get());
        if (csv) csv->commit();
        if (!work.empty()) fs::remove_all(work);
        std::printf("predictor_err_pct=%.1f lr_err_pct=%.1f abacus_violations_pct=%.2f reef_violations_pct=%.2f\n",
                    mlp.mean_pct, lin.mean_pct, v.abacus, v.reef);
    } catch (const std::exception& e) {
        if (!work.empty()) fs::remove_all(work);
        std::fprintf(stderr, "abacus_bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
