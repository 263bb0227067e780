// The model repository: one directory per model, `<repo>/<model>/config.json` (the add_model
// request that created it, as the control plane took it), `model.onnx` and `profile.json` (its
// kernel profiles on this device, when it was profiled). Models added
// through the control plane are written here, so a restart brings them back; removing one
// deletes its directory. Writes go to a temporary name first and are renamed into place, so
// a crash never leaves a half-written config that would stop the next start.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace reefline::ifm {

struct repository_entry {
    std::string name;
    nlohmann::json config;              // add_model fields, "onnx" pointing into the entry
    std::filesystem::path onnx;
};

class model_repository {
public:
    // Creates the directory if missing. Throws std::runtime_error when it cannot.
    explicit model_repository(std::filesystem::path dir);

    const std::filesystem::path& dir() const { return _dir; }
    std::filesystem::path model_dir(const std::string& name) const { return _dir / name; }
    bool contains(const std::string& name) const;

    // Stores the model file (`bytes`, the content of `onnx` as it was loaded, written unless
    // `onnx` already is the entry's file) and `config` (compact JSON). Returns the entry's
    // model.onnx path. Throws std::runtime_error naming the path.
    std::filesystem::path save(const std::string& name, const nlohmann::json& config,
                               const std::filesystem::path& onnx, std::string_view bytes);
    // Rewrites only the config (after `set`).
    void save_config(const std::string& name, const nlohmann::json& config);
    // The entry's kernel profiles (`profile.json`, dkp/profile.h), written atomically; read
    // back as text (empty when there is none), at most max_profile_bytes.
    void save_profile(const std::string& name, const std::string& json);
    std::string load_profile(const std::string& name) const;
    static constexpr size_t max_profile_bytes = 16 << 20;
    void remove(const std::string& name);
    // Every entry with a readable config and model file; the others are reported in `problems`.
    std::vector<repository_entry> entries(std::vector<std::string>& problems) const;
    // One entry. Throws std::runtime_error when it is missing, unreadable, larger than
    // max_config_bytes or not a JSON object nested at most max_json_depth deep.
    repository_entry entry(const std::string& name) const;

    // A config holds one IF's settings: a few hundred bytes.
    static constexpr size_t max_config_bytes = 64 * 1024;

private:
    std::filesystem::path _dir;
};

}  // namespace reefline::ifm
