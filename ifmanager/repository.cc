#include "ifmanager/repository.h"

#include <algorithm>
#include <fstream>
#include <stdexcept>
#include <system_error>

#include "ifmanager/bounded_json.h"
#include "libml/regular_file.h"

namespace reefline::ifm {

namespace fs = std::filesystem;

namespace {

void write_atomically(const fs::path& path, std::string_view text) {
    const fs::path tmp = path.string() + ".tmp";
    {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        out << text;
        out.flush();
        if (!out) throw std::runtime_error("cannot write " + tmp.string());
    }
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) throw std::runtime_error("cannot rename " + tmp.string() + " to " + path.string() + ": " + ec.message());
}

}  // namespace

model_repository::model_repository(fs::path dir) : _dir(std::move(dir)) {
    std::error_code ec;
    fs::create_directories(_dir, ec);
    if (ec || !fs::is_directory(_dir))
        throw std::runtime_error("model repository " + _dir.string() + ": cannot create it: " +
                                 (ec ? ec.message() : "not a directory"));
}

bool model_repository::contains(const std::string& name) const {
    std::error_code ec;
    return fs::exists(model_dir(name) / "config.json", ec);
}

fs::path model_repository::save(const std::string& name, const nlohmann::json& config, const fs::path& onnx,
                                std::string_view bytes) {
    const fs::path dir = model_dir(name);
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw std::runtime_error("cannot create " + dir.string() + ": " + ec.message());
    const fs::path target = dir / "model.onnx";
    // The bytes that were loaded, not the file again: it may have changed since.
    if (!fs::exists(target, ec) || !fs::equivalent(onnx, target, ec)) write_atomically(target, bytes);
    save_config(name, config);
    return target;
}

void model_repository::save_config(const std::string& name, const nlohmann::json& config) {
    nlohmann::json c = config;
    c["onnx"] = (model_dir(name) / "model.onnx").string();
    const std::string text = serialise(c);
    if (text.empty() || text.size() > max_config_bytes)
        throw std::runtime_error("the config of '" + name + "' cannot be written (" + std::to_string(text.size()) + " bytes)");
    write_atomically(model_dir(name) / "config.json", text + "\n");
}

void model_repository::save_profile(const std::string& name, const std::string& json) {
    if (json.size() > max_profile_bytes) return;  // a profile is an optimisation: not kept when absurd
    write_atomically(model_dir(name) / "profile.json", json);
}

std::string model_repository::load_profile(const std::string& name) const {
    // A profile is an optimisation: one that cannot be read (absent, not a regular file,
    // absurdly large) is profiled again.
    try {
        return ml::read_regular_file_if_present((model_dir(name) / "profile.json").string(), max_profile_bytes)
            .value_or(std::string());
    } catch (const ml::file_refused&) {
        return {};
    }
}

void model_repository::remove(const std::string& name) {
    std::error_code ec;
    fs::remove_all(model_dir(name), ec);
    if (ec) throw std::runtime_error("cannot remove " + model_dir(name).string() + ": " + ec.message());
}

repository_entry model_repository::entry(const std::string& name) const {
    const fs::path dir = model_dir(name);
    repository_entry e;
    e.name = name;
    e.onnx = dir / "model.onnx";
    const fs::path config = dir / "config.json";
    std::string text;
    try {
        text = ml::read_regular_file(config.string(), max_config_bytes);
    } catch (const ml::file_too_large&) {
        throw std::runtime_error(config.string() + ": larger than " + std::to_string(max_config_bytes) + " bytes");
    } catch (const ml::file_refused& e) {
        throw std::runtime_error(std::string("repository entry: ") + e.what());
    }
    try {
        e.config = bounded_parse(text);
    } catch (const json_refused& ex) {
        throw std::runtime_error(config.string() + ": " + ex.what());
    }
    if (!e.config.is_object()) throw std::runtime_error((dir / "config.json").string() + ": not a JSON object");
    std::error_code ec;
    if (!fs::is_regular_file(e.onnx, ec)) throw std::runtime_error("missing " + e.onnx.string());
    e.config["name"] = name;
    e.config["onnx"] = e.onnx.string();
    return e;
}

std::vector<repository_entry> model_repository::entries(std::vector<std::string>& problems) const {
    std::vector<repository_entry> out;
    std::error_code ec;
    std::vector<std::string> names;
    for (const auto& d : fs::directory_iterator(_dir, ec))
        if (d.is_directory()) names.push_back(d.path().filename().string());
    std::sort(names.begin(), names.end());
    for (const auto& n : names) {
        try {
            out.push_back(entry(n));
        } catch (const std::exception& e) {
            problems.push_back(e.what());
        }
    }
    return out;
}

}  // namespace reefline::ifm
