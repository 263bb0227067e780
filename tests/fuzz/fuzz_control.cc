// libFuzzer target: the control plane's message handler (if_manager::handle_message) of a
// real IF manager, on a net_null port with the cpu device, a model repository in a temp dir
// and a small memory budget. Invariant: every input gets one reply that parses as a JSON
// object with a boolean "ok". A tiny model file lies at a fixed path (see model_path) so that
// inputs can add, set, describe and remove real IFs.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>

#include "dataplane/eal.h"
#include "dataplane/engine.h"
#include "ifmanager/manager.h"
#include "libml/libml.h"
#include "tests/chain_model.h"

namespace fs = std::filesystem;
namespace dp = reefline::dp;
namespace ifm = reefline::ifm;

namespace {

// The seed corpus names this file (tests/fuzz/corpus/control/add_model*).
const fs::path fuzz_dir = "/tmp/reefline-fuzz-control";
const fs::path model_path = fuzz_dir / "model.onnx";

// x [1, 3, 4, 4] -> Relu -> GlobalAveragePool -> Flatten: loads and plans in milliseconds.
void write_model() {
    std::ofstream(model_path, std::ios::binary)
        << reefline::testing::chain_model({1, 3, 4, 4}, {"Relu", "GlobalAveragePool", "Flatten"});
}

struct fuzzed_daemon {
    std::unique_ptr<dp::dataplane> plane;
    std::unique_ptr<reefline::gpu::device> device;
    std::unique_ptr<reefline::ml::runtime> runtime;
    std::unique_ptr<reefline::gpu::scheduler> scheduler;
    std::unique_ptr<ifm::model_repository> repo;
    std::unique_ptr<ifm::if_manager> manager;
    uint64_t inputs = 0;

    void start_manager() {
        manager.reset();
        std::error_code ec;
        fs::remove_all(fuzz_dir / "repo", ec);
        repo = std::make_unique<ifm::model_repository>(fuzz_dir / "repo");
        ifm::manager_info info{"0.1.0", "cpu", "reef"};
        info.memory_budget_bytes = 64 << 20;
        info.max_model_file_bytes = 1 << 20;
        manager = std::make_unique<ifm::if_manager>(*plane, *runtime, *scheduler, repo.get(), info);
    }
};

fuzzed_daemon* the_daemon = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    fs::create_directories(fuzz_dir);
    write_model();
    dp::eal_init("fuzz_control", {"-l", "0", "--no-pci", "--no-shconf", "--no-telemetry", "--no-huge", "-m", "256",
                                  "--vdev=net_null0,no-rx=1", "--log-level", "*:error"});
    auto* d = new fuzzed_daemon;
    dp::dataplane_config c;
    c.port.port_id = 0;
    c.port.rx_mbufs = 1023;
    c.port.tx_mbufs = 1023;
    c.port.rx_descriptors = c.port.tx_descriptors = 256;
    d->plane = std::make_unique<dp::dataplane>(c);
    reefline::gpu::cpu_device_options o;
    o.compute_units = 1;
    d->device = reefline::gpu::make_cpu_device(o);
    d->runtime = std::make_unique<reefline::ml::runtime>(*d->device);
    d->scheduler = std::make_unique<reefline::gpu::scheduler>(*d->device);
    d->start_manager();
    the_daemon = d;
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzzed_daemon& d = *the_daemon;
    const std::string reply = d.manager->handle_message({reinterpret_cast<const char*>(data), size});
    const nlohmann::json r = nlohmann::json::parse(reply, nullptr, false);
    if (r.is_discarded() || !r.is_object() || !r.contains("ok") || !r["ok"].is_boolean()) {
        std::fprintf(stderr, "fuzz_control: reply is not a JSON object with \"ok\": %s\n", reply.substr(0, 400).c_str());
        std::abort();
    }
    // A shutdown request is final for a manager; a fresh one keeps add_model reachable. So
    // does a fresh start now and then (the repository and the IFs do not pile up).
    if (d.manager->shutdown_requested() || ++d.inputs % 4096 == 0) d.start_manager();
    return 0;
}
