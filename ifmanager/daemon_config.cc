#include "ifmanager/daemon_config.h"

#include <sstream>

#include "ifmanager/bounded_json.h"

namespace reefline::ifm {

namespace {

std::vector<CLI::ConfigItem> parse_json_config(const std::string& text) {
    nlohmann::json j;
    try {
        j = bounded_parse(text);
    } catch (const json_refused& e) {
        throw CLI::ConfigError(std::string("--config: ") + e.what());
    }
    if (!j.is_object()) throw CLI::ConfigError("--config: a JSON configuration is one object of option names");
    const auto scalar = [](const std::string& key, const nlohmann::json& v) {
        if (v.is_string()) return v.get<std::string>();
        if (v.is_boolean()) return std::string(v.get<bool>() ? "true" : "false");
        if (v.is_number()) return v.dump();
        throw CLI::ConfigError("--config: \"" + excerpt(key) + "\": expected a string, number, bool or array of them");
    };
    std::vector<CLI::ConfigItem> items;
    for (const auto& [key, v] : j.items()) {
        CLI::ConfigItem item;
        item.name = key;
        if (v.is_array())
            for (const auto& e : v) item.inputs.push_back(scalar(key, e));
        else
            item.inputs.push_back(scalar(key, v));
        items.push_back(std::move(item));
    }
    return items;
}

}  // namespace

std::vector<CLI::ConfigItem> parse_config_text(const std::string& text) {
    const auto first = text.find_first_not_of(" \t\r\n");
    if (first != std::string::npos && text[first] == '{') return parse_json_config(text);
    try {
        std::istringstream toml(text);
        return CLI::ConfigTOML().from_config(toml);
    } catch (const CLI::ConfigError&) {
        throw;
    } catch (const std::exception& e) {
        // CLI11's reader may fail with a library error on malformed input; it is still the
        // file's problem.
        throw CLI::ConfigError(std::string("--config: cannot parse the file: ") + e.what());
    }
}

std::vector<CLI::ConfigItem> toml_or_json_config::from_config(std::istream& in) const {
    std::string text(max_config_file_bytes + 1, '\0');
    in.read(text.data(), std::streamsize(text.size()));
    text.resize(size_t(in.gcount()));
    if (text.size() > max_config_file_bytes)
        throw CLI::ConfigError("--config: the file is larger than " + std::to_string(max_config_file_bytes) + " bytes");
    return parse_config_text(text);
}

}  // namespace reefline::ifm
