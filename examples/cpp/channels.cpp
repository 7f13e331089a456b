// Typed channels from C++: a ChannelSender<Order> on rank 0 to each worker and a
// ChannelReceiver<Fill> back, templates over trivially copyable structs. Each worker answers
// every order with a fill; rank 0 checks them all. The ends close as they go out of scope.
//
//     target/release/shmbroker run -n 3 ./channels-cpp
#include <shmbroker.hpp>

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct Order {
    std::uint64_t id;
    std::uint32_t quantity;
    std::uint32_t price;
};

struct Fill {
    std::uint64_t id;
    std::uint64_t total;
};

constexpr std::uint64_t kOrders = 50000;
constexpr std::uint64_t kTag = 0x0de5;

void fail(const std::string &what) { throw std::runtime_error(what); }

}  // namespace

int main() try {
    auto session = shmbroker::Session::from_env(std::chrono::seconds(30));
    const std::uint32_t rank = session.rank(), world = session.world_size();
    if (world < 2) fail("run with 2 ranks or more");
    if (rank == 0) {
        std::vector<shmbroker::ChannelSender<Order>> orders;
        std::vector<shmbroker::ChannelReceiver<Fill>> fills;
        for (std::uint32_t w = 1; w < world; ++w) {
            orders.push_back(session.channel_to<Order>(w, kTag, 1024));
            fills.push_back(session.channel_from<Fill>(w, kTag));
        }
        std::vector<Order> batch(100);
        std::vector<std::uint64_t> owed(fills.size(), 0);
        std::uint64_t checked = 0;
        std::vector<Fill> got(64);
        // Takes the fills that have arrived from worker `w` (waiting for one when `wait`).
        auto take = [&](std::size_t w, bool wait) {
            const std::size_t n = wait ? fills[w].recv_batch(got.data(), got.size())
                                       : fills[w].try_recv_batch(got.data(), got.size());
            for (std::size_t k = 0; k < n; ++k) {
                const Fill &fill = got[k];
                const std::uint64_t quantity = fill.id % batch.size() + 1;
                const std::uint64_t price = (fill.id - fill.id % batch.size()) % 97;
                if (fill.total != quantity * price) {
                    fail("a wrong fill for order " + std::to_string(fill.id));
                }
            }
            owed[w] -= n;
            checked += n;
        };
        for (std::uint64_t id = 0; id < kOrders; id += batch.size()) {
            for (std::size_t k = 0; k < batch.size(); ++k) {
                batch[k] = Order{id + k, std::uint32_t(k + 1), std::uint32_t(id % 97)};
            }
            const std::size_t w = (id / batch.size()) % orders.size();
            // A worker whose fills are not taken stops taking orders: take them while its
            // orders do not all fit.
            for (std::size_t sent = 0; sent < batch.size();) {
                const std::size_t went =
                    orders[w].try_send_batch(batch.data() + sent, batch.size() - sent);
                owed[w] += went;
                sent += went;
                if (sent < batch.size()) take(w, false);
            }
        }
        for (std::size_t w = 0; w < fills.size(); ++w) {
            while (owed[w] > 0) take(w, true);
        }
        if (fills[0].try_recv()) fail("a fill nobody asked for");
        // A payload by reference: a loan filled here, its reference in a record, read in place.
        auto refs = session.channel_to<shmbroker_loan_ref>(1, kTag + 1, 16);
        auto loan = session.loan(4096);
        for (std::size_t i = 0; i < loan.size(); ++i) {
            static_cast<unsigned char *>(loan.data())[i] = static_cast<unsigned char>(i * 3);
        }
        refs.send(session.lend_ref(1, std::move(loan)));
        // The workers keep their ends open until here: then every end closes, none early.
        session.barrier();
        std::printf("rank 0: %llu orders to %u workers, every fill checked\n",
                    static_cast<unsigned long long>(checked), world - 1);
    } else {
        auto orders = session.channel_from<Order>(0, kTag);
        auto fills = session.channel_to<Fill>(0, kTag, 1024);
        const std::uint64_t batches = kOrders / 100;
        const std::uint64_t mine =
            (batches / (world - 1) + (rank - 1 < batches % (world - 1) ? 1 : 0)) * 100;
        for (std::uint64_t n = 0; n < mine; ++n) {
            const Order order = orders.recv();
            fills.send(Fill{order.id, std::uint64_t(order.quantity) * order.price});
        }
        if (rank == 1) {
            auto refs = session.channel_from<shmbroker_loan_ref>(0, kTag + 1);
            auto view = session.view_loan_ref(0, refs.recv());
            if (view.size() != 4096) fail("a lent payload of the wrong size");
            for (std::size_t i = 0; i < view.size(); ++i) {
                if (static_cast<const unsigned char *>(view.data())[i] != static_cast<unsigned char>(i * 3)) {
                    fail("a lent payload came garbled");
                }
            }
        }
        session.barrier();
    }
    return 0;
} catch (const shmbroker::Error &error) {
    std::fprintf(stderr, "channels: %s (code %d)\n", error.what(), error.code());
    return 1;
} catch (const std::exception &error) {
    std::fprintf(stderr, "channels: %s\n", error.what());
    return 1;
}
