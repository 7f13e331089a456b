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
// or with CMake, against an installed shmbroker (see CMakeLists.txt). shmbroker.hpp gives the
// RAII session and fds, and throws shmbroker::Error (code, rank, message) on a failure.
#include <shmbroker.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using shmbroker::Fd;

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
    // The library's warnings (an fd transport that fell back to the broker's relay, say), as
    // this program's own lines.
    shmbroker::set_log(SHMBROKER_LOG_WARN, [](int, const char *, const char *message) {
        std::fprintf(stderr, "example: shmbroker says: %s\n", message);
    });
    auto session = shmbroker::Session::from_env(std::chrono::seconds(30));
    const std::uint32_t rank = session.rank();
    session.set_timeout(std::chrono::seconds(60));  // every later call's deadline

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
    // pidfd_getfd, or the broker's relay where the kernel refuses it (a container, say).
    const auto transport = session.fd_transport();
    if (transport.used != SHMBROKER_FD_TRANSPORT_PIDFD && transport.used != SHMBROKER_FD_TRANSPORT_RELAY)
        throw std::runtime_error("fds moved, but by no transport");
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
    // The last rank's memory once more, with a second file, in one batch broadcast.
    const std::uint32_t last = static_cast<std::uint32_t>(handles.size()) - 1;
    Fd second(memfd_create("example-second", MFD_CLOEXEC));
    const std::vector<int> offered =
        rank == last ? std::vector<int>{memory.get(), second.get()} : std::vector<int>{};
    const auto batch = session.broadcast_fd_batch(last, offered, 2);
    unsigned char byte = 0;
    if (batch.size() != 2 || pread(batch[0].get(), &byte, 1, 0) != 1 || byte != last + 1)
        throw std::runtime_error("the batch broadcast gave the wrong files");
    // Rank 0 collects every rank's handle once more, as a scheduler keeping a registry would.
    const auto registry = session.gather(0, own);
    if (rank == 0) {
        for (std::uint32_t peer = 0; peer < registry.size(); ++peer) {
            if (registry[peer].rank != peer) throw std::runtime_error("gather out of order");
        }
    }
    // Tensor-parallel style: sum every rank's activations (the same bits on every rank), then
    // each rank keeps its block of a reduce-scatter and trades blocks with an all-to-all.
    const std::uint32_t world = session.world_size();
    std::vector<float> activations(100000);
    for (std::size_t i = 0; i < activations.size(); ++i) activations[i] = float(i % 7 + rank);
    session.all_reduce(activations, shmbroker::Op::sum);
    for (std::size_t i = 0; i < activations.size(); ++i) {
        const float want = float(world * (i % 7) + world * (world - 1) / 2);
        if (activations[i] != want) throw std::runtime_error("all_reduce: wrong sum");
    }
    // The same on a symmetric buffer, which lives in this rank's outbox: the peers read it in
    // place, with no copy in.
    auto symmetric = session.symmetric<float>(1 << 18);
    for (std::size_t i = 0; i < symmetric.size(); ++i) symmetric[i] = float(i % 7 + rank);
    session.all_reduce(symmetric, shmbroker::Op::sum);
    for (std::size_t i = 0; i < symmetric.size(); ++i) {
        const float want = float(world * (i % 7) + world * (world - 1) / 2);
        if (symmetric[i] != want) throw std::runtime_error("symmetric all_reduce: wrong sum");
    }
    if (world > 1 && session.reductions_read_in_place() == 0)
        throw std::runtime_error("the symmetric buffer was copied, not read in place");
    std::vector<std::int32_t> blocks(world * 3, std::int32_t(rank + 1));
    const auto block = session.reduce_scatter(blocks, shmbroker::Op::max);
    if (block.size() != 3 || block[0] != std::int32_t(world)) throw std::runtime_error("reduce_scatter");
    std::vector<std::uint32_t> outgoing(world);
    for (std::uint32_t to = 0; to < world; ++to) outgoing[to] = rank * 100 + to;
    const auto incoming = session.all_to_all(outgoing);
    for (std::uint32_t from = 0; from < world; ++from) {
        if (incoming[from] != from * 100 + rank) throw std::runtime_error("all_to_all");
    }
    // Rank r sends r + q + 1 bytes to rank q.
    std::vector<std::size_t> sends(world), receives(world);
    std::vector<unsigned char> out, in;
    for (std::uint32_t q = 0; q < world; ++q) {
        sends[q] = rank + q + 1;
        receives[q] = q + rank + 1;
        out.insert(out.end(), sends[q], static_cast<unsigned char>(rank * 16 + q));
    }
    std::size_t received = 0;
    for (auto count : receives) received += count;
    in.resize(received);
    session.all_to_all_v(out.data(), sends, in.data(), receives);
    for (std::size_t at = 0, q = 0; q < world; at += receives[q], ++q) {
        if (in[at] != q * 16 + rank || in[at + receives[q] - 1] != q * 16 + rank)
            throw std::runtime_error("all_to_all_v");
    }
    // Tensor- and pipeline-parallel groups: pairs of neighbouring ranks, and the world numbered
    // backwards; each sums among its own members, numbered from 0.
    std::vector<std::uint32_t> pair{rank & ~1u};
    if ((rank | 1u) < world) pair.push_back(rank | 1u);
    std::vector<std::uint32_t> backwards;
    for (std::uint32_t q = world; q-- > 0;) backwards.push_back(q);
    const shmbroker::Group tp = session.group(pair);
    const shmbroker::Group pp = session.group(backwards);
    std::vector<std::int64_t> mine_and_one{std::int64_t(rank), 1};
    session.on(tp).all_reduce(mine_and_one, shmbroker::Op::sum);
    std::int64_t pair_sum = 0;
    for (auto q : pair) pair_sum += q;
    if (mine_and_one[0] != pair_sum || mine_and_one[1] != std::int64_t(pair.size()) ||
        tp.world_rank(tp.rank()) != rank)
        throw std::runtime_error("all_reduce on a pair");
    std::uint32_t from_last = rank;
    session.on(pp).broadcast(0, from_last);
    if (from_last != world - 1 || pp.rank() != world - 1 - rank)
        throw std::runtime_error("broadcast on the world numbered backwards");
    // The same memory as a typed GPU handle (host memory in a memfd stands in for a device
    // allocation): every rank's handle and fd, then rank 0's alone.
    shmbroker_gpu_handle gpu{};
    gpu.kind = SHMBROKER_GPU_HOST_MEMFD;
    gpu.size = kBytes;
    gpu.buffer_id = rank;
    const auto gpus = session.all_gather_gpu_handles(gpu, memory.get());
    for (std::uint32_t peer = 0; peer < gpus.size(); ++peer) {
        if (gpus[peer].first.buffer_id != peer || gpus[peer].second.get() < 0)
            throw std::runtime_error("all_gather_gpu_handles");
    }
    const auto first = session.broadcast_gpu_handle(0, rank == 0 ? &gpu : nullptr,
                                                    rank == 0 ? memory.get() : -1);
    if (first.first.buffer_id != 0 || first.second.get() < 0)
        throw std::runtime_error("broadcast_gpu_handle");
    // Loans: 1 MiB handed around a ring by reference, then broadcast from the last rank; each
    // view is read in place and given back when it goes out of scope.
    constexpr std::size_t kLoan = 1 << 20;
    if (world > 1) {
        const std::uint32_t next = (rank + 1) % world, prev = (rank + world - 1) % world;
        shmbroker::Loan loan = session.loan(kLoan);
        std::memset(loan.data(), static_cast<int>(rank + 7), kLoan);
        session.send_loan(next, std::move(loan));
        const shmbroker::LoanView view = session.recv_loan(prev);
        if (view.size() != kLoan || view.data()[0] != prev + 7 || view.data()[kLoan - 1] != prev + 7)
            throw std::runtime_error("recv_loan");
    }
    shmbroker::Loan news;
    if (rank == world - 1) {
        news = session.loan(5);
        std::memcpy(news.data(), "news!", 5);
    }
    const shmbroker::LoanView seen = session.broadcast_loan(world - 1, std::move(news));
    if (rank != world - 1 && (seen.size() != 5 || std::memcmp(seen.data(), "news!", 5) != 0))
        throw std::runtime_error("broadcast_loan");
    // Who is where, as `shmbroker status --json` prints it (rank 0, when the job came from
    // `shmbroker run`): one line per rank, each running.
    if (const char *socket = std::getenv("SHMBROKER_SOCKET"); rank == 0 && socket != nullptr) {
        const std::string status = shmbroker::status(socket);
        std::uint32_t running = 0;
        for (auto at = status.find("\"state\":\"running\""); at != std::string::npos;
             at = status.find("\"state\":\"running\"", at + 1))
            ++running;
        if (running != world) throw std::runtime_error("shmbroker::status: " + status);
    }
    session.barrier();
    munmap(mine, kBytes);
    std::printf("rank %u of %u: %zu handles and buffers checked\n", rank, session.world_size(),
                handles.size());
    session.barrier();
    // A rank that gives a collective up is named at once by the ranks still waiting for its
    // part, with SHMBROKER_E_PEER_GAVE_UP, not at their deadline: here rank 1's deadline is
    // 100 ms and rank 2 comes at 500 ms, so rank 1 leaves a two-shot all-reduce and the others
    // then wait for its result slice. The ranks are out of step after it, so it comes last, and
    // nobody leaves before rank 1 hears that every other rank saw it.
    if (world >= 3) {
        std::vector<float> large(1 << 20, 1.0f);
        if (rank == 1) session.set_timeout(std::chrono::milliseconds(100));
        if (rank == 2) std::this_thread::sleep_for(std::chrono::milliseconds(500));
        try {
            session.all_reduce(large, shmbroker::Op::sum);
            throw std::runtime_error("an all_reduce rank 1 gave up on succeeded");
        } catch (const shmbroker::Error &error) {
            // Rank 1 names rank 2, which it timed out waiting for; the others name rank 1.
            const int code = rank == 1 ? SHMBROKER_E_TIMEOUT : SHMBROKER_E_PEER_GAVE_UP;
            const std::uint32_t named = rank == 1 ? 2 : 1;
            if (error.code() != code || error.rank() != named) throw;
        }
        session.set_timeout(std::chrono::seconds(60));
        if (rank == 1) {
            for (std::uint32_t peer = 0; peer < world; ++peer)
                if (peer != 1) session.recv(peer);
        } else {
            session.send(1, "seen", 4);
        }
    }
    return 0;
} catch (const std::exception &error) {
    std::fprintf(stderr, "example: %s\n", error.what());
    return 1;
}
