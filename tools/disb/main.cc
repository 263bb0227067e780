// disb: REEF's inference-serving benchmark (DISB, OSDI'22 §7) on this machine's device, every
// policy side by side on the same arrival sequences (same seed).
//
//   build/tools/disb --workload A|B|C|D|E|REAL|FILE[,...] --policies rt_only,reef,seq,streams
//                    [--tiny] [--seconds 10] [--scale auto|F] [--out DIR] [--compute-units N]
//                    [--backend cpu|cuda|hip]  (a GPU build's backend: build-cuda/tools/disb)
//
// In-process (--mode inprocess, the default): the clients submit tasks to the scheduler through
// the IF API (libml instances of the zoo's models), which is how policies compare fastest.
// Network (--mode network, root): the daemon with one IF per client on a veth pair, reefgen
// clients in a network namespace, every RT answer verified by reefverify; `both` runs each
// workload both ways ("A" and "A/net" in the report). RT clients follow their arrival
// schedules (uniform, Poisson, camera, trace; a request that finds its client's four
// instances busy waits for one, and that wait is part of its latency); BE clients keep a task
// outstanding (closed loop). Rates: a client's share of the device (workload.h) over its
// model's isolated latency here, printed before the runs.
//
// Report per workload and policy: RT latency mean/p50/p99 (arrival to end) and normalised to
// rt_only; overall throughput (RT + BE requests per second) and normalised to rt_only; BE
// throughput; SLO attainment (RT requests within --slo-factor x their model's isolated
// latency); preemptions; restored and re-executed kernels. A progress bar while running, a
// table at the end; with --out, results.csv and fig11.png (tools/disb/plot.py, REEF Fig. 11's
// grouped bars). Last line: key=value pairs, among them reef_rt_latency_vs_rt_only and
// reef_throughput_vs_rt_only (the worst over the workloads run).
#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "dkp/selector.h"
#include "libml/libml.h"
#include "preempt/backend_option.h"
#include "preempt/scheduler.h"
#include "libml/runtime/synthetic_inputs.h"
#include "tools/disb/workload.h"

namespace fs = std::filesystem;
namespace ml = reefline::ml;
namespace gpu = reefline::gpu;
namespace disb = reefline::disb;
using clk = std::chrono::steady_clock;

namespace {

int64_t now_ns() { return std::chrono::duration_cast<std::chrono::nanoseconds>(clk::now().time_since_epoch()).count(); }

double percentile(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, size_t(p * double(v.size())))];
}

// A model of the zoo, loaded once: its isolated latency at batch 1 and its plan's profile.
struct loaded_model {
    std::shared_ptr<ml::model> m;
    std::vector<int64_t> lengths;  // a sequence model's one planned length
    double isolated_ms = 0;
    reefline::dkp::plan_profile profile;
};

struct policy_spec {
    std::string name;
    gpu::policy pol;
    bool dkp;
};

struct run_result {
    std::string workload, policy;
    uint64_t rt_submitted = 0, rt_completed = 0, rt_failed = 0, rt_in_slo = 0, be_completed = 0;
    double seconds = 0, rt_mean = 0, rt_p50 = 0, rt_p99 = 0;
    gpu::scheduler_stats sched;
    double throughput() const { return double(rt_completed + be_completed) / seconds; }
    double be_throughput() const { return double(be_completed) / seconds; }
    double slo_attainment() const { return rt_submitted ? double(rt_in_slo) / double(rt_submitted) : 1.0; }
};

class bench {
public:
    bench(gpu::device& dev, fs::path zoo, bool tiny, double slo_factor)
        : _dev(dev), _rt(dev), _zoo(std::move(zoo)), _tiny(tiny), _slo_factor(slo_factor) {}

    loaded_model& model(const std::string& name) {
        auto it = _models.find(name);
        if (it != _models.end()) return it->second;
        loaded_model lm;
        const fs::path file = _zoo / ((_tiny ? name + "_tiny" : name) + ".onnx");
        if (!fs::exists(file)) throw std::runtime_error("no model " + file.string() + " (the zoo writes it)");
        ml::import_options io;
        io.unbound_dim = ml::sequence_buckets[0];
        lm.m = _rt.load_model(file.string(), io);
        try {
            const ml::request_input& r = lm.m->requests();
            // BERT at sequence length 128 (REEF's), or the longest a tiny model takes.
            if (r.kind == ml::request_kind::sequence) lm.lengths = {r.bucket_for(128) ? r.bucket_for(128) : r.max_length()};
        } catch (const std::exception&) {
        }
        auto in = instance_of(lm);
        std::vector<double> ms;
        for (int i = 0; i < 6; ++i) {
            std::vector<ml::tensor> ys;
            const auto t0 = clk::now();
            _rt.infer_batch(*in, inputs_of(*in), ys);
            if (i) ms.push_back(std::chrono::duration<double, std::milli>(clk::now() - t0).count());
        }
        lm.isolated_ms = percentile(ms, 0.5);
        lm.profile = _rt.profile(*in, 3);
        return _models.emplace(name, std::move(lm)).first->second;
    }

    std::unique_ptr<ml::instance> instance_of(const loaded_model& lm) {
        auto in = _rt.link_model(lm.m);
        _rt.configure_batch(*in, 1, lm.lengths);
        if (!lm.profile.launches.empty()) _rt.apply_profile(*in, lm.profile);
        _rt.write_inputs(*in, inputs_of(*in));
        return in;
    }

    std::vector<ml::tensor> inputs_of(const ml::instance& in) {
        return ml::synthetic_inputs(in.inputs(), 7);
    }

    run_result run(const disb::workload& w, const std::vector<double>& rates, const policy_spec& p, double seconds,
                   uint64_t seed, bool progress);

private:
    gpu::device& _dev;
    ml::runtime _rt;
    fs::path _zoo;
    bool _tiny;
    double _slo_factor;
    std::map<std::string, loaded_model> _models;
};

run_result bench::run(const disb::workload& w, const std::vector<double>& rates, const policy_spec& p, double seconds,
                      uint64_t seed, bool progress) {
    gpu::scheduler_options so;
    so.pol = p.pol;
    if (p.dkp) so.padding = std::make_shared<reefline::dkp::rules_selector>();
    gpu::scheduler sched(_dev, so);
    run_result r;
    r.workload = w.name;
    r.policy = p.name;
    r.seconds = seconds;

    // Instances first (planning is not part of the run).
    struct rt_client {
        std::vector<std::unique_ptr<ml::instance>> pool;
        std::vector<ml::instance*> free;
        std::vector<double> at;
        double slo_ms = 0;
    };
    std::vector<std::unique_ptr<rt_client>> rts;
    std::vector<std::unique_ptr<ml::instance>> bes;
    for (size_t i = 0; i < w.clients.size(); ++i) {
        const disb::client_spec& c = w.clients[i];
        loaded_model& lm = model(c.model);
        if (c.rt) {
            auto rc = std::make_unique<rt_client>();
            for (int k = 0; k < 4; ++k) {
                rc->pool.push_back(instance_of(lm));
                rc->free.push_back(rc->pool.back().get());
            }
            disb::client_spec sized = c;
            sized.rate = rates[i];
            rc->at = disb::arrivals(sized, seconds, seed);
            rc->slo_ms = _slo_factor * lm.isolated_ms;
            rts.push_back(std::move(rc));
        } else if (p.pol != gpu::policy::rt_only) {
            bes.push_back(instance_of(lm));
        }
    }

    std::mutex mu;
    std::condition_variable cv;
    std::vector<double> lat;
    uint64_t outstanding = 0;
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> be_done{0};
    const int64_t t0 = now_ns() + 50'000'000;  // everyone starts together, 50 ms from now
    std::vector<std::thread> threads;
    for (auto& rcp : rts) {
        rt_client& rc = *rcp;
        threads.emplace_back([&, &rc = rc] {
            for (const double at : rc.at) {
                const int64_t arrival = t0 + int64_t(at * 1e9);
                while (now_ns() < arrival) std::this_thread::sleep_for(std::chrono::nanoseconds(std::min<int64_t>(arrival - now_ns(), 200'000)));
                ml::instance* in;
                {
                    std::unique_lock lk(mu);
                    cv.wait(lk, [&] { return !rc.free.empty(); });
                    in = rc.free.back();
                    rc.free.pop_back();
                    ++outstanding;
                    ++r.rt_submitted;
                }
                gpu::task t;
                t.cls = gpu::task_class::rt;
                t.launches = _rt.task_launches(*in);
                for (const auto& l : t.launches) t.est_us += l.est_us;
                t.on_done = [&, in, arrival](const gpu::task_result& res) {
                    std::lock_guard lk(mu);
                    if (res.status == gpu::task_status::completed) {
                        const double ms = double(res.end_ns - arrival) / 1e6;
                        lat.push_back(ms);
                        ++r.rt_completed;
                        if (ms <= rc.slo_ms) ++r.rt_in_slo;
                    } else {
                        ++r.rt_failed;
                    }
                    rc.free.push_back(in);
                    --outstanding;
                    cv.notify_all();
                };
                sched.submit(std::move(t));
            }
        });
    }
    for (auto& bp : bes) {
        ml::instance* in = bp.get();
        threads.emplace_back([&, in] {
            while (now_ns() < t0) std::this_thread::sleep_for(std::chrono::microseconds(200));
            const auto launches = _rt.task_launches(*in);
            double est = 0;
            for (const auto& l : launches) est += l.est_us;
            while (!stop.load()) {
                gpu::task t;
                t.cls = gpu::task_class::be;
                t.launches = launches;
                t.est_us = est;
                const gpu::task_result res = sched.wait(sched.submit(std::move(t)));
                if (res.status == gpu::task_status::completed && res.end_ns <= t0 + int64_t(seconds * 1e9)) ++be_done;
            }
        });
    }
    // The progress bar, while the run lasts.
    const bool tty = progress && isatty(2);
    for (;;) {
        const double el = double(now_ns() - t0) / 1e9;
        if (el >= seconds) break;
        if (tty && el > 0) {
            const int filled = int(30 * el / seconds);
            std::fprintf(stderr, "\r  %-5s %-9s [%s%s] %4.1f/%.0f s", w.name.c_str(), p.name.c_str(), std::string(size_t(filled), '#').c_str(),
                         std::string(size_t(30 - filled), '.').c_str(), el, seconds);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (tty) std::fprintf(stderr, "\r%80s\r", "");
    stop = true;
    for (size_t i = 0; i < rts.size(); ++i) threads[i].join();  // every RT arrival issued
    {
        std::unique_lock lk(mu);  // and answered (a saturated policy may take a while)
        cv.wait_for(lk, std::chrono::seconds(120), [&] { return outstanding == 0; });
    }
    sched.shutdown();  // cancels the BE tasks in flight
    for (size_t i = rts.size(); i < threads.size(); ++i) threads[i].join();
    r.be_completed = be_done.load();
    r.sched = sched.stats();
    double sum = 0;
    for (double v : lat) sum += v;
    r.rt_mean = lat.empty() ? 0 : sum / double(lat.size());
    r.rt_p50 = percentile(lat, 0.5);
    r.rt_p99 = percentile(lat, 0.99);
    return r;
}

// ---- network mode --------------------------------------------------------------------------
// The daemon with one IF per client (reefline on net_af_packet over a veth pair), reefgen
// clients in a network namespace (RT: their arrival pattern; BE: closed loop, one request
// outstanding), every RT answer checked by reefverify against libml on the same inputs.
// Latency: the client's, first fragment sent to last answer fragment received.

std::string run_output(const std::string& cmd, int* rc = nullptr) {
    std::string out;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) throw std::runtime_error("cannot run: " + cmd);
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    const int status = pclose(p);
    if (rc) *rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return out;
}

// What reefgen sends to a model: `--shape HxWxC`, `--tokens L` or `--format tensor --dims ...`.
std::string payload_args(const loaded_model& lm) {
    const ml::request_input& r = lm.m->requests();
    switch (r.kind) {
    case ml::request_kind::image:
        return "--shape " + std::to_string(r.height) + "x" + std::to_string(r.width) + "x" + std::to_string(r.channels);
    case ml::request_kind::sequence:
        return "--tokens " + std::to_string(lm.lengths.empty() ? r.max_length() : lm.lengths[0]);
    case ml::request_kind::tensor: {
        std::string d;
        for (int64_t x : r.item) d += (d.empty() ? "" : ",") + std::to_string(x);
        return "--format tensor --dims " + d;
    }
    }
    return "";
}

run_result run_network(bench& b, const fs::path& root, const fs::path& zoo, bool tiny, const disb::workload& w,
                       const std::vector<double>& rates, const policy_spec& p, double seconds, uint64_t seed, double slo_factor) {
    if (geteuid() != 0) throw std::runtime_error("--mode network needs root (network namespaces)");
    const fs::path bin = root / "build";
    const std::string id = std::to_string(getpid());
    const std::string ns = "disb" + id, host_if = "dbh" + id, cam_if = "dbc" + id;
    const fs::path tmp = fs::temp_directory_path() / ("disb_net." + id);
    fs::create_directories(tmp);
    const std::string lib = (root / "scripts/lib/camera-netns.sh").string();
    struct cleanup_t {
        std::string lib, ns, host_if;
        fs::path tmp;
        pid_t daemon = 0;
        ~cleanup_t() {
            if (daemon > 0) {
                kill(daemon, SIGINT);
                int st;
                waitpid(daemon, &st, 0);
            }
            std::system(("bash -c 'source " + lib + "; camera_netns_down " + ns + " " + host_if + "' >/dev/null 2>&1").c_str());
            std::error_code ec;
            fs::remove_all(tmp, ec);
        }
    } cleanup{lib, ns, host_if, tmp};
    if (std::system(("bash -c 'source " + lib + "; camera_netns_up " + ns + " " + host_if + " " + cam_if + "'").c_str()) != 0)
        throw std::runtime_error("cannot create a network namespace here");
    // The daemon, one IF per client (ports 9100 + i), batch 1 as the in-process clients.
    const std::string ctl = "ipc://" + (tmp / "ctl.sock").string();
    std::vector<std::string> args = {(bin / "ifmanager/reefline").string(), "--policy", p.pol == gpu::policy::reef ? "reef" : gpu::policy_name(p.pol),
                                     "--dkp", p.dkp ? "on" : "off", "--control", ctl, "--repo", (tmp / "repo").string(),
                                     "--metrics", "off", "--ip", "198.18.0.2", "--age-ms", "1000", "--max-batch", "1", "--eal",
                                     "-l 0 --no-pci --no-shconf --no-huge -m 1024 --no-telemetry --log-level lib.eal:error "
                                     "--vdev=net_af_packet0,iface=" + host_if + ",framecnt=16384"};
    for (size_t i = 0; i < w.clients.size(); ++i) {
        const auto& c = w.clients[i];
        if (p.pol == gpu::policy::rt_only && !c.rt) continue;
        const fs::path file = zoo / ((tiny ? c.model + "_tiny" : c.model) + ".onnx");
        args.push_back("--model");
        args.push_back(c.name + ":" + std::to_string(9100 + i) + ":" + file.string() + ":" + (c.rt ? "rt" : "be") + ":600000");
    }
    const pid_t pid = fork();
    if (pid == 0) {
        const int out = ::open((tmp / "reefline.out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        const int err = ::open((tmp / "reefline.err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(out, 1);
        dup2(err, 2);
        std::vector<char*> av;
        for (auto& a : args) av.push_back(a.data());
        av.push_back(nullptr);
        execv(av[0], av.data());
        _exit(127);
    }
    cleanup.daemon = pid;
    const auto serving = [&] {
        std::ifstream e(tmp / "reefline.err");
        std::string t((std::istreambuf_iterator<char>(e)), {});
        return t.find("reefline: serving") != std::string::npos;
    };
    for (int i = 0; i < 600 && !serving(); ++i) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            cleanup.daemon = 0;
            std::ifstream e(tmp / "reefline.err");
            throw std::runtime_error("reefline exited: " + std::string((std::istreambuf_iterator<char>(e)), {}));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (!serving()) throw std::runtime_error("reefline did not start within 60 s");
    run_result r;
    r.workload = w.name;
    r.policy = p.name;
    r.seconds = seconds;
    const std::string gen = "ip netns exec " + ns + " " + (bin / "tools/reefgen").string() + " send --dst 198.18.0.2";
    // The network path adds to a model's latency what the in-process rates do not know (packets,
    // reassembly, the IF, the answer): each RT client's rate is rescaled to the same device share
    // of its model's isolated latency through the daemon, probed here one request at a time.
    // Probed once per workload (the first policy's run), so that every policy gets the same
    // arrivals.
    static std::map<std::string, std::vector<double>> probed;
    const bool have = probed.count(w.name) != 0;
    std::vector<double>& net_rates = probed[w.name];
    if (!have) net_rates = rates;
    for (size_t i = 0; i < w.clients.size() && !have; ++i) {
        const auto& c = w.clients[i];
        if (!c.rt || !(rates[i] > 0)) continue;
        loaded_model& lm = b.model(c.model);
        const std::string out = run_output(gen + " --dport " + std::to_string(9100 + i) + " " + payload_args(lm) +
                                           " --seed 99 --closed-loop 1 --requests 200 --timeout-ms 2000 --json 2>/dev/null | tail -n 1");
        const auto j = nlohmann::json::parse(out, nullptr, false);
        const double p50_ms = j.is_discarded() ? 0 : j.value("p50_us", 0.0) / 1e3;
        if (p50_ms > lm.isolated_ms) net_rates[i] = rates[i] * lm.isolated_ms / p50_ms;
    }
    // BE clients: closed loop, stopped after the run (their answers are counted by the daemon).
    std::vector<pid_t> be_pids;
    std::vector<std::thread> rt_threads;
    std::vector<std::string> rt_results(w.clients.size());
    std::atomic<int> rt_failures{0};
    for (size_t i = 0; i < w.clients.size(); ++i) {
        const auto& c = w.clients[i];
        loaded_model& lm = b.model(c.model);
        const std::string base = gen + " --dport " + std::to_string(9100 + i) + " " + payload_args(lm) + " --seed " +
                                 std::to_string(seed + i) + " --sport " + std::to_string(42000 + i);
        if (!c.rt) {
            if (p.pol == gpu::policy::rt_only) continue;
            const pid_t bp = fork();
            if (bp == 0) {
                const int null = ::open("/dev/null", O_WRONLY);
                dup2(null, 1);
                dup2(null, 2);
                const std::string n = std::to_string(std::max<uint64_t>(1000, uint64_t(seconds * 20000)));
                execl("/bin/sh", "sh", "-c", (base + " --closed-loop 1 --requests " + n + " --timeout-ms 1000").c_str(), (char*)nullptr);
                _exit(127);
            }
            be_pids.push_back(bp);
            continue;
        }
        if (c.arrivals == disb::pattern::trace) throw std::runtime_error("--mode network: trace clients are not supported yet");
        const uint64_t n = std::max<uint64_t>(1, uint64_t(net_rates[i] * seconds));
        rt_results[i] = (tmp / (c.name + ".jsonl")).string();
        const std::string cmd = base + " --requests " + std::to_string(n) + " --rate " + std::to_string(net_rates[i]) +
                                (c.arrivals == disb::pattern::poisson ? " --poisson" : "") + " --timeout-ms 5000 --results " +
                                rt_results[i] + " --json > /dev/null 2>&1";
        rt_threads.emplace_back([&, cmd] {
            if (std::system(cmd.c_str()) != 0) ++rt_failures;
        });
    }
    for (auto& t : rt_threads) t.join();
    for (pid_t bp : be_pids) {
        kill(bp, SIGTERM);
        int st;
        waitpid(bp, &st, 0);
    }
    // Every RT answer against libml; latencies from the clients' records.
    std::vector<double> lat;
    for (size_t i = 0; i < w.clients.size(); ++i) {
        const auto& c = w.clients[i];
        if (!c.rt) continue;
        loaded_model& lm = b.model(c.model);
        const double slo_ms = slo_factor * lm.isolated_ms;
        r.rt_submitted += std::max<uint64_t>(1, uint64_t(net_rates[i] * seconds));  // sent (lost ones have no line)
        std::ifstream in(rt_results[i]);
        for (std::string line; std::getline(in, line);) {
            const auto j = nlohmann::json::parse(line, nullptr, false);
            if (j.is_discarded() || j.value("kind", "") != "response") continue;
            const double ms = j.value("latency_us", 0.0) / 1e3;
            lat.push_back(ms);
            ++r.rt_completed;
            if (ms <= slo_ms) ++r.rt_in_slo;
        }
        const fs::path file = zoo / ((tiny ? c.model + "_tiny" : c.model) + ".onnx");
        const std::string out = run_output((bin / "tools/reefverify").string() + " --model " + file.string() + " --results " +
                                           rt_results[i] + " " + payload_args(lm) + " --seed " + std::to_string(seed + i) +
                                           " --no-errors 2>&1 | tail -n 1");
        if (out.find("mismatched=0 errors=0") == std::string::npos)
            throw std::runtime_error("network mode: client " + c.name + "'s answers do not verify: " + out);
    }
    if (rt_failures) r.rt_failed = uint64_t(rt_failures.load());
    // BE answers and scheduler counters from the daemon.
    const std::string stats = run_output((bin / "tools/reefctl").string() + " --endpoint " + ctl + " --json stats");
    const auto j = nlohmann::json::parse(stats, nullptr, false);
    if (!j.is_discarded()) {
        for (const auto& f : j.value("ifs", nlohmann::json::array()))
            if (f.value("class", "") == "be") r.be_completed += f.value("responses_total", uint64_t(0));
        const auto sc = j.value("scheduler", nlohmann::json::object());
        r.sched.preemptions = sc.value("preemptions", uint64_t(0));
        r.sched.restores = sc.value("restores", uint64_t(0));
        r.sched.reexecuted_kernels = sc.value("reexecuted_kernels", uint64_t(0));
    }
    std::system(((bin / "tools/reefctl").string() + " --endpoint " + ctl + " shutdown > /dev/null 2>&1").c_str());
    int st;
    waitpid(pid, &st, 0);
    cleanup.daemon = 0;
    double sum = 0;
    for (double v : lat) sum += v;
    r.rt_mean = lat.empty() ? 0 : sum / double(lat.size());
    r.rt_p50 = percentile(lat, 0.5);
    r.rt_p99 = percentile(lat, 0.99);
    return r;
}

std::vector<policy_spec> parse_policies(const std::string& text) {
    std::vector<policy_spec> out;
    for (size_t at = 0; at <= text.size();) {
        const size_t comma = std::min(text.find(',', at), text.size());
        const std::string n = text.substr(at, comma - at);
        at = comma + 1;
        if (n.empty()) continue;
        policy_spec p{n, gpu::policy::reef, false};
        if (n == "reef+dkp" || n == "reef_dkp" || n == "dkp") {
            p.name = "reef+dkp";
            p.dkp = true;
        } else if (!gpu::parse_policy(n.c_str(), p.pol)) {
            throw CLI::ValidationError("--policies", "unknown policy '" + n + "' (" + gpu::policy_names() + ", reef+dkp)");
        }
        out.push_back(p);
    }
    if (out.empty()) throw CLI::ValidationError("--policies", "no policy");
    // rt_only first: the others are normalised to it.
    std::stable_sort(out.begin(), out.end(), [](const policy_spec& a, const policy_spec& b) {
        return a.pol == gpu::policy::rt_only && b.pol != gpu::policy::rt_only;
    });
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"disb: REEF's DISB workloads on this machine, every policy side by side"};
    std::string workloads_text = "A", policies_text = "rt_only,seq,streams,reef,reef+dkp,prema", scale_text = "auto", out, models;
    double seconds = 10, slo_factor = 5;
    unsigned units = 0;
    uint64_t seed = 1;
    bool tiny = false, quiet = false;
    app.add_option("--workload", workloads_text, "A, B, C, D, E, REAL, or a workload file (.csv/.json); several with commas")
        ->capture_default_str();
    app.add_option("--policies", policies_text, "policies to compare: " + gpu::policy_names() + ", and reef+dkp (reef with padding)")
        ->capture_default_str();
    app.add_flag("--tiny", tiny, "the zoo's tiny models (quick runs)");
    app.add_option("--seconds", seconds, "length of each run")->capture_default_str()->check(CLI::Range(0.5, 3600.0));
    app.add_option("--scale", scale_text, "auto: rates from each client's device share; F: the auto rates times F")
        ->capture_default_str();
    app.add_option("--slo-factor", slo_factor, "an RT request meets its SLO within this many times its model's isolated latency")
        ->capture_default_str();
    app.add_option("--out", out, "write results.csv and fig11.png here");
    app.add_option("--models", models, "directory of the zoo's models (default: written by the zoo tool beside disb)");
    app.add_option("--compute-units", units, "compute units of the cpu device (default: cores - 1)");
    app.add_option("--seed", seed, "seed of the arrival sequences (the same for every policy)")->capture_default_str();
    app.add_flag("--quiet", quiet, "no progress bar");
    std::string device_name = "cpu";
    gpu::add_backend_option(app, device_name);
    std::string mode = "inprocess";
    app.add_option("--mode", mode, "inprocess (clients submit to the scheduler), network (the daemon, reefgen clients over a veth "
                                   "pair in a namespace, every RT answer verified; root) or both")
        ->capture_default_str()
        ->check(CLI::IsMember({"inprocess", "network", "both"}));
    CLI11_PARSE(app, argc, argv);
    try {
        if (device_name != "cpu" && mode != "inprocess")
            throw CLI::ValidationError("--mode", "the network mode runs the daemon of the main build (cpu device); "
                                                 "--backend " + device_name + " takes --mode inprocess");
        double scale = 1;
        if (scale_text != "auto") {
            try {
                scale = std::stod(scale_text);
            } catch (const std::exception&) {
                scale = -1;
            }
            if (!(scale > 0)) throw CLI::ValidationError("--scale", "expected auto or a factor > 0, got '" + scale_text + "'");
        }
        const std::vector<policy_spec> policies = parse_policies(policies_text);
        std::vector<disb::workload> workloads;
        for (size_t at = 0; at <= workloads_text.size();) {
            const size_t comma = std::min(workloads_text.find(',', at), workloads_text.size());
            const std::string n = workloads_text.substr(at, comma - at);
            at = comma + 1;
            if (n.empty()) continue;
            const auto& names = disb::builtin_names();
            workloads.push_back(std::find(names.begin(), names.end(), n) != names.end() ? disb::builtin(n) : disb::from_file(n));
        }
        // The source tree (network mode's scripts, plot.py) is two levels above build/tools; the
        // zoo tool is beside this executable (any build*/tools, or a GPU bundle's tools/).
        const fs::path tools_dir = fs::canonical(fs::path(argv[0])).parent_path();
        const fs::path root = tools_dir.parent_path().parent_path();
        fs::path zoo = models;
        fs::path work;
        if (zoo.empty()) {
            work = fs::temp_directory_path() / ("disb." + std::to_string(getpid()));
            fs::create_directories(work);
            zoo = work;
            std::set<std::string> need;
            for (const auto& w : workloads)
                for (const auto& c : w.clients) need.insert(tiny ? c.model + "_tiny" : c.model);
            std::string only;
            for (const auto& n : need) only += (only.empty() ? "" : ",") + n;
            const std::string cmd = (tools_dir / "zoo").string() + " --out " + zoo.string() + (tiny ? " --tiny" : "") +
                                    " --only " + only + " -q";
            if (std::system(cmd.c_str()) != 0) throw std::runtime_error("the zoo tool failed: " + cmd);
        }
        gpu::backend_options bopt;
        bopt.compute_units = units;
        std::unique_ptr<gpu::device> device = gpu::make_backend(device_name, bopt);
        bench b(*device, zoo, tiny, slo_factor);
        std::printf("disb: %s, %s models, %.1f s per run, seed %llu\n", device->caps().name.c_str(), tiny ? "tiny" : "full-size",
                    seconds, (unsigned long long)seed);
        std::vector<run_result> results;
        for (const auto& w : workloads) {
            // Rates: each open-loop client's device share over its model's isolated latency.
            std::vector<double> rates(w.clients.size(), 0);
            std::printf("workload %s:\n", w.name.c_str());
            for (size_t i = 0; i < w.clients.size(); ++i) {
                const auto& c = w.clients[i];
                loaded_model& lm = b.model(c.model);
                if (c.arrivals != disb::pattern::closed && c.arrivals != disb::pattern::trace)
                    rates[i] = c.utilisation > 0 ? scale * c.utilisation / (lm.isolated_ms / 1e3) : scale * c.rate;
                std::printf("  %-5s %-2s %-13s %-8s isolated %8.2f ms", c.name.c_str(), c.rt ? "RT" : "BE", c.model.c_str(),
                            disb::pattern_name(c.arrivals), lm.isolated_ms);
                if (rates[i] > 0) std::printf("  rate %8.1f req/s (%.0f%% of the device)", rates[i], 100 * rates[i] * lm.isolated_ms / 1e3);
                else if (c.arrivals == disb::pattern::trace) std::printf("  trace of %zu arrivals", c.trace.size());
                std::printf("\n");
            }
            for (const auto& p : policies)
                for (const std::string m : {"inprocess", "network"}) {
                if (mode != "both" && m != mode) continue;
                results.push_back(m == "inprocess" ? b.run(w, rates, p, seconds, seed, !quiet)
                                                   : run_network(b, root, zoo, tiny, w, rates, p, seconds, seed, slo_factor));
                if (mode == "both") results.back().workload = w.name + (m == "network" ? "/net" : "");
                const run_result& r = results.back();
                std::printf("  %-9s %-9s RT %5llu/%-5llu mean %8.2f ms p99 %8.2f ms | BE %6.1f/s | %llu preemptions\n",
                            p.name.c_str(), m.c_str(), (unsigned long long)r.rt_completed, (unsigned long long)r.rt_submitted,
                            r.rt_mean, r.rt_p99, r.be_throughput(), (unsigned long long)r.sched.preemptions);
                std::fflush(stdout);
            }
        }
        // The table, normalised to rt_only of the same workload.
        std::printf("\n%-6s %-9s %9s %9s %9s %7s %7s %9s %7s %8s %7s %8s %8s %8s\n", "wl", "policy", "RT mean", "RT p50",
                    "RT p99", "mean/ro", "p99/ro", "thr req/s", "thr/ro", "BE req/s", "SLO", "preempt", "restores", "re-exec");
        std::map<std::string, const run_result*> ro;
        for (const auto& r : results)
            if (r.policy == "rt_only") ro[r.workload] = &r;
        const auto norm = [&](const run_result& r, double run_result::*f) {
            const auto it = ro.find(r.workload);
            return it != ro.end() && it->second->*f > 0 ? r.*f / it->second->*f : NAN;
        };
        const auto tnorm = [&](const run_result& r) {
            const auto it = ro.find(r.workload);
            return it != ro.end() && it->second->throughput() > 0 ? r.throughput() / it->second->throughput() : NAN;
        };
        for (const auto& r : results)
            std::printf("%-6s %-9s %7.2fms %7.2fms %7.2fms %7.3f %7.3f %9.1f %7.3f %8.1f %6.1f%% %8llu %8llu %8llu\n",
                        r.workload.c_str(), r.policy.c_str(), r.rt_mean, r.rt_p50, r.rt_p99, norm(r, &run_result::rt_mean),
                        norm(r, &run_result::rt_p99), r.throughput(), tnorm(r), r.be_throughput(), 100 * r.slo_attainment(),
                        (unsigned long long)r.sched.preemptions, (unsigned long long)r.sched.restores,
                        (unsigned long long)r.sched.reexecuted_kernels);
        if (!out.empty()) {
            fs::create_directories(out);
            std::ofstream csv(fs::path(out) / "results.csv");
            csv << "workload,policy,rt_submitted,rt_completed,rt_mean_ms,rt_p50_ms,rt_p99_ms,rt_mean_vs_rt_only,rt_p99_vs_rt_only,"
                   "throughput_per_s,throughput_vs_rt_only,be_per_s,slo_attainment,preemptions,restores,reexecuted_kernels\n";
            for (const auto& r : results)
                csv << r.workload << "," << r.policy << "," << r.rt_submitted << "," << r.rt_completed << "," << r.rt_mean << ","
                    << r.rt_p50 << "," << r.rt_p99 << "," << norm(r, &run_result::rt_mean) << "," << norm(r, &run_result::rt_p99)
                    << "," << r.throughput() << "," << tnorm(r) << "," << r.be_throughput() << "," << r.slo_attainment() << ","
                    << r.sched.preemptions << "," << r.sched.restores << "," << r.sched.reexecuted_kernels << "\n";
            csv.close();
            const std::string cmd = "/usr/bin/python3 " + (root / "tools/disb/plot.py").string() + " " +
                                    (fs::path(out) / "results.csv").string() + " " + (fs::path(out) / "fig11.png").string();
            // The CSV is the result; the figure needs matplotlib, which a GPU machine may lack.
            if (std::system(cmd.c_str()) != 0)
                std::printf("wrote %s (no figure: %s failed)\n", (fs::path(out) / "results.csv").c_str(), cmd.c_str());
            else
                std::printf("wrote %s and %s\n", (fs::path(out) / "results.csv").c_str(), (fs::path(out) / "fig11.png").c_str());
        }
        if (!work.empty()) fs::remove_all(work);
        // The last line: per policy the worst over the workloads (latency: highest mean ratio;
        // throughput: lowest ratio).
        std::string line;
        // Without an rt_only run a ratio is nan, and stays nan (max/min would drop it).
        const auto worse = [](double a, double b, bool higher) {
            return std::isnan(a) || std::isnan(b) ? NAN : higher ? std::max(a, b) : std::min(a, b);
        };
        for (const auto& p : policies) {
            if (p.pol == gpu::policy::rt_only && !p.dkp) continue;
            double lat = 0, thr = INFINITY, p99 = 0;
            for (const auto& r : results)
                if (r.policy == p.name) {
                    lat = worse(lat, norm(r, &run_result::rt_mean), true);
                    p99 = worse(p99, norm(r, &run_result::rt_p99), true);
                    thr = worse(thr, tnorm(r), false);
                }
            std::string key = p.name;
            std::replace(key.begin(), key.end(), '+', '_');
            char buf[256];
            std::snprintf(buf, sizeof buf, "%s%s_rt_latency_vs_rt_only=%.3f %s_rt_p99_vs_rt_only=%.3f %s_throughput_vs_rt_only=%.3f",
                          line.empty() ? "" : " ", key.c_str(), lat, key.c_str(), p99, key.c_str(), thr);
            line += buf;
        }
        std::printf("%s\n", line.c_str());
    } catch (const CLI::Error& e) {
        return app.exit(e);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "disb: %s\n", e.what());
        return 1;
    }
    return 0;
}
