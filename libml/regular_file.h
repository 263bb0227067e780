// Reading a file a program was told to read (a model, a config, a profile, a key), as hostile
// input: a FIFO, a character device or a directory at that path must be refused, not waited
// on or read forever, and a file larger than the reader's limit must be refused before a
// byte of it is held. The file is opened without blocking (opening a FIFO for reading
// otherwise waits for a writer) and its type and size are taken from the open descriptor, so
// nothing can be swapped in between the check and the read. Header-only: libml reads model
// files with it, the daemon everything else it reads.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

namespace reefline::ml {

// A file that could not be read; what() names the path and the problem.
struct file_refused : std::runtime_error {
    using std::runtime_error::runtime_error;
};
// One larger than the reader's limit (callers may word it with their own option's name).
struct file_too_large : file_refused {
    uint64_t size, limit;
    file_too_large(const std::string& path, uint64_t s, uint64_t l)
        : file_refused(path + " is " + std::to_string(s) + " bytes; the limit is " + std::to_string(l)), size(s), limit(l) {}
};

inline const char* file_type_name(mode_t m) {
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

// The whole of `path`, at most `limit` bytes. Throws file_refused ("PATH is a FIFO, not a
// regular file", "cannot open PATH: ...") or file_too_large.
inline std::string read_regular_file(const std::string& path, uint64_t limit) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) throw file_refused("cannot open " + path + ": " + std::strerror(errno));
    struct closer {
        int fd;
        ~closer() { ::close(fd); }
    } close_it{fd};
    struct stat st {};
    if (::fstat(fd, &st) != 0) throw file_refused("cannot stat " + path + ": " + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) throw file_refused(path + " is " + file_type_name(st.st_mode) + ", not a regular file");
    const uint64_t size = uint64_t(st.st_size);
    if (size > limit) throw file_too_large(path, size, limit);
    // Back to blocking reads (a regular file never blocks; this only keeps read() plain).
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    std::string bytes(size_t(size), '\0');
    size_t got = 0;
    while (got < size) {
        const ssize_t n = ::read(fd, bytes.data() + got, size - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw file_refused("cannot read " + path + ": " + std::strerror(errno));
        if (n == 0) throw file_refused(path + " shrank while it was read");
        got += size_t(n);
    }
    // A file that grew meanwhile is read as it was when opened: the limit holds.
    return bytes;
}

// The same, or nothing when `path` does not exist (optional files: a profile, a predictor).
inline std::optional<std::string> read_regular_file_if_present(const std::string& path, uint64_t limit) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 && errno == ENOENT) return std::nullopt;
    return read_regular_file(path, limit);
}

}  // namespace reefline::ml
