// Recovering a group while a rank dies, in C++ (examples/c/regroup.c is the same in C): rank 1
// sends rank 0 a message and dies (SIGKILL) 300 ms later, in its first process only; rank 2 at
// once recovers the whole world's group. `shmbroker run --restart 1` starts rank 1 again, and
// every rank, the replacement included, calls Session::regroup: it waits for the replacement,
// makes the group by agreement, and tries again through the death.
//
//     cargo build --release -p shmbroker-capi -p shmbroker-cli
//     c++ -std=c++17 examples/cpp/regroup.cpp -Icapi/include -Ltarget/release -lshmbroker
//         -Wl,-rpath,"$PWD/target/release" -o regroup      (one line)
//     target/release/shmbroker run -n 3 --restart 1 ./regroup
#include <shmbroker.hpp>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

int main() {
    using namespace std::chrono_literals;
    try {
        auto session = shmbroker::Session::from_env(30s);
        const std::uint32_t rank = session.rank();
        if (session.world_size() != 3) {
            std::fprintf(stderr, "run it with -n 3\n");
            return 1;
        }
        if (!session.rejoined()) {
            if (rank == 0) {
                for (std::uint32_t from = 1; from <= 2; from++) {
                    char text[32] = {0};
                    session.recv(from, text, sizeof text - 1);
                    if (std::string(text) != "hello from " + std::to_string(from)) {
                        std::fprintf(stderr, "rank %u sent \"%s\"\n", from, text);
                        return 1;
                    }
                }
            } else {
                const std::string text = "hello from " + std::to_string(rank);
                session.send(0, text.data(), text.size());
                if (rank == 1) {
                    std::this_thread::sleep_for(300ms);
                    std::raise(SIGKILL);
                }
            }
        }
        // A death after the group is made fails the barrier or the sum: recover again.
        for (int tries = 0;; tries++) {
            auto group = session.regroup({0, 1, 2}, 30s);
            std::vector<std::uint32_t> incarnations(3, 0);
            incarnations[group.rank()] = session.rejoins();
            try {
                session.on(group).barrier();
                session.on(group).all_reduce(incarnations, shmbroker::Op::sum);
            } catch (const shmbroker::Error &) {
                if (tries == 10) throw;
                continue;
            }
            if (incarnations != std::vector<std::uint32_t>{0, 1, 0}) {
                std::fprintf(stderr, "rank %u: incarnations %u %u %u\n", rank, incarnations[0],
                             incarnations[1], incarnations[2]);
                return 1;
            }
            std::printf("rank %u done: group [0, 1, 2], incarnations [0, 1, 0]\n", rank);
            return 0;
        }
    } catch (const shmbroker::Error &error) {
        std::fprintf(stderr, "%s\n", error.what());
        return 1;
    }
}
