// GoogleTest main for tests that need DPDK: starts EAL on one lcore without hugepages or
// PCI, in memory only, so test binaries can run side by side.
#include <gtest/gtest.h>

#include <cstdio>

#include "dataplane/eal.h"

int main(int argc, char** argv) {
    ::testing::InitGoogleTest(&argc, argv);
    try {
        reefline::dp::eal_init(argv[0], {"-l", "0", "--no-pci", "--no-shconf", "--no-telemetry",
                                         "--no-huge", "-m", "512", "--log-level", "lib.eal:error"});
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
    const int rc = RUN_ALL_TESTS();
    reefline::dp::eal_cleanup();
    return rc;
}
