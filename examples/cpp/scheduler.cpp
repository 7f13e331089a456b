// The MindIE pattern in C++: rank 0 is a scheduler. Its main thread broadcasts batches of
// requests (1 MiB each) to every worker, while a response thread takes the replies with
// recv_any as they come. Rank 1 is always slow: it spends 20 ms on every batch. The session is
// split into its two halves, one per thread: a receive never waits behind the broadcast, which
// waits for the slow worker's room. The program prints how long the fast workers' replies
// waited between their send and the response thread taking them, and fails if they waited as
// long as the slow worker's delay (they would be held behind it). Every reply is checked.
//
//     cargo build --release -p shmbroker-capi
//     c++ -std=c++17 -pthread examples/cpp/scheduler.cpp -Icapi/include -Ltarget/release
//         -lshmbroker -Wl,-rpath,"$PWD/target/release" -o scheduler      (one line)
//     target/release/shmbroker run -n 4 ./scheduler
//
// or with CMake, against an installed shmbroker (see CMakeLists.txt).
#include <shmbroker.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::uint32_t kBatches = 100;
constexpr std::size_t kBatchBytes = 1 << 20;
constexpr auto kSlow = std::chrono::milliseconds(20);

// steady_clock is CLOCK_MONOTONIC: one clock for every process on the machine.
std::int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
        .count();
}

// Batch `id`: its number, then bytes that depend on it.
std::vector<unsigned char> batch(std::uint32_t id) {
    std::vector<unsigned char> bytes(kBatchBytes);
    for (std::size_t at = 0; at < bytes.size(); ++at) {
        bytes[at] = static_cast<unsigned char>(id * 13 + at / 4096);
    }
    std::memcpy(bytes.data(), &id, sizeof id);
    return bytes;
}

// A worker's reply to batch `id`: the id, a checksum of the batch, and when it was sent.
struct Reply {
    std::uint32_t id;
    std::uint32_t sum;
    std::int64_t sent_ns;
};

std::uint32_t checksum(const std::vector<unsigned char> &bytes) {
    std::uint32_t sum = 0;
    for (std::size_t at = 0; at < bytes.size(); at += 997) sum = sum * 31 + bytes[at];
    return sum;
}

void fail(const std::string &what) { throw std::runtime_error(what); }

double percentile(std::vector<double> waits, double q) {
    std::sort(waits.begin(), waits.end());
    return waits[static_cast<std::size_t>(q * static_cast<double>(waits.size() - 1))];
}

void scheduler(shmbroker::Session session) {
    const std::uint32_t workers = session.world_size() - 1;
    std::vector<std::uint32_t> sums(kBatches);
    for (std::uint32_t id = 0; id < kBatches; ++id) sums[id] = checksum(batch(id));
    auto [sender, receiver] = std::move(session).split();
    std::vector<double> fast_waits_us;
    std::exception_ptr failed;
    std::thread responses([&, &receiver = receiver] {
        try {
            std::vector<std::uint32_t> next(workers + 1, 0);
            std::vector<unsigned char> message;
            for (std::uint32_t n = 0; n < kBatches * workers; ++n) {
                const std::uint32_t from = receiver.recv_any(message);
                const std::int64_t taken = now_ns();
                Reply reply{};
                if (message.size() != sizeof reply) fail("a reply of the wrong size");
                std::memcpy(&reply, message.data(), sizeof reply);
                const std::uint32_t id = next.at(from)++;
                if (reply.id != id || reply.sum != sums.at(id)) {
                    fail("rank " + std::to_string(from) + "'s reply to batch " +
                         std::to_string(id) + " is wrong");
                }
                if (from != 1) fast_waits_us.push_back(static_cast<double>(taken - reply.sent_ns) / 1e3);
            }
        } catch (...) {
            failed = std::current_exception();
        }
    });
    // Batches go out as fast as the slowest worker takes them: each broadcast waits for its room.
    for (std::uint32_t id = 0; id < kBatches; ++id) {
        std::vector<unsigned char> bytes = batch(id);
        sender.broadcast(0, bytes);
    }
    responses.join();
    if (failed) std::rethrow_exception(failed);
    auto whole = shmbroker::Session::rejoin(std::move(sender), std::move(receiver));
    // Everything is answered: nothing more is waiting.
    std::vector<unsigned char> spare(64);
    for (std::uint32_t rank = 1; rank <= workers; ++rank) {
        if (whole.try_recv(rank, spare.data(), spare.size())) fail("a reply nobody asked for");
    }
    whole.barrier();
    std::printf("rank 0: %u batches of %zu bytes to %u workers (rank 1 always %lld ms slow), "
                "every reply checked\n",
                kBatches, kBatchBytes, workers, static_cast<long long>(kSlow.count()));
    if (workers > 1) {
        const double p50 = percentile(fast_waits_us, 0.5);
        std::printf("rank 0: fast replies waited p50 %.0f us, p90 %.0f us, p99 %.0f us, max %.0f us\n",
                    p50, percentile(fast_waits_us, 0.9), percentile(fast_waits_us, 0.99),
                    percentile(fast_waits_us, 1.0));
        if (p50 >= std::chrono::duration<double, std::micro>(kSlow).count()) {
            fail("the fast workers' replies waited behind the slow worker");
        }
    }
}

void worker(shmbroker::Session session) {
    const std::uint32_t rank = session.rank();
    std::vector<unsigned char> bytes(kBatchBytes);
    for (std::uint32_t id = 0; id < kBatches; ++id) {
        session.broadcast(0, bytes);
        Reply reply{id, checksum(bytes), 0};
        std::uint32_t got = 0;
        std::memcpy(&got, bytes.data(), sizeof got);
        if (got != id) fail("batch " + std::to_string(got) + " came out of order");
        if (rank == 1) std::this_thread::sleep_for(kSlow);
        reply.sent_ns = now_ns();
        session.send(0, &reply, sizeof reply);
    }
    // A deadline for this call alone (the others keep the session's).
    session.barrier(std::chrono::seconds(30));
}

}  // namespace

int main() try {
    auto session = shmbroker::Session::from_env(std::chrono::seconds(30));
    if (session.world_size() < 2) fail("run with 2 ranks or more");
    if (session.rank() == 0) {
        scheduler(std::move(session));
    } else {
        worker(std::move(session));
    }
    return 0;
} catch (const shmbroker::Error &error) {
    std::fprintf(stderr, "scheduler: %s (code %d, rank %lld)\n", error.what(), error.code(),
                 error.rank() ? static_cast<long long>(*error.rank()) : -1LL);
    return 1;
} catch (const std::exception &error) {
    std::fprintf(stderr, "scheduler: %s\n", error.what());
    return 1;
}
