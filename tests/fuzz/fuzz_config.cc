// libFuzzer target: the daemon's --config parser (ifmanager/daemon_config.h), TOML and JSON.
// Invariant: it returns configuration items or throws CLI::ConfigError, whatever the text;
// any other exception escapes and fails the run.
#include <cstdint>
#include <string>

#include "ifmanager/daemon_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    try {
        const auto items = reefline::ifm::parse_config_text(text);
        for (const auto& item : items) (void)item.fullname();
    } catch (const CLI::ConfigError&) {
    }
    return 0;
}
