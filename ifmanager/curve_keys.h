// CURVE key files for the control plane (docs/control.md, "Remote control with CURVE"), shared by
// the daemon and reefctl. A key file holds one 40-character Z85 key (ZeroMQ's text form of a
// 32-byte Curve25519 key); a client list holds one public key per line, '#' starts a comment.
// `reefctl keygen --out PREFIX` writes PREFIX.key (secret, mode 0600) and PREFIX.pub.
#pragma once

#include <sys/stat.h>
#include <zmq.h>

#include <cctype>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "libml/regular_file.h"

namespace reefline::ifm {

inline constexpr size_t z85_key_chars = 40;

inline bool is_z85_key(const std::string& k) {
    if (k.size() != z85_key_chars) return false;
    uint8_t raw[32];
    return zmq_z85_decode(raw, k.c_str()) != nullptr;
}

// The first word of the file; throws std::runtime_error naming the file and the problem.
// Key files are small: anything larger (or not a regular file) is refused unread.
inline constexpr uint64_t max_key_file_bytes = 1 << 20;

inline std::string read_key_file(const std::string& path, const char* what) {
    try {
        return ml::read_regular_file(path, max_key_file_bytes);
    } catch (const ml::file_refused& e) {
        throw std::runtime_error(std::string(what) + ": " + e.what());
    }
}

inline std::string read_z85_key(const std::string& path, const char* what) {
    std::istringstream in(read_key_file(path, what));
    std::string key;
    in >> key;
    if (!is_z85_key(key))
        throw std::runtime_error(std::string(what) + " " + path + ": does not hold a 40-character Z85 key");
    return key;
}

// Every key of an allow-list file (at least one); a malformed line names its number.
inline std::vector<std::string> read_z85_key_list(const std::string& path) {
    std::istringstream in(read_key_file(path, "CURVE client list"));
    std::vector<std::string> keys;
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
        if (const auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
        size_t a = 0, b = line.size();
        while (a < b && std::isspace(static_cast<unsigned char>(line[a]))) ++a;
        while (b > a && std::isspace(static_cast<unsigned char>(line[b - 1]))) --b;
        if (a == b) continue;
        const std::string key = line.substr(a, b - a);
        if (!is_z85_key(key))
            throw std::runtime_error("CURVE client list " + path + ":" + std::to_string(n) +
                                     ": not a 40-character Z85 public key");
        keys.push_back(key);
    }
    if (keys.empty()) throw std::runtime_error("CURVE client list " + path + ": no keys in it");
    return keys;
}

// The public key that belongs to a secret key.
inline std::string curve_public_of(const std::string& secret) {
    char pub[z85_key_chars + 1];
    if (zmq_curve_public(pub, secret.c_str()) != 0)
        throw std::runtime_error(std::string("CURVE: cannot derive the public key: ") + zmq_strerror(zmq_errno()));
    return pub;
}

// Writes PREFIX.key (secret, 0600, created exclusively: an existing key is never overwritten)
// and PREFIX.pub; returns the public key.
inline std::string write_curve_keypair(const std::string& prefix) {
    char pub[z85_key_chars + 1], sec[z85_key_chars + 1];
    if (zmq_curve_keypair(pub, sec) != 0)
        throw std::runtime_error(std::string("CURVE: cannot make a key pair: ") + zmq_strerror(zmq_errno()));
    struct stat st {};
    for (const std::string& f : {prefix + ".key", prefix + ".pub"})
        if (::stat(f.c_str(), &st) == 0) throw std::runtime_error(f + " exists; not overwriting a key");
    const mode_t old = ::umask(077);
    std::ofstream key(prefix + ".key");
    ::umask(old);
    if (!(key << sec << '\n') || !(key.close(), key))
        throw std::runtime_error(prefix + ".key: cannot be written");
    std::ofstream p(prefix + ".pub");
    if (!(p << pub << '\n') || !(p.close(), p)) throw std::runtime_error(prefix + ".pub: cannot be written");
    return pub;
}

}  // namespace reefline::ifm
