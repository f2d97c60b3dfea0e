// Native NIXL reference for the nixl-rs comparison (docs/performance.md): NIXL 1.5.1's C++ API
// (the wheel's libnixl.so and UCX plugin), the same pattern as nixl-rs' nixlbench and
// benches/reference/nixl_ref.py, without Python in the loop.
//
// Two processes, DRAM -> DRAM over NIXL's UCX backend, progress thread off (the initiator polls
// getXferStatus; the target polls getNotifs). The initiator starts the target (this binary with
// --role target) and the two swap metadata over its stdin/stdout.
//
//   --mode sweep   per (block, batch): both lists prepared once (prepXferDlist; one page
//                  between blocks so none merge), one request by index (makeXferReq), posted
//                  repeatedly; one JSON line per point: GB/s, median and p99 post-to-done us.
//   --mode notif   4 KiB WRITE + notification, one in flight; the target busy-polls getNotifs,
//                  stamps each arrival (CLOCK_REALTIME, shared by both processes) and answers
//                  with genNotif; prints the median and p99 time from post to the target seeing
//                  the notification, and checks that the data arrived before it.
//
// Build: benches/reference/native/build.sh. Run with NIXL_PLUGIN_DIR set to the wheel's
// plugins directory (compare_native.py does).
#include "nixl_abi.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <poll.h>
#include <signal.h>
#include <stdexcept>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace {

constexpr uint64_t kPage = 4096;
constexpr const char *kInit = "nixl-native-initiator";
constexpr const char *kTarget = "nixl-native-target";
constexpr uint8_t kProbe = 0xa5;

struct Opts {
    std::string role = "initiator";
    std::string mode = "sweep";
    nixl_xfer_op_t op = NIXL_WRITE;
    std::vector<uint64_t> blocks{4096, 65536, 1 << 20, 16 << 20, 64 << 20};
    std::vector<uint64_t> batches{1, 32};
    uint64_t buffer = 0;
    double bytes_per_point = 2e9;
    uint64_t warmup = 10;
    uint64_t min_iters = 8;
    uint64_t max_iters = 20000;
    uint64_t notif_iters = 2000;
};

[[noreturn]] void
die(const std::string &what) {
    fprintf(stderr, "nixl_native: %s\n", what.c_str());
    fflush(stderr);
    _exit(1);
}

void
check(nixl_status_t st, const char *what) {
    if (st < 0) {
        die(std::string(what) + " failed with status " + std::to_string(int(st)));
    }
}

uint64_t
num(const std::string &s) {
    char *end = nullptr;
    errno = 0;
    const double v = strtod(s.c_str(), &end);
    if (errno != 0 || end == s.c_str() || *end != '\0' || v < 0) {
        die("not a number: " + s);
    }
    return uint64_t(v);
}

std::vector<uint64_t>
list(const std::string &s) {
    std::vector<uint64_t> out;
    size_t start = 0;
    while (start <= s.size()) {
        const size_t end = std::min(s.find(',', start), s.size());
        out.push_back(num(s.substr(start, end - start)));
        start = end + 1;
    }
    return out;
}

uint64_t
span(uint64_t block, uint64_t batch) {
    return batch * (block + kPage);
}

Opts
parse(int argc, char **argv) {
    Opts o;
    for (int i = 1; i < argc; ++i) {
        const std::string f = argv[i];
        if (i + 1 >= argc) {
            die(f + " needs a value");
        }
        const std::string v = argv[++i];
        if (f == "--role") {
            o.role = v;
        } else if (f == "--mode") {
            o.mode = v;
        } else if (f == "--op") {
            if (v == "READ") {
                o.op = NIXL_READ;
            } else if (v == "WRITE") {
                o.op = NIXL_WRITE;
            } else {
                die("--op READ or WRITE");
            }
        } else if (f == "--blocks") {
            o.blocks = list(v);
        } else if (f == "--batches") {
            o.batches = list(v);
        } else if (f == "--buffer") {
            o.buffer = num(v);
        } else if (f == "--bytes-per-point") {
            o.bytes_per_point = double(num(v));
        } else if (f == "--warmup") {
            o.warmup = num(v);
        } else if (f == "--min-iters") {
            o.min_iters = num(v);
        } else if (f == "--max-iters") {
            o.max_iters = num(v);
        } else if (f == "--iters") {
            o.notif_iters = num(v);
        } else {
            die("unknown flag " + f);
        }
    }
    if (o.mode != "sweep" && o.mode != "notif") {
        die("--mode sweep or notif");
    }
    for (uint64_t b : o.blocks) {
        for (uint64_t n : o.batches) {
            if (b == 0 || n == 0) {
                die("block and batch sizes must be positive");
            }
            if (o.mode == "sweep" && o.role == "initiator") {
                o.buffer = std::max(o.buffer, span(b, n));
            }
        }
    }
    o.buffer = std::max(o.buffer, kPage);
    return o;
}

int64_t
now_ns() {
    // CLOCK_REALTIME: one clock for both processes (and for nixl-rs' side, SystemTime).
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

std::string
hex(const std::string &s) {
    static const char *d = "0123456789abcdef";
    std::string out;
    out.reserve(s.size() * 2);
    for (unsigned char c : s) {
        out.push_back(d[c >> 4]);
        out.push_back(d[c & 15]);
    }
    return out;
}

std::string
unhex(const std::string &s) {
    auto v = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        die("bad hex");
    };
    if (s.size() % 2) {
        die("bad hex length");
    }
    std::string out(s.size() / 2, '\0');
    for (size_t i = 0; i < out.size(); ++i) {
        out[i] = char(v(s[2 * i]) << 4 | v(s[2 * i + 1]));
    }
    return out;
}

// Reads one line from `fd` (blocking), without the newline; empty on EOF.
std::string
read_line(int fd) {
    std::string line;
    char c;
    for (;;) {
        const ssize_t n = read(fd, &c, 1);
        if (n == 1) {
            if (c == '\n') return line;
            line.push_back(c);
        } else if (n == 0 || (n < 0 && errno != EINTR)) {
            return line;
        }
    }
}

void
write_all(int fd, const std::string &s) {
    size_t off = 0;
    while (off < s.size()) {
        const ssize_t n = write(fd, s.data() + off, s.size() - off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) die("write to peer pipe failed");
        off += size_t(n);
    }
}

// The next line from `fd` that starts with `key` (other lines, e.g. UCX's own reports on the
// target's stdout, are skipped); dies at EOF.
std::string
field(int fd, const char *key) {
    const std::string k = std::string(key) + " ";
    for (;;) {
        const std::string line = read_line(fd);
        if (line.empty()) {
            die("the peer closed its pipe before sending '" + std::string(key) + "'");
        }
        if (line.compare(0, k.size(), k) == 0) {
            return line.substr(k.size());
        }
    }
}

struct Side {
    nixlAgent *agent = nullptr;
    uint8_t *buf = nullptr;
    uint64_t len = 0;
    nixl_reg_dlist_t *reg = nullptr;
};

Side
make_side(const char *name, uint64_t len, uint8_t fill) {
    Side s;
    nixlAgentConfig cfg; // progress thread off, listener off, sync NONE
    s.agent = new nixlAgent(name, cfg);
    nixl_mem_list_t mems;
    nixl_b_params_t params;
    check(s.agent->getPluginParams("UCX", mems, params), "getPluginParams(UCX)");
    nixlBackendH *backend = nullptr;
    check(s.agent->createBackend("UCX", params, backend), "createBackend(UCX)");
    // Page-aligned and touched, as nixlbench's HostBuffer (alloc_zeroed + fill).
    s.len = (len + kPage - 1) / kPage * kPage;
    s.buf = static_cast<uint8_t *>(aligned_alloc(kPage, s.len));
    if (!s.buf) die("cannot allocate the buffer");
    memset(s.buf, fill, s.len);
    s.reg = new nixl_reg_dlist_t(DRAM_SEG, 0);
    s.reg->addDesc(nixlBlobDesc(uintptr_t(s.buf), size_t(s.len), 0, ""));
    check(s.agent->registerMem(*s.reg, nullptr), "registerMem");
    return s;
}

void
free_side(Side &s) {
    check(s.agent->deregisterMem(*s.reg, nullptr), "deregisterMem");
    delete s.reg;
    delete s.agent;
    free(s.buf);
}

// ---------------------------------------------------------------- target

int
target(const Opts &o) {
    Side s = make_side(kTarget, o.buffer, 1);
    memset(s.buf, kProbe, kPage); // the initiator READs this page once to check the path
    std::string md;
    check(s.agent->getLocalMD(md), "getLocalMD");
    write_all(1, "MD " + hex(md) + "\nADDR " + std::to_string(uintptr_t(s.buf)) + "\n");
    std::string peer;
    check(s.agent->loadRemoteMD(unhex(field(0, "MD")), peer), "loadRemoteMD");

    if (o.mode == "notif") {
        std::vector<int64_t> seen;
        seen.reserve(o.notif_iters);
        uint64_t bad = 0;
        const int64_t deadline = now_ns() + int64_t(120e9);
        nixl_notifs_t n;
        while (seen.size() < o.notif_iters && now_ns() < deadline) {
            n.clear();
            check(s.agent->getNotifs(n, nullptr), "getNotifs");
            const auto it = n.find(kInit);
            if (it == n.end()) continue;
            for (size_t k = 0; k < it->second.size(); ++k) {
                seen.push_back(now_ns());
                uint64_t tag;
                memcpy(&tag, s.buf, sizeof tag);
                bad += tag != seen.size();
                check(s.agent->genNotif(kInit, "ack", nullptr), "genNotif");
            }
        }
        std::string line = "SEEN " + std::to_string(bad);
        for (int64_t t : seen) line += " " + std::to_string(t);
        write_all(1, line + "\n");
    }
    // Serve (progress, 20 ms apart like nixlbench's target) until the initiator closes stdin.
    for (;;) {
        pollfd p{0, POLLIN, 0};
        if (poll(&p, 1, 20) > 0) break;
        nixl_notifs_t n;
        check(s.agent->getNotifs(n, nullptr), "getNotifs");
    }
    free_side(s);
    return 0;
}

// ---------------------------------------------------------------- initiator

struct Child {
    pid_t pid = -1;
    int to = -1;   // its stdin
    int from = -1; // its stdout
};

Child
spawn(const Opts &o) {
    int in[2], out[2];
    if (pipe(in) || pipe(out)) die("pipe failed");
    std::vector<std::string> args = {"/proc/self/exe", "--role", "target", "--mode", o.mode,
                                     "--buffer", std::to_string(o.buffer), "--iters",
                                     std::to_string(o.warmup + o.notif_iters)};
    const pid_t pid = fork();
    if (pid < 0) die("fork failed");
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        std::vector<char *> argv;
        for (auto &a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        execv("/proc/self/exe", argv.data());
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    return Child{pid, in[1], out[0]};
}

bool
reap(Child &c) {
    if (c.to >= 0) close(c.to);
    c.to = -1;
    for (int i = 0; i < 1000; ++i) {
        int st = 0;
        if (waitpid(c.pid, &st, WNOHANG) == c.pid) {
            return WIFEXITED(st) && WEXITSTATUS(st) == 0;
        }
        usleep(10000);
    }
    kill(c.pid, SIGKILL);
    waitpid(c.pid, nullptr, 0);
    return false;
}

struct Req {
    nixlDlistH *local = nullptr;
    nixlDlistH *remote = nullptr;
    nixlXferReqH *req = nullptr;
};

Req
make_req(nixlAgent *a,
         nixl_xfer_op_t op,
         uintptr_t laddr,
         uintptr_t raddr,
         uint64_t block,
         uint64_t batch,
         const nixl_opt_args_t *extra) {
    nixl_xfer_dlist_t l(DRAM_SEG, 0), r(DRAM_SEG, 0);
    for (uint64_t i = 0; i < batch; ++i) {
        const uint64_t off = i * (block + kPage);
        l.addDesc(nixlBasicDesc(laddr + off, size_t(block), 0));
        r.addDesc(nixlBasicDesc(raddr + off, size_t(block), 0));
    }
    Req q;
    check(a->prepXferDlist("", l, q.local, nullptr), "prepXferDlist(local)");
    check(a->prepXferDlist(kTarget, r, q.remote, nullptr), "prepXferDlist(remote)");
    std::vector<int> idx(batch);
    for (uint64_t i = 0; i < batch; ++i) idx[i] = int(i);
    check(a->makeXferReq(op, q.local, idx, q.remote, idx, q.req, extra), "makeXferReq");
    return q;
}

void
release(nixlAgent *a, Req &q) {
    check(a->releaseXferReq(q.req), "releaseXferReq");
    check(a->releasedDlistH(q.local), "releasedDlistH");
    check(a->releasedDlistH(q.remote), "releasedDlistH");
}

// Posts and polls to completion; returns post-to-done nanoseconds.
int64_t
run_once(nixlAgent *a, nixlXferReqH *req) {
    const auto t0 = std::chrono::steady_clock::now();
    nixl_status_t st = a->postXferReq(req, nullptr);
    while (st == NIXL_IN_PROG) {
        st = a->getXferStatus(req);
    }
    const auto t1 = std::chrono::steady_clock::now();
    check(st, "transfer");
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
}

double
pct(std::vector<double> v, double p) {
    std::sort(v.begin(), v.end());
    if (v.empty()) return 0;
    if (p == 0.5) return v[v.size() / 2];
    return v[std::min(v.size() - 1, size_t(double(v.size()) * p))];
}

void
sweep_point(nixlAgent *a, const Opts &o, uintptr_t laddr, uintptr_t raddr, uint64_t block,
            uint64_t batch) {
    Req q = make_req(a, o.op, laddr, raddr, block, batch, nullptr);
    const uint64_t bytes = block * batch;
    const uint64_t iters =
        std::clamp<uint64_t>(uint64_t(o.bytes_per_point / double(bytes)), o.min_iters, o.max_iters);
    const uint64_t warmup = std::min<uint64_t>(o.warmup, std::clamp<uint64_t>(uint64_t(2e8 / double(bytes)), 2, 10));
    std::vector<double> lat;
    lat.reserve(iters);
    double total = 0;
    for (uint64_t i = 0; i < warmup + iters; ++i) {
        const double s = double(run_once(a, q.req)) / 1e9;
        if (i >= warmup) {
            lat.push_back(s);
            total += s;
        }
    }
    release(a, q);
    printf("{\"impl\": \"nixl-1.5.1-native\", \"op\": \"%s\", \"block\": %lu, \"batch\": %lu, "
           "\"iters\": %lu, \"gbps\": %.6f, \"lat_med_us\": %.3f, \"lat_min_us\": %.3f, "
           "\"lat_p99_us\": %.3f}\n",
           o.op == NIXL_READ ? "READ" : "WRITE", (unsigned long)block, (unsigned long)batch,
           (unsigned long)iters, double(bytes * iters) / total / 1e9, pct(lat, 0.5) * 1e6,
           pct(lat, 0) * 1e6, pct(lat, 0.99) * 1e6);
    fflush(stdout);
}

void
notif_run(nixlAgent *a, const Opts &o, uint8_t *lbuf, uintptr_t raddr, Child &c) {
    nixl_opt_args_t extra;
    extra.notif = std::string("n");
    Req q = make_req(a, NIXL_WRITE, uintptr_t(lbuf), raddr, kPage, 1, &extra);
    const uint64_t total = o.warmup + o.notif_iters;
    std::vector<int64_t> posted;
    std::vector<double> xfer;
    posted.reserve(total);
    nixl_notifs_t n;
    for (uint64_t i = 0; i < total; ++i) {
        const uint64_t tag = i + 1;
        memcpy(lbuf, &tag, sizeof tag);
        posted.push_back(now_ns());
        xfer.push_back(double(run_once(a, q.req)) / 1e3);
        // Wait for the target's answer before the next post (one notification in flight).
        const int64_t deadline = now_ns() + int64_t(10e9);
        bool acked = false;
        while (!acked) {
            if (now_ns() > deadline) die("no answer from the target");
            n.clear();
            check(a->getNotifs(n, nullptr), "getNotifs");
            const auto it = n.find(kTarget);
            acked = it != n.end() && !it->second.empty();
        }
    }
    release(a, q);
    const std::string line = field(c.from, "SEEN");
    std::vector<int64_t> seen;
    size_t pos = 0;
    uint64_t bad = 0;
    bool first = true;
    while (pos < line.size()) {
        size_t end = line.find(' ', pos);
        if (end == std::string::npos) end = line.size();
        const int64_t v = std::stoll(line.substr(pos, end - pos));
        if (first) {
            bad = uint64_t(v);
            first = false;
        } else {
            seen.push_back(v);
        }
        pos = end + 1;
    }
    if (seen.size() != total) die("target saw " + std::to_string(seen.size()) + " notifications");
    if (bad != 0) die(std::to_string(bad) + " notifications arrived before their data");
    std::vector<double> lat;
    for (uint64_t i = o.warmup; i < total; ++i) lat.push_back(double(seen[i] - posted[i]) / 1e3);
    xfer.erase(xfer.begin(), xfer.begin() + long(o.warmup));
    printf("{\"impl\": \"nixl-1.5.1-native\", \"mode\": \"notif\", \"op\": \"WRITE\", \"block\": 4096, "
           "\"batch\": 1, \"iters\": %lu, \"notif_med_us\": %.3f, \"notif_p99_us\": %.3f, "
           "\"notif_min_us\": %.3f, \"lat_med_us\": %.3f, \"verified\": true}\n",
           (unsigned long)o.notif_iters, pct(lat, 0.5), pct(lat, 0.99),
           *std::min_element(lat.begin(), lat.end()), pct(xfer, 0.5));
    fflush(stdout);
}

int
initiator(const Opts &o) {
    Side s = make_side(kInit, o.buffer, 1);
    Child c = spawn(o);
    std::string peer;
    check(s.agent->loadRemoteMD(unhex(field(c.from, "MD")), peer), "loadRemoteMD");
    if (peer != kTarget) die("unexpected peer " + peer);
    const uintptr_t raddr = uintptr_t(num(field(c.from, "ADDR")));
    std::string md;
    check(s.agent->getLocalMD(md), "getLocalMD");
    write_all(c.to, "MD " + hex(md) + "\n");

    // One READ of the target's probe page: the path moves the right bytes.
    {
        Req q = make_req(s.agent, NIXL_READ, uintptr_t(s.buf), raddr, kPage, 1, nullptr);
        memset(s.buf, 0, kPage);
        run_once(s.agent, q.req);
        release(s.agent, q);
        for (uint64_t i = 0; i < kPage; ++i) {
            if (s.buf[i] != kProbe) die("the probe READ returned wrong bytes");
        }
        memset(s.buf, 1, kPage);
    }

    if (o.mode == "notif") {
        notif_run(s.agent, o, s.buf, raddr, c);
    } else {
        for (uint64_t b : o.blocks) {
            for (uint64_t n : o.batches) {
                if (span(b, n) <= o.buffer) sweep_point(s.agent, o, uintptr_t(s.buf), raddr, b, n);
            }
        }
    }
    const bool ok = reap(c);
    free_side(s);
    if (!ok) die("the target failed");
    return 0;
}

} // namespace

int
main(int argc, char **argv) {
    const Opts o = parse(argc, argv);
    int rc;
    try {
        rc = o.role == "target" ? target(o) : initiator(o);
    }
    catch (const std::exception &e) {
        die(std::string("exception: ") + e.what());
    }
    fflush(stdout);
    fflush(stderr);
    // _exit: the wheel's bundled libnl can crash in its exit handlers.
    _exit(rc);
}
