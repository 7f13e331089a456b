// The KittensBroker pattern in C++, done with shmbroker: each rank all-gathers a 64-byte GPU IPC
// handle, exchanges the fds behind it, checks every peer's memory, and meets the others at
// barriers. A host memfd stands in for device memory, so it runs on any machine; with CUDA the
// handle is what cuIpcGetMemHandle wrote, and the fd a dma-buf or a VMM shareable handle.
//
//     cargo build --release -p shmbroker-capi
//     c++ -std=c++17 examples/cpp/example.cpp -Icapi/include -Ltarget/release -lshmbroker
//         -Wl,-rpath,"$PWD/target/release" -o example      (one line)
//     target/release/shmbroker run -n 4 ./example
//
// or with CMake: cmake -S examples/cpp -B build && cmake --build build (see CMakeLists.txt).
#include <shmbroker.h>

#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

// A failed call, with shmbroker's message (which names the rank involved).
struct Error : std::runtime_error {
    int code;
    Error(const char *what, int code)
        : std::runtime_error(std::string(what) + ": " + shmbroker_last_error()), code(code) {}
};

void check(int rc, const char *what) {
    if (rc != SHMBROKER_OK) throw Error(what, rc);
}

// An fd closed when it goes out of scope.
class Fd {
   public:
    explicit Fd(int fd) : fd_(fd) {}
    Fd(Fd &&other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
    Fd(const Fd &) = delete;
    Fd &operator=(const Fd &) = delete;
    Fd &operator=(Fd &&) = delete;
    ~Fd() {
        if (fd_ >= 0) close(fd_);
    }
    int get() const { return fd_; }

   private:
    int fd_;
};

// A session, left when it goes out of scope.
class Session {
   public:
    explicit Session(std::uint64_t timeout_ms) { check(shmbroker_from_env(timeout_ms, &s_), "from_env"); }
    Session(const Session &) = delete;
    Session &operator=(const Session &) = delete;
    ~Session() { shmbroker_close(s_); }

    std::uint32_t rank() const { return shmbroker_rank(s_); }
    std::uint32_t world_size() const { return shmbroker_world_size(s_); }
    void barrier() { check(shmbroker_barrier(s_), "barrier"); }

    template <typename T>
    std::vector<T> all_gather(const T &mine) {
        std::vector<T> all(world_size());
        check(shmbroker_all_gather(s_, &mine, sizeof mine, all.data()), "all_gather");
        return all;
    }

    std::vector<Fd> exchange_fds(int fd) {
        std::vector<int> raw(world_size(), -1);
        check(shmbroker_exchange_fds(s_, fd, raw.data()), "exchange_fds");
        std::vector<Fd> fds;
        for (int r : raw) fds.emplace_back(r);
        return fds;
    }

   private:
    shmbroker_session *s_ = nullptr;
};

struct Handle {
    std::uint32_t rank;
    std::uint32_t magic;
    std::uint64_t bytes;
    std::array<unsigned char, 48> opaque;
};
static_assert(sizeof(Handle) == 64, "a CUDA IPC handle is 64 bytes");

constexpr std::uint64_t kBytes = 1 << 20;
constexpr std::uint32_t kMagic = 0x5348424b;

}  // namespace

int main() try {
    Session session(30000);
    const std::uint32_t rank = session.rank();

    Fd memory(memfd_create("example-buffer", MFD_CLOEXEC));
    if (memory.get() < 0 || ftruncate(memory.get(), kBytes) != 0) throw std::runtime_error("memfd");
    void *mine = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, memory.get(), 0);
    if (mine == MAP_FAILED) throw std::runtime_error("mmap");
    std::memset(mine, static_cast<int>(rank + 1), kBytes);

    Handle own{rank, kMagic, kBytes, {}};
    own.opaque.fill(static_cast<unsigned char>(rank));
    const auto handles = session.all_gather(own);
    session.barrier();

    const auto fds = session.exchange_fds(memory.get());
    for (std::uint32_t peer = 0; peer < handles.size(); ++peer) {
        const Handle &h = handles[peer];
        if (h.rank != peer || h.magic != kMagic) throw std::runtime_error("a handle is wrong");
        auto *theirs = static_cast<unsigned char *>(
            mmap(nullptr, h.bytes, PROT_READ, MAP_SHARED, fds[peer].get(), 0));
        if (theirs == MAP_FAILED) throw std::runtime_error("mmap of a peer's buffer");
        const bool right = theirs[0] == peer + 1 && theirs[h.bytes - 1] == peer + 1;
        munmap(theirs, h.bytes);
        if (!right) throw std::runtime_error("rank " + std::to_string(peer) + "'s memory is wrong");
    }
    session.barrier();
    munmap(mine, kBytes);
    std::printf("rank %u of %u: %zu handles and buffers checked\n", rank, session.world_size(),
                handles.size());
    session.barrier();
    return 0;
} catch (const std::exception &error) {
    std::fprintf(stderr, "example: %s\n", error.what());
    return 1;
}
