// The daemon's --config file (README, "Operating the appliance"): TOML, or JSON when its first
// non-blank character is '{'. Kept out of reefline.cc so that tests and the config fuzzer
// (tests/fuzz/fuzz_config.cc) run the parser the daemon runs.
#pragma once

#include <CLI/CLI.hpp>

#include <istream>
#include <string>
#include <vector>

namespace reefline::ifm {

// A configuration holds a few dozen options; a file larger than this is refused unread.
inline constexpr size_t max_config_file_bytes = 1 << 20;

// `text` as CLI11 configuration items: TOML through CLI11's reader, or a flat JSON object of
// option names (long form without the dashes) to a string, number, bool or array of them
// (repeated options such as "model"). Throws CLI::ConfigError naming the problem, and nothing
// else, whatever the text holds.
std::vector<CLI::ConfigItem> parse_config_text(const std::string& text);

// The formatter the daemon installs with CLI::App::config_formatter(): reads at most
// max_config_file_bytes, then parse_config_text().
class toml_or_json_config : public CLI::ConfigTOML {
public:
    std::vector<CLI::ConfigItem> from_config(std::istream& in) const override;
};

}  // namespace reefline::ifm
