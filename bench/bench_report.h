// bench_report.h: what every long benchmark in bench/ shares for reporting, header-only so that
// each benchmark (and the GPU-only builds that compile some of them without the rest of the
// tree) needs no extra library.
//
// progress: one line per finished step on stderr, e.g.
//     dataplane_bench [3/8] socket path, 1024 B fragments: 1.02 s (0.512 Mpps)
// so that a run of minutes shows where it is, while stdout keeps the table and the last line
// that scripts read (tail -1). It always prints: stderr is unbuffered and scripts that collect
// both streams still find the contract line last, because each step's line is written before
// the benchmark prints its last stdout line.
//
// csv_writer: the results table as CSV (RFC 4180's quoting: fields quoted when they hold a
// comma, a quote or a line break, quotes doubled; lines end in LF rather than the RFC's CRLF,
// which Python's csv module, pandas and spreadsheets read alike). It writes into FILE.tmp.PID
// beside FILE and renames it over FILE only when the table is complete (commit()), so a run
// that fails or is killed never leaves a half-written FILE behind, and a reader never sees
// one. The temporary file is created when the writer is, so an unwritable path fails before
// minutes of measuring, with an error naming the file.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace reefline::bench {

// ---------------------------------------------------------------------------------------
// Progress

class progress {
public:
    using clock = std::chrono::steady_clock;

    // `program` starts every line; `total` is the number of steps when known (0: unknown,
    // lines then say [N] instead of [N/total]).
    explicit progress(std::string program, unsigned total = 0) : _program(std::move(program)), _total(total) {}

    // When the number of steps is only known after some of them ran (e.g. after calibration).
    void set_total(unsigned total) { _total = total; }
    unsigned total() const { return _total; }
    unsigned done() const { return _done; }

    // One step: its line is printed when the step object goes out of scope (or end() is
    // called), with the time since it was started. A step left by an exception says so, so
    // that the last progress line of a failed run names what failed.
    class step {
    public:
        step(progress& owner, std::string what)
            : _owner(&owner), _what(std::move(what)), _start(clock::now()), _exceptions(std::uncaught_exceptions()) {}
        step(const step&) = delete;
        step& operator=(const step&) = delete;
        step(step&& o) noexcept
            : _owner(o._owner), _what(std::move(o._what)), _result(std::move(o._result)), _start(o._start),
              _exceptions(o._exceptions) {
            o._owner = nullptr;
        }
        ~step() { end(); }

        // A short result for the line ("17.2 Mpps"), shown in parentheses after the time.
        void result(std::string text) { _result = std::move(text); }
        double seconds() const { return std::chrono::duration<double>(clock::now() - _start).count(); }

        void end() {
            if (!_owner) return;
            progress& p = *_owner;
            _owner = nullptr;
            const bool failed = std::uncaught_exceptions() > _exceptions;
            p.print_step(_what, seconds(), failed ? std::string("failed") : _result);
        }

    private:
        progress* _owner;
        std::string _what;
        std::string _result;
        clock::time_point _start;
        int _exceptions;  // in flight when the step began: more at its end means it failed
    };

    [[nodiscard]] step begin(std::string what) { return step(*this, std::move(what)); }

    // A line that is not a step (a note between steps), with the program's prefix.
    void note(const std::string& text) const { std::fprintf(stderr, "%s: %s\n", _program.c_str(), text.c_str()); }

private:
    void print_step(const std::string& what, double seconds, const std::string& result) {
        ++_done;
        char count[48];
        if (_total) std::snprintf(count, sizeof count, "[%u/%u]", _done, _total);
        else std::snprintf(count, sizeof count, "[%u]", _done);
        // One fprintf per line: stderr is unbuffered, so a line is one write and lines from
        // other threads (DPDK's log) do not cut into it.
        if (result.empty())
            std::fprintf(stderr, "%s %s %s: %.2f s\n", _program.c_str(), count, what.c_str(), seconds);
        else
            std::fprintf(stderr, "%s %s %s: %.2f s (%s)\n", _program.c_str(), count, what.c_str(), seconds,
                         result.c_str());
    }

    std::string _program;
    unsigned _total;
    unsigned _done = 0;
};

// ---------------------------------------------------------------------------------------
// CSV

// One field. Numbers are written in C locale form whatever the process's locale (a plotting
// script must be able to read them back): integers exactly, floating-point values either
// with a fixed number of decimals (csv_cell::fixed) or as the shortest text that reads back
// as the same double. Non-finite values become "nan", "inf" and "-inf" (Python's float()
// reads all three); an empty cell (csv_cell::empty()) means "does not apply".
class csv_cell {
public:
    csv_cell(std::string_view text) : _text(quote(text)) {}
    csv_cell(const char* text) : _text(quote(text ? std::string_view(text) : std::string_view())) {}
    csv_cell(const std::string& text) : _text(quote(text)) {}
    template <std::integral T>
        requires(!std::same_as<T, bool> && !std::same_as<T, char>)
    csv_cell(T value) : _text(std::to_string(value)) {}
    csv_cell(double value) : _text(shortest(value)) {}
    csv_cell(float value) : _text(shortest(double(value))) {}

    static csv_cell fixed(double value, int decimals) {
        csv_cell c{0};
        if (!std::isfinite(value)) {
            c._text = shortest(value);
            return c;
        }
        char buf[64];
        const auto r = std::to_chars(buf, buf + sizeof buf, value, std::chars_format::fixed, decimals);
        c._text.assign(buf, r.ec == std::errc() ? r.ptr : buf);
        return c;
    }
    static csv_cell empty() {
        csv_cell c{0};
        c._text.clear();
        return c;
    }

    const std::string& text() const { return _text; }

    // RFC 4180: a field with a comma, a double quote or a line break is enclosed in double
    // quotes, and a double quote inside it is doubled.
    static std::string quote(std::string_view s) {
        if (s.find_first_of(",\"\r\n") == std::string_view::npos) return std::string(s);
        std::string q = "\"";
        for (char ch : s) {
            if (ch == '"') q += '"';
            q += ch;
        }
        q += '"';
        return q;
    }

private:
    static std::string shortest(double v) {
        if (std::isnan(v)) return "nan";
        if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
        char buf[64];
        const auto r = std::to_chars(buf, buf + sizeof buf, v);
        return std::string(buf, r.ec == std::errc() ? r.ptr : buf);
    }

    std::string _text;
};

class csv_writer {
public:
    // Opens FILE.tmp.PID for writing and writes the header. Throws std::runtime_error naming
    // FILE when it cannot be created (missing directory, no permission, full disk).
    csv_writer(std::string path, std::vector<std::string> columns)
        : _path(std::move(path)), _tmp(_path + ".tmp." + std::to_string(getpid())), _columns(std::move(columns)) {
        if (_path.empty()) throw std::runtime_error("CSV file name is empty");
        if (_columns.empty()) throw std::logic_error("CSV " + _path + ": no columns");
        // 0666 less the umask: the file gets the permissions any other file written here
        // would (mkstemp's 0600 would survive the rename).
        const int fd = ::open(_tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
        if (fd < 0) fail("cannot create", errno);
        _file = ::fdopen(fd, "w");
        if (!_file) {
            const int e = errno;
            ::close(fd);
            ::unlink(_tmp.c_str());
            fail("cannot open", e);
        }
        std::string header;
        for (size_t i = 0; i < _columns.size(); ++i) header += (i ? "," : "") + csv_cell::quote(_columns[i]);
        write_line(header);
    }
    csv_writer(const csv_writer&) = delete;
    csv_writer& operator=(const csv_writer&) = delete;

    // An uncommitted table is thrown away: FILE keeps what it had before (or stays absent).
    ~csv_writer() {
        if (_file) {
            std::fclose(_file);
            ::unlink(_tmp.c_str());
        }
    }

    const std::string& path() const { return _path; }
    const std::vector<std::string>& columns() const { return _columns; }
    size_t rows() const { return _rows; }

    // One row, a cell per column in the header's order. Flushed at once: a run that dies
    // leaves the rows measured so far in FILE.tmp.PID for a post-mortem (the destructor of a
    // normally failing run removes it).
    void row(std::initializer_list<csv_cell> cells) { row(std::vector<csv_cell>(cells)); }
    void row(const std::vector<csv_cell>& cells) {
        if (!_file) throw std::logic_error("CSV " + _path + ": row after commit");
        // A wrong cell count is the benchmark's bug; caught here, the file would be unreadable.
        if (cells.size() != _columns.size())
            throw std::logic_error("CSV " + _path + ": row of " + std::to_string(cells.size()) + " cells for " +
                                   std::to_string(_columns.size()) + " columns");
        std::string line;
        for (size_t i = 0; i < cells.size(); ++i) {
            if (i) line += ',';
            line += cells[i].text();
        }
        write_line(line);
        ++_rows;
    }

    // Completes the file: flush, fsync (so that a crash right after cannot leave an empty
    // FILE where the rename already happened), close, rename over FILE.
    void commit() {
        if (!_file) throw std::logic_error("CSV " + _path + ": committed twice");
        FILE* f = _file;
        _file = nullptr;
        int e = 0;
        if (std::fflush(f) != 0 || ::fsync(::fileno(f)) != 0) e = errno;
        if (std::fclose(f) != 0 && !e) e = errno;
        if (!e && ::rename(_tmp.c_str(), _path.c_str()) != 0) e = errno;
        if (e) {
            ::unlink(_tmp.c_str());
            fail("cannot write", e);
        }
    }

private:
    void write_line(const std::string& line) {
        // Errors are sticky in the FILE; checked per line so that a full disk is reported
        // when it happens, not at commit.
        if (std::fputs(line.c_str(), _file) < 0 || std::fputc('\n', _file) < 0 || std::fflush(_file) != 0) {
            const int e = errno;
            std::fclose(_file);
            _file = nullptr;
            ::unlink(_tmp.c_str());
            fail("cannot write", e);
        }
    }

    [[noreturn]] void fail(const char* what, int e) const {
        throw std::runtime_error(std::string(what) + " CSV file " + _path + ": " + std::strerror(e));
    }

    std::string _path;
    std::string _tmp;
    std::vector<std::string> _columns;
    FILE* _file = nullptr;
    size_t _rows = 0;
};

}  // namespace reefline::bench
