// The MindIE pattern in C++: rank 0 is a scheduler. Its main thread broadcasts each request to
// every worker while a response thread takes the replies with recv_any as they come, on the same
// session. Rank 1 answers one request late; the other workers' replies to it are taken at once,
// not held behind the late one (the program fails if they are). Every reply is checked.
//
//     cargo build --release -p shmbroker-capi
//     c++ -std=c++17 -pthread examples/cpp/scheduler.cpp -Icapi/include -Ltarget/release
//         -lshmbroker -Wl,-rpath,"$PWD/target/release" -o scheduler      (one line)
//     target/release/shmbroker run -n 4 ./scheduler
//
// or with CMake, against an installed shmbroker (see CMakeLists.txt).
#include <shmbroker.hpp>

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::uint32_t kRequests = 200;
constexpr std::uint32_t kLateRequest = 5;
constexpr auto kLate = std::chrono::milliseconds(200);
// Requests out at once, as a scheduler's batch would be.
constexpr std::uint32_t kWindow = 2;

struct Request {
    std::uint32_t id;
    std::array<unsigned char, 60> prompt;
};

// A worker's reply to request `id`: its rank, the id, then `id % 97` bytes of text.
std::vector<unsigned char> reply_to(std::uint32_t rank, std::uint32_t id) {
    std::vector<unsigned char> reply(8 + id % 97);
    for (std::size_t at = 0; at < reply.size(); ++at) {
        reply[at] = static_cast<unsigned char>(rank * 7 + id * 3 + at);
    }
    return reply;
}

void fail(const std::string &what) { throw std::runtime_error(what); }

void scheduler(shmbroker::Session &session) {
    const std::uint32_t workers = session.world_size() - 1;
    std::mutex lock;
    std::condition_variable progress;
    std::uint32_t answered = 0;  // requests every worker has answered
    Clock::time_point late_reply, others_done;
    std::exception_ptr failed;

    std::thread responses([&] {
      try {
        std::vector<std::uint32_t> next(workers + 1, 0), count(kRequests, 0);
        std::uint32_t others_of_late = 0;
        std::vector<unsigned char> message;
        for (std::uint32_t n = 0; n < kRequests * workers; ++n) {
            const std::uint32_t from = session.recv_any(message);
            const std::uint32_t id = next.at(from)++;
            if (message != reply_to(from, id)) {
                fail("rank " + std::to_string(from) + "'s reply to request " + std::to_string(id) +
                     " is wrong");
            }
            if (id == kLateRequest) {
                if (from == 1) {
                    late_reply = Clock::now();
                } else if (++others_of_late == workers - 1) {
                    others_done = Clock::now();
                }
            }
            if (++count[id] == workers) {
                std::lock_guard<std::mutex> guard(lock);
                while (answered < kRequests && count[answered] == workers) ++answered;
                progress.notify_one();
            }
        }
      } catch (...) {
        // Handed to the main thread, which stops sending requests.
        std::lock_guard<std::mutex> guard(lock);
        failed = std::current_exception();
        answered = kRequests;
        progress.notify_one();
      }
    });
    for (std::uint32_t id = 0; id < kRequests; ++id) {
        {
            std::unique_lock<std::mutex> guard(lock);
            progress.wait(guard, [&] { return id < answered + kWindow; });
            if (failed) break;
        }
        Request request{id, {}};
        request.prompt.fill(static_cast<unsigned char>(id));
        session.broadcast(0, request);
    }
    responses.join();
    if (failed) std::rethrow_exception(failed);
    if (workers > 1) {
        const double ahead =
            std::chrono::duration<double, std::milli>(late_reply - others_done).count();
        std::printf("rank 0: the other replies to request %u were in %.1f ms before the late one\n",
                    kLateRequest, ahead);
        if (ahead <= 0) fail("the late worker held up the other workers' replies");
    }
    // Everything is answered: nothing more is waiting.
    std::array<unsigned char, 8> spare{};
    for (std::uint32_t rank = 1; rank <= workers; ++rank) {
        if (session.try_recv(rank, spare.data(), spare.size())) fail("a reply nobody asked for");
    }
    session.barrier();
    std::printf("rank 0: %u requests to %u workers, every reply checked\n", kRequests, workers);
}

void worker(shmbroker::Session &session) {
    const std::uint32_t rank = session.rank();
    for (std::uint32_t id = 0; id < kRequests; ++id) {
        Request request{};
        session.broadcast(0, request);
        if (request.id != id) fail("request " + std::to_string(request.id) + " came out of order");
        if (rank == 1 && id == kLateRequest) std::this_thread::sleep_for(kLate);
        session.send(0, reply_to(rank, id));
    }
    // A deadline for this call alone (the others keep the session's).
    session.barrier(std::chrono::seconds(30));
}

}  // namespace

int main() try {
    auto session = shmbroker::Session::from_env(std::chrono::seconds(30));
    if (session.world_size() < 2) fail("run with 2 ranks or more");
    if (session.rank() == 0) {
        scheduler(session);
    } else {
        worker(session);
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
