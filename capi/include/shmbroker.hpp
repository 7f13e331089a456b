// shmbroker from C++: a header-only layer over the C ABI (shmbroker.h). C++17; with C++20 the
// calls that take a buffer also take a std::span.
//
//   - shmbroker::Session owns a session: moved, never copied; its destructor leaves the job.
//   - Every failure throws shmbroker::Error, which carries the C code (code()), the rank it
//     names if any (rank()) and shmbroker's message (what()).
//   - Threads follow the C rules (see shmbroker.h): one Session may be used from several threads
//     at once; one receive at a time (a second throws Error with code() == SHMBROKER_E_BUSY);
//     interrupt() ends another thread's wait. The destructor, run while other threads are still
//     in calls, interrupts them and waits for them to return before it frees anything; no thread
//     may start a new call on a Session being destroyed (join them first).
//   - Timeouts are std::chrono durations.
//
// Link with -lshmbroker: `find_package(shmbroker CONFIG REQUIRED)` and
// `target_link_libraries(app shmbroker::shmbroker)` after `cmake --install` of capi/, or
// `pkg-config --cflags --libs shmbroker`.
#ifndef SHMBROKER_HPP
#define SHMBROKER_HPP

#include <shmbroker.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>
#if __cplusplus >= 202002L
#include <span>
#endif

namespace shmbroker {

// A failed call: the SHMBROKER_E_* code, the rank it names (if any) and the message.
class Error : public std::runtime_error {
   public:
    Error(int code, const std::string &message, std::int64_t rank)
        : std::runtime_error(message), code_(code), rank_(rank) {}

    int code() const noexcept { return code_; }
    // The peer that died, left, never came, sent bad bytes, disagreed or gave a collective up;
    // the first rank a timeout waited for. Empty when the failure names no rank.
    std::optional<std::uint32_t> rank() const noexcept {
        if (rank_ < 0) return std::nullopt;
        return static_cast<std::uint32_t>(rank_);
    }

   private:
    int code_;
    std::int64_t rank_;
};

namespace detail {
template <typename Self>
class ReceiveCalls;
template <typename Self>
class SendCalls;

inline void check(int rc) {
    if (rc != SHMBROKER_OK) throw Error(rc, shmbroker_last_error(), shmbroker_last_error_rank());
}

// Leaves without throwing: a call still running on another thread is interrupted and waited
// for (a destructor must not free what that thread uses).
inline void leave(shmbroker_session *s) noexcept {
    if (s == nullptr) return;
    while (shmbroker_close(s) == SHMBROKER_E_BUSY) {
        shmbroker_interrupt(s);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
}

inline std::uint64_t milliseconds(std::chrono::milliseconds timeout) {
    if (timeout == std::chrono::milliseconds::max()) return SHMBROKER_TIMEOUT_FOREVER;
    if (timeout.count() <= 0) throw Error(SHMBROKER_E_MISUSE, "a timeout is above 0 ms", -1);
    return static_cast<std::uint64_t>(timeout.count());
}
}  // namespace detail

// A timeout that means no deadline (SHMBROKER_TIMEOUT_FOREVER): calls wait as long as it takes;
// deaths, departures and interrupts still end a wait.
inline constexpr std::chrono::milliseconds forever = std::chrono::milliseconds::max();

// Where the library's log events go (see shmbroker_set_log): `log` gets each event at
// `max_level` (a SHMBROKER_LOG_* level) or more severe, as (level, target, message); no `log`
// writes them to stderr, SHMBROKER_LOG_OFF stops them. `log` is called on library threads,
// maybe several at once: make it thread-safe and quick, and call no shmbroker function in it;
// what it throws is dropped. Each function set stays allocated for the process's life (an event
// may still be reaching it on another thread when the next one is set).
using LogFunction = std::function<void(int level, const char *target, const char *message)>;

inline void set_log(int max_level, LogFunction log = nullptr) {
    if (!log) {
        detail::check(shmbroker_set_log(max_level, nullptr, nullptr));
        return;
    }
    auto *kept = new LogFunction(std::move(log));
    auto trampoline = [](void *user, int level, const char *target, const char *message) {
        try {
            (*static_cast<LogFunction *>(user))(level, target, message);
        } catch (...) {
            // An exception must not cross into the library.
        }
    };
    const int rc = shmbroker_set_log(max_level, trampoline, kept);
    if (rc != SHMBROKER_OK) {
        delete kept;
        detail::check(rc);
    }
}

// What every rank of the job served at `socket` is doing, asked of its broker (see
// shmbroker_status): one JSON object per rank, one per line, as `shmbroker status --json`
// prints it.
inline std::string status(const std::string &socket,
                          std::chrono::milliseconds timeout = std::chrono::seconds(2)) {
    const std::uint64_t ms = detail::milliseconds(timeout);
    std::string text(16384, '\0');
    for (;;) {
        std::size_t len = 0;
        const int rc = shmbroker_status(socket.c_str(), ms, text.data(), text.size(), &len);
        if (rc == SHMBROKER_E_TOO_SMALL) {
            text.resize(len + 1);
            continue;
        }
        detail::check(rc);
        text.resize(len);
        return text;
    }
}

// How a reduction combines contributions (SHMBROKER_OP_*).
enum class Op : int {
    sum = SHMBROKER_OP_SUM,
    prod = SHMBROKER_OP_PROD,
    min = SHMBROKER_OP_MIN,
    max = SHMBROKER_OP_MAX,
    bit_and = SHMBROKER_OP_BIT_AND,
    bit_or = SHMBROKER_OP_BIT_OR,
    bit_xor = SHMBROKER_OP_BIT_XOR,
    avg = SHMBROKER_OP_AVG,
};

// The SHMBROKER_DTYPE_* of an element type (half-precision types: call the void* forms with
// SHMBROKER_DTYPE_F16 or SHMBROKER_DTYPE_BF16).
template <typename T>
struct dtype_of;
template <> struct dtype_of<std::uint8_t> { static constexpr int value = SHMBROKER_DTYPE_U8; };
template <> struct dtype_of<std::int8_t> { static constexpr int value = SHMBROKER_DTYPE_I8; };
template <> struct dtype_of<std::uint16_t> { static constexpr int value = SHMBROKER_DTYPE_U16; };
template <> struct dtype_of<std::int16_t> { static constexpr int value = SHMBROKER_DTYPE_I16; };
template <> struct dtype_of<std::uint32_t> { static constexpr int value = SHMBROKER_DTYPE_U32; };
template <> struct dtype_of<std::int32_t> { static constexpr int value = SHMBROKER_DTYPE_I32; };
template <> struct dtype_of<std::uint64_t> { static constexpr int value = SHMBROKER_DTYPE_U64; };
template <> struct dtype_of<std::int64_t> { static constexpr int value = SHMBROKER_DTYPE_I64; };
template <> struct dtype_of<float> { static constexpr int value = SHMBROKER_DTYPE_F32; };
template <> struct dtype_of<double> { static constexpr int value = SHMBROKER_DTYPE_F64; };

// An fd, closed when it goes out of scope.
class Fd {
   public:
    Fd() = default;
    explicit Fd(int fd) noexcept : fd_(fd) {}
    Fd(Fd &&other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
    Fd &operator=(Fd &&other) noexcept {
        if (this != &other) {
            reset();
            fd_ = std::exchange(other.fd_, -1);
        }
        return *this;
    }
    Fd(const Fd &) = delete;
    Fd &operator=(const Fd &) = delete;
    ~Fd() { reset(); }

    int get() const noexcept { return fd_; }
    int release() noexcept { return std::exchange(fd_, -1); }
    void reset() noexcept {
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
    }

   private:
    int fd_ = -1;
};

// A block of this rank's outbox, lent out (Session::loan): write its bytes, then hand it over
// with Session::send_loan or Session::broadcast_loan. Given back unsent when it goes out of scope.
class Loan {
   public:
    Loan() = default;
    Loan(Loan &&other) noexcept
        : loan_(std::exchange(other.loan_, nullptr)),
          data_(std::exchange(other.data_, nullptr)),
          size_(std::exchange(other.size_, 0)) {}
    Loan &operator=(Loan &&other) noexcept {
        if (this != &other) {
            shmbroker_loan_free(loan_);
            loan_ = std::exchange(other.loan_, nullptr);
            data_ = std::exchange(other.data_, nullptr);
            size_ = std::exchange(other.size_, 0);
        }
        return *this;
    }
    Loan(const Loan &) = delete;
    Loan &operator=(const Loan &) = delete;
    ~Loan() { shmbroker_loan_free(loan_); }

    std::uint8_t *data() noexcept { return static_cast<std::uint8_t *>(data_); }
    std::size_t size() const noexcept { return size_; }
    // The C handle, given up (to shmbroker_send_loan, which consumes it).
    shmbroker_loan *release() noexcept {
        data_ = nullptr;
        size_ = 0;
        return std::exchange(loan_, nullptr);
    }

   private:
    friend class Session;
    Loan(shmbroker_loan *loan, void *data, std::size_t size) noexcept
        : loan_(loan), data_(data), size_(size) {}
    shmbroker_loan *loan_ = nullptr;
    void *data_ = nullptr;
    std::size_t size_ = 0;
};

// An array of `T` in this rank's outbox (Session::symmetric), zeroed: an all_reduce on it is
// read by the peers where it lies, with no copy in (a symmetric buffer). It holds its block of
// the outbox until it goes out of scope, or into_loan() hands it over.
template <typename T>
class Symmetric {
    static_assert(std::is_trivially_copyable_v<T>, "a symmetric buffer holds plain values");

   public:
    Symmetric() = default;
    T *data() noexcept { return reinterpret_cast<T *>(loan_.data()); }
    std::size_t size() const noexcept { return count_; }
    T &operator[](std::size_t i) noexcept { return data()[i]; }
    T *begin() noexcept { return data(); }
    T *end() noexcept { return data() + count_; }
    // The loan holding it, to send by reference.
    Loan into_loan() && noexcept {
        count_ = 0;
        return std::move(loan_);
    }

   private:
    friend class Session;
    Symmetric(Loan loan, std::size_t count) noexcept : loan_(std::move(loan)), count_(count) {}
    Loan loan_;
    std::size_t count_ = 0;
};

// A read-only view of a buffer a peer lent this rank (Session::recv_loan,
// Session::broadcast_loan): its bytes are the lender's memory, read in place, until it goes out
// of scope, which gives the buffer back (read it before the session closes: a lender may then
// reuse the buffer). Copy out what you must validate before trusting it.
class LoanView {
   public:
    LoanView() = default;
    LoanView(LoanView &&other) noexcept
        : view_(std::exchange(other.view_, nullptr)),
          data_(std::exchange(other.data_, nullptr)),
          size_(std::exchange(other.size_, 0)) {}
    LoanView &operator=(LoanView &&other) noexcept {
        if (this != &other) {
            shmbroker_loan_view_free(view_);
            view_ = std::exchange(other.view_, nullptr);
            data_ = std::exchange(other.data_, nullptr);
            size_ = std::exchange(other.size_, 0);
        }
        return *this;
    }
    LoanView(const LoanView &) = delete;
    LoanView &operator=(const LoanView &) = delete;
    ~LoanView() { shmbroker_loan_view_free(view_); }

    const std::uint8_t *data() const noexcept { return static_cast<const std::uint8_t *>(data_); }
    std::size_t size() const noexcept { return size_; }
    // Whether it views anything (the root of broadcast_loan gets an empty one).
    explicit operator bool() const noexcept { return view_ != nullptr; }

   private:
    friend class Session;
    template <typename>
    friend class detail::ReceiveCalls;
    LoanView(shmbroker_loan_view *view, const void *data, std::size_t size) noexcept
        : view_(view), data_(data), size_(size) {}
    shmbroker_loan_view *view_ = nullptr;
    const void *data_ = nullptr;
    std::size_t size_ = 0;
};

// Who sent a message, and how long it is.
struct Received {
    std::uint32_t rank;
    std::size_t size;
};

// The collectives, on the whole world (a Session) or among a group's members (a GroupView, from
// Session::on): the same calls, with ranks, roots and sizes the group's in a group.
class Collectives {
   public:
    // This rank's rank, and the number of ranks, among those the collectives run on.
    std::uint32_t rank() const noexcept {
        return g_ != nullptr ? shmbroker_group_rank(g_) : shmbroker_rank(s_);
    }
    std::uint32_t size() const noexcept {
        return g_ != nullptr ? shmbroker_group_size(g_) : shmbroker_world_size(s_);
    }

    void barrier() { detail::check(shmbroker_group_barrier(s_, g_)); }

    // Every rank's `len` bytes, in rank order, into `out` (len * size() bytes).
    void all_gather(const void *data, std::size_t len, void *out) {
        detail::check(shmbroker_group_all_gather(s_, g_, data, len, out));
    }

    // Every rank's value, in rank order.
    template <typename T>
    std::vector<T> all_gather(const T &mine) {
        static_assert(std::is_trivially_copyable_v<T>, "all_gather copies bytes");
        std::vector<T> all(size());
        all_gather(&mine, sizeof(T), all.data());
        return all;
    }

    // Every rank's `len` bytes, in rank order, into the root's `out` (len * size() bytes;
    // ignored elsewhere).
    void gather(std::uint32_t root, const void *data, std::size_t len, void *out) {
        detail::check(shmbroker_group_gather(s_, g_, root, data, len, out));
    }

    // Every rank's value, in rank order, on the root (empty elsewhere).
    template <typename T>
    std::vector<T> gather(std::uint32_t root, const T &mine) {
        static_assert(std::is_trivially_copyable_v<T>, "gather copies bytes");
        std::vector<T> all(rank() == root ? size() : 0);
        gather(root, &mine, sizeof(T), all.data());
        return all;
    }

    // Every rank's `count` elements of `dtype` at `data`, combined with `op` in rank order, into
    // every rank's `data` (in place); every rank gets the same bits.
    void all_reduce(void *data, std::size_t count, int dtype, Op op) {
        detail::check(shmbroker_group_all_reduce(s_, g_, data, count, dtype, static_cast<int>(op)));
    }
    template <typename T>
    void all_reduce(std::vector<T> &data, Op op) {
        all_reduce(data.data(), data.size(), dtype_of<T>::value, op);
    }
    // On a symmetric buffer (Session::symmetric): the peers read it in place.
    template <typename T>
    void all_reduce(Symmetric<T> &data, Op op) {
        all_reduce(data.data(), data.size(), dtype_of<T>::value, op);
    }

    // As all_reduce, the result into the root's `data` only.
    void reduce(std::uint32_t root, void *data, std::size_t count, int dtype, Op op) {
        detail::check(shmbroker_group_reduce(s_, g_, root, data, count, dtype, static_cast<int>(op)));
    }
    template <typename T>
    void reduce(std::uint32_t root, std::vector<T> &data, Op op) {
        reduce(root, data.data(), data.size(), dtype_of<T>::value, op);
    }

    // Every rank's `input` (size() blocks of `count` elements), combined with `op`; this
    // rank's block of the result into `output` (`count` elements).
    void reduce_scatter(const void *input, void *output, std::size_t count, int dtype, Op op) {
        detail::check(
            shmbroker_group_reduce_scatter(s_, g_, input, output, count, dtype, static_cast<int>(op)));
    }
    template <typename T>
    std::vector<T> reduce_scatter(const std::vector<T> &input, Op op) {
        std::vector<T> output(input.size() / size());
        reduce_scatter(input.data(), output.data(), output.size(), dtype_of<T>::value, op);
        return output;
    }

    // The root's `input` (size() blocks of `block` bytes; nullptr elsewhere), block r
    // into rank r's `output`.
    void scatter(std::uint32_t root, const void *input, void *output, std::size_t block) {
        detail::check(shmbroker_group_scatter(s_, g_, root, input, output, block));
    }

    // Block q of `input` to rank q, block q of `output` from rank q (size() blocks of
    // `block` bytes each).
    void all_to_all(const void *input, void *output, std::size_t block) {
        detail::check(shmbroker_group_all_to_all(s_, g_, input, output, block));
    }
    // `send_counts[q]` bytes of `input` to rank q, `recv_counts[q]` bytes from rank q into
    // `output`, in rank order (size() counts each).
    void all_to_all_v(const void *input, const std::vector<std::size_t> &send_counts, void *output,
                      const std::vector<std::size_t> &recv_counts) {
        if (send_counts.size() != size() || recv_counts.size() != size())
            throw Error(SHMBROKER_E_MISUSE, "all_to_all_v needs size() counts each way", -1);
        detail::check(shmbroker_group_all_to_all_v(s_, g_, input, send_counts.data(), output,
                                             recv_counts.data()));
    }
    template <typename T>
    std::vector<T> all_to_all(const std::vector<T> &input) {
        static_assert(std::is_trivially_copyable_v<T>, "all_to_all copies bytes");
        std::vector<T> output(input.size());
        all_to_all(input.data(), output.data(), input.size() / size() * sizeof(T));
        return output;
    }

    // `root`'s `len` bytes at `buf` into every rank's `buf`.
    void broadcast(std::uint32_t root, void *buf, std::size_t len) {
        detail::check(shmbroker_group_broadcast(s_, g_, root, buf, len));
    }

    template <typename T>
    void broadcast(std::uint32_t root, T &value) {
        static_assert(std::is_trivially_copyable_v<T>, "broadcast copies bytes");
        broadcast(root, &value, sizeof(T));
    }

    // `root`'s elements into every rank's `data`, which has as many on every rank (as `send`
    // takes a vector).
    template <typename T>
    void broadcast(std::uint32_t root, std::vector<T> &data) {
        static_assert(std::is_trivially_copyable_v<T>, "broadcast copies bytes");
        broadcast(root, data.data(), data.size() * sizeof(T));
    }

   protected:
    Collectives(shmbroker_session *s, const shmbroker_group *g) noexcept : s_(s), g_(g) {}

    shmbroker_session *s_ = nullptr;
    // nullptr: the whole world.
    const shmbroker_group *g_ = nullptr;
};

// A group of ranks (Session::group, Session::shrink): owns the C handle; free it before the
// session that made it.
class Group {
   public:
    explicit Group(shmbroker_group *g) noexcept : g_(g) {}
    Group(Group &&other) noexcept : g_(std::exchange(other.g_, nullptr)) {}
    Group &operator=(Group &&other) noexcept {
        if (this != &other) {
            shmbroker_group_free(g_);
            g_ = std::exchange(other.g_, nullptr);
        }
        return *this;
    }
    Group(const Group &) = delete;
    Group &operator=(const Group &) = delete;
    ~Group() { shmbroker_group_free(g_); }

    std::uint32_t rank() const noexcept { return shmbroker_group_rank(g_); }
    std::uint32_t size() const noexcept { return shmbroker_group_size(g_); }
    // The world rank of group rank `rank`, or -1.
    std::int64_t world_rank(std::uint32_t rank) const noexcept {
        return shmbroker_group_world_rank(g_, rank);
    }
    const shmbroker_group *get() const noexcept { return g_; }

   private:
    shmbroker_group *g_ = nullptr;
};

// A session seen through a group: session.on(tp).all_reduce(activations, Op::Sum).
class GroupView : public Collectives {
   public:
    GroupView(shmbroker_session *s, const Group &group) noexcept : Collectives(s, group.get()) {}
};

// The sending end of a typed channel of `T` records (SendCalls::channel_to): RAII, move-only;
// destroying it closes the channel (the receiver gets what was sent, then Error with
// SHMBROKER_E_CLOSED). One thread at a time.
template <typename T>
class ChannelSender {
    static_assert(std::is_trivially_copyable_v<T>, "a channel copies records' bytes");
    static_assert(alignof(T) <= 8, "a channel's records are aligned to 8");
    static_assert(sizeof(T) <= 4096, "a channel's records are 4096 bytes at most: lend more");

   public:
    ChannelSender(ChannelSender &&other) noexcept : tx_(std::exchange(other.tx_, nullptr)) {}
    ChannelSender &operator=(ChannelSender &&other) noexcept {
        if (this != &other) {
            shmbroker_channel_tx_free(tx_);
            tx_ = std::exchange(other.tx_, nullptr);
        }
        return *this;
    }
    ChannelSender(const ChannelSender &) = delete;
    ChannelSender &operator=(const ChannelSender &) = delete;
    ~ChannelSender() { shmbroker_channel_tx_free(tx_); }

    // `record` if the ring has room now: whether it went.
    bool try_send(const T &record) {
        const int rc = shmbroker_channel_try_send(tx_, &record);
        if (rc == SHMBROKER_E_AGAIN) return false;
        detail::check(rc);
        return true;
    }
    // `record`, waiting for room within the session's deadline.
    void send(const T &record) { detail::check(shmbroker_channel_send(tx_, &record)); }
    // Every one of `count` records, waiting for room as it needs.
    void send_batch(const T *records, std::size_t count) {
        detail::check(shmbroker_channel_send_batch(tx_, records, count));
    }
    void send_batch(const std::vector<T> &records) { send_batch(records.data(), records.size()); }
    // As many of `count` records as fit now: how many.
    std::size_t try_send_batch(const T *records, std::size_t count) {
        std::size_t sent = 0;
        detail::check(shmbroker_channel_try_send_batch(tx_, records, count, &sent));
        return sent;
    }
    shmbroker_channel_tx *get() const noexcept { return tx_; }

   private:
    template <typename>
    friend class detail::SendCalls;
    explicit ChannelSender(shmbroker_channel_tx *tx) noexcept : tx_(tx) {}
    shmbroker_channel_tx *tx_;
};

// The receiving end of a typed channel of `T` records (SendCalls::channel_from).
template <typename T>
class ChannelReceiver {
    static_assert(std::is_trivially_copyable_v<T>, "a channel copies records' bytes");
    static_assert(alignof(T) <= 8, "a channel's records are aligned to 8");
    static_assert(sizeof(T) <= 4096, "a channel's records are 4096 bytes at most: lend more");
    static_assert(std::is_default_constructible_v<T>, "recv returns a T it makes first");

   public:
    ChannelReceiver(ChannelReceiver &&other) noexcept : rx_(std::exchange(other.rx_, nullptr)) {}
    ChannelReceiver &operator=(ChannelReceiver &&other) noexcept {
        if (this != &other) {
            shmbroker_channel_rx_free(rx_);
            rx_ = std::exchange(other.rx_, nullptr);
        }
        return *this;
    }
    ChannelReceiver(const ChannelReceiver &) = delete;
    ChannelReceiver &operator=(const ChannelReceiver &) = delete;
    ~ChannelReceiver() { shmbroker_channel_rx_free(rx_); }

    // The next record if one has arrived.
    std::optional<T> try_recv() {
        T record{};
        const int rc = shmbroker_channel_try_recv(rx_, &record);
        if (rc == SHMBROKER_E_AGAIN) return std::nullopt;
        detail::check(rc);
        return record;
    }
    // The next record, waiting within the deadline.
    T recv() {
        T record{};
        detail::check(shmbroker_channel_recv(rx_, &record));
        return record;
    }
    // Records that have arrived, into `out` (room for `max`), waiting for the first: how many.
    std::size_t recv_batch(T *out, std::size_t max) {
        std::size_t got = 0;
        detail::check(shmbroker_channel_recv_batch(rx_, out, max, &got));
        return got;
    }
    // recv_batch without waiting: may be 0.
    std::size_t try_recv_batch(T *out, std::size_t max) {
        std::size_t got = 0;
        detail::check(shmbroker_channel_try_recv_batch(rx_, out, max, &got));
        return got;
    }
    shmbroker_channel_rx *get() const noexcept { return rx_; }

   private:
    template <typename>
    friend class detail::ReceiveCalls;
    explicit ChannelReceiver(shmbroker_channel_rx *rx) noexcept : rx_(rx) {}
    shmbroker_channel_rx *rx_;
};

namespace detail {
// The receiving calls, shared by a Session and the Receiver half of a split one (`Self` has
// get(), the C handle).
template <typename Self>
class ReceiveCalls {
   public:
    // The typed channel of `T` records `peer` makes to this rank (its next one); throws Error
    // with SHMBROKER_E_MISUSE when `peer`'s tag or record size is not this end's.
    template <typename T>
    ChannelReceiver<T> channel_from(std::uint32_t peer, std::uint64_t tag) {
        shmbroker_channel_rx *rx = nullptr;
        detail::check(shmbroker_channel_from(handle(), peer, tag, sizeof(T), &rx));
        return ChannelReceiver<T>(rx);
    }

    // The next message from `rank` into `buf`; its length. A longer message throws Error with
    // code() SHMBROKER_E_TOO_SMALL and is kept for the next receive.
    std::size_t recv(std::uint32_t rank, void *buf, std::size_t cap) {
        std::size_t len = 0;
        detail::check(shmbroker_recv(handle(), rank, buf, cap, &len));
        return len;
    }

    // recv with a deadline of its own (shmbroker::forever: none) instead of the session's.
    std::size_t recv(std::uint32_t rank, void *buf, std::size_t cap,
                     std::chrono::milliseconds timeout) {
        std::size_t len = 0;
        detail::check(
            shmbroker_recv_timeout(handle(), rank, buf, cap, &len, detail::milliseconds(timeout)));
        return len;
    }

    // The next message from `rank`, whatever its size.
    std::vector<unsigned char> recv(std::uint32_t rank) {
        std::vector<unsigned char> message(probe(rank));
        message.resize(recv(rank, message.data(), message.size()));
        return message;
    }

    // The next message from whichever peer has one, into `buf`.
    Received recv_any(void *buf, std::size_t cap) {
        Received got{0, 0};
        detail::check(shmbroker_recv_any(handle(), &got.rank, buf, cap, &got.size));
        return got;
    }

    // recv_any with a deadline of its own (shmbroker::forever: a response thread that waits as
    // long as it takes while the main thread's collectives keep the session's deadline).
    Received recv_any(void *buf, std::size_t cap, std::chrono::milliseconds timeout) {
        Received got{0, 0};
        detail::check(shmbroker_recv_any_timeout(handle(), &got.rank, buf, cap, &got.size,
                                                 detail::milliseconds(timeout)));
        return got;
    }

    // The next message from whichever peer has one, whatever its size: `message` is resized to
    // it (its capacity is kept, so a loop that reuses it stops allocating).
    std::uint32_t recv_any(std::vector<unsigned char> &message) {
        message.resize(message.capacity() > 0 ? message.capacity() : 4096);
        Received got{0, 0};
        int rc = shmbroker_recv_any(handle(), &got.rank, message.data(), message.size(), &got.size);
        if (rc == SHMBROKER_E_TOO_SMALL) {
            // Kept for us: take it from its sender with a buffer of its size.
            message.resize(got.size);
            got.size = recv(got.rank, message.data(), message.size());
        } else {
            detail::check(rc);
        }
        message.resize(got.size);
        return got.rank;
    }

    // recv without waiting: the length, or empty when nothing from `rank` has arrived.
    std::optional<std::size_t> try_recv(std::uint32_t rank, void *buf, std::size_t cap) {
        std::size_t len = 0;
        int rc = shmbroker_try_recv(handle(), rank, buf, cap, &len);
        if (rc == SHMBROKER_E_AGAIN) return std::nullopt;
        detail::check(rc);
        return len;
    }

    // recv_any without waiting: empty when nothing has arrived.
    std::optional<Received> try_recv_any(void *buf, std::size_t cap) {
        Received got{0, 0};
        int rc = shmbroker_try_recv_any(handle(), &got.rank, buf, cap, &got.size);
        if (rc == SHMBROKER_E_AGAIN) return std::nullopt;
        detail::check(rc);
        return got;
    }

    // The length of the next message from `rank`, without receiving it.
    std::size_t probe(std::uint32_t rank) {
        std::size_t len = 0;
        detail::check(shmbroker_probe(handle(), rank, &len));
        return len;
    }

    // probe with a deadline of its own (shmbroker::forever: none).
    std::size_t probe(std::uint32_t rank, std::chrono::milliseconds timeout) {
        std::size_t len = 0;
        detail::check(shmbroker_probe_timeout(handle(), rank, &len, detail::milliseconds(timeout)));
        return len;
    }

#if __cplusplus >= 202002L
    template <typename T, std::size_t N>
    std::size_t recv(std::uint32_t rank, std::span<T, N> buf) {
        static_assert(std::is_trivially_copyable_v<T>, "recv copies bytes");
        return recv(rank, buf.data(), buf.size_bytes());
    }
#endif

    // The next message from `rank`, which must be a loan, viewed in place.
    LoanView recv_loan(std::uint32_t rank) {
        shmbroker_loan_view *view = nullptr;
        const void *data = nullptr;
        std::size_t len = 0;
        detail::check(shmbroker_recv_loan(handle(), rank, &view, &data, &len));
        return LoanView(view, data, len);
    }

    // The loan `rank` lent this rank as `lent` (from a channel record), viewed in place.
    LoanView view_loan_ref(std::uint32_t rank, const shmbroker_loan_ref &lent) {
        shmbroker_loan_view *view = nullptr;
        const void *data = nullptr;
        std::size_t len = 0;
        detail::check(shmbroker_view_loan_ref(handle(), rank, &lent, &view, &data, &len));
        return LoanView(view, data, len);
    }

    // Ends the current wait on any thread (SHMBROKER_E_INTERRUPTED there). Async-signal-safe.
    void interrupt() const noexcept { shmbroker_interrupt(handle()); }

    // For poll/epoll, with try_recv_any (see shmbroker_readiness_fd).
    int readiness_fd() const noexcept { return shmbroker_readiness_fd(handle()); }


   private:
    shmbroker_session *handle() const noexcept { return static_cast<const Self *>(this)->get(); }
};

// The sending calls, shared by a Session and the Sender half of a split one.
template <typename Self>
class SendCalls {
   public:
    // A typed channel of `T` records from this rank to `peer`, holding `capacity` of them (a
    // power of two from 2 to 2^20): a ring of its own the broker makes. `peer` calls
    // channel_from<T> with the same `tag`. Threads: as a collective.
    template <typename T>
    ChannelSender<T> channel_to(std::uint32_t peer, std::uint64_t tag,
                                std::size_t capacity = 1024) {
        shmbroker_channel_tx *tx = nullptr;
        detail::check(shmbroker_channel_to(handle(), peer, tag, sizeof(T), capacity, &tx));
        return ChannelSender<T>(tx);
    }


    // Lends `loan` to `rank` by reference, for a channel record to carry (consumed, whatever the
    // result); `rank` views it with view_loan_ref, once. Nothing is sent.
    shmbroker_loan_ref lend_ref(std::uint32_t rank, Loan loan) {
        shmbroker_loan_ref lent{};
        detail::check(shmbroker_lend_ref(handle(), rank, loan.release(), &lent));
        return lent;
    }

    void send(std::uint32_t rank, const void *data, std::size_t len) {
        detail::check(shmbroker_send(handle(), rank, data, len));
    }

    // send with a deadline of its own (shmbroker::forever: none) instead of the session's.
    void send(std::uint32_t rank, const void *data, std::size_t len,
              std::chrono::milliseconds timeout) {
        detail::check(shmbroker_send_timeout(handle(), rank, data, len, detail::milliseconds(timeout)));
    }

    template <typename T>
    void send(std::uint32_t rank, const std::vector<T> &data) {
        static_assert(std::is_trivially_copyable_v<T>, "send copies bytes");
        send(rank, data.data(), data.size() * sizeof(T));
    }

#if __cplusplus >= 202002L
    template <typename T, std::size_t N>
    void send(std::uint32_t rank, std::span<const T, N> data) {
        static_assert(std::is_trivially_copyable_v<T>, "send copies bytes");
        send(rank, data.data(), data.size_bytes());
    }
#endif

    // Hands `loan` to `rank` by reference (it is consumed, whatever the result).
    void send_loan(std::uint32_t rank, Loan loan) {
        detail::check(shmbroker_send_loan(handle(), rank, loan.release()));
    }

   private:
    shmbroker_session *handle() const noexcept { return static_cast<const Self *>(this)->get(); }
};

// A session's C handle while its halves share it: closed when the last half goes.
struct SharedHandle {
    explicit SharedHandle(shmbroker_session *s) noexcept : s(s) {}
    SharedHandle(const SharedHandle &) = delete;
    SharedHandle &operator=(const SharedHandle &) = delete;
    ~SharedHandle() { leave(s); }
    shmbroker_session *s;
};
}  // namespace detail

// The sending half of a split session (Session::split): sends, loans sent, and the world's
// collectives (the Collectives calls; a world broadcast's root waits for a slow rank's room
// holding nothing the Receiver needs). Calls on it run one at a time; they go on beside the
// Receiver's on another thread. Rejoin for groups and the other Session calls.
class Sender : public Collectives, public detail::SendCalls<Sender> {
   public:
    Sender(Sender &&other) noexcept
        : Collectives(std::exchange(other.s_, nullptr), nullptr),
          shared_(std::move(other.shared_)) {}
    Sender &operator=(Sender &&other) noexcept {
        if (this != &other) {
            s_ = std::exchange(other.s_, nullptr);
            shared_ = std::move(other.shared_);
        }
        return *this;
    }
    Sender(const Sender &) = delete;
    Sender &operator=(const Sender &) = delete;

    std::uint32_t world_size() const noexcept { return shmbroker_world_size(get()); }
    // The C handle (shared with the Receiver), for calls this header does not wrap; null once
    // moved from or rejoined.
    shmbroker_session *get() const noexcept { return shared_ ? shared_->s : nullptr; }

   private:
    friend class Session;
    explicit Sender(std::shared_ptr<detail::SharedHandle> shared) noexcept
        : Collectives(shared->s, nullptr), shared_(std::move(shared)) {}
    std::shared_ptr<detail::SharedHandle> shared_;
};

// The receiving half of a split session (Session::split): receives, one at a time. A receive
// never waits behind the Sender's send or broadcast on another thread (see shmbroker.h).
class Receiver : public detail::ReceiveCalls<Receiver> {
   public:
    Receiver(Receiver &&) noexcept = default;
    Receiver &operator=(Receiver &&) noexcept = default;
    Receiver(const Receiver &) = delete;
    Receiver &operator=(const Receiver &) = delete;

    std::uint32_t rank() const noexcept { return shmbroker_rank(get()); }
    std::uint32_t world_size() const noexcept { return shmbroker_world_size(get()); }
    // The C handle (shared with the Sender), for calls this header does not wrap; null once
    // moved from or rejoined.
    shmbroker_session *get() const noexcept { return shared_ ? shared_->s : nullptr; }

   private:
    friend class Session;
    explicit Receiver(std::shared_ptr<detail::SharedHandle> shared) noexcept
        : shared_(std::move(shared)) {}
    std::shared_ptr<detail::SharedHandle> shared_;
};

class Session : public Collectives,
                public detail::SendCalls<Session>,
                public detail::ReceiveCalls<Session> {
   public:
    // Logs on to the broker at `path` as `rank` (-1: any free rank); `timeout` is also every
    // later call's deadline (shmbroker::forever: none).
    static Session connect(const std::string &path, int rank = -1,
                           std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
        shmbroker_session *s = nullptr;
        detail::check(
            shmbroker_connect(path.c_str(), rank, detail::milliseconds(timeout), &s));
        return Session(s);
    }

    // Joins the job this process was started in (shmbroker run, mpirun, torchrun, srun).
    static Session from_env(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
        shmbroker_session *s = nullptr;
        detail::check(shmbroker_from_env(detail::milliseconds(timeout), &s));
        return Session(s);
    }

    Session(Session &&other) noexcept : Collectives(std::exchange(other.s_, nullptr), nullptr) {}
    Session &operator=(Session &&other) noexcept {
        if (this != &other) {
            leave();
            s_ = std::exchange(other.s_, nullptr);
        }
        return *this;
    }
    Session(const Session &) = delete;
    Session &operator=(const Session &) = delete;
    ~Session() { leave(); }

    // Leaves the job now; throws Error (SHMBROKER_E_BUSY) while another thread is in a call.
    void close() {
        if (s_ == nullptr) return;
        detail::check(shmbroker_close(s_));
        s_ = nullptr;
    }

    std::uint32_t world_size() const noexcept { return shmbroker_world_size(s_); }

    // How many processes held this rank before this one (0: the job's first). A replacement's
    // world collectives are over: make a group.
    std::uint32_t rejoins() const noexcept { return shmbroker_rejoins(s_); }
    bool rejoined() const noexcept { return rejoins() > 0; }

    // Waits until `rank` is there: at once if alive; if it died, until a replacement rejoins
    // (then messages with it work again; make a new group for collectives). A receive from any
    // peer reports the same replacement once as Error with SHMBROKER_E_PEER_REJOINED.
    void wait_for_rank(std::uint32_t rank, std::chrono::milliseconds timeout) {
        detail::check(shmbroker_wait_for_rank(s_, rank, detail::milliseconds(timeout)));
    }

    // A group of `ranks` (world ranks; their order numbers them in the group), made by every
    // member with the same ranks.
    Group group(const std::vector<std::uint32_t> &ranks) {
        shmbroker_group *g = nullptr;
        detail::check(shmbroker_group_create(s_, ranks.data(), ranks.size(), &g));
        return Group(g);
    }

    // After deaths: waits until every member of `ranks` is alive (a dead one replaced), makes
    // their group by agreement, and tries again through deaths and rejoins until `timeout`.
    // Every member calls it, replacements included.
    Group regroup(const std::vector<std::uint32_t> &ranks, std::chrono::milliseconds timeout) {
        shmbroker_group *g = nullptr;
        detail::check(
            shmbroker_regroup(s_, ranks.data(), ranks.size(), detail::milliseconds(timeout), &g));
        return Group(g);
    }

    // After a death: the group of every rank still there, the same on every survivor.
    Group shrink() {
        shmbroker_group *g = nullptr;
        detail::check(shmbroker_shrink(s_, &g));
        return Group(g);
    }

    // The collectives among `group`'s members.
    GroupView on(const Group &group) const noexcept { return GroupView(s_, group); }

    // Splits the session into its two halves, for two threads: a Sender (sends and
    // collectives) and a Receiver (receives), which never waits behind the Sender's send or
    // broadcast. The session is left empty; the halves close it when the last one goes, or
    // Session::rejoin puts them back together.
    std::pair<Sender, Receiver> split() && {
        auto shared = std::make_shared<detail::SharedHandle>(s_);
        s_ = nullptr;
        return {Sender(shared), Receiver(shared)};
    }

    // The session `sender` and `receiver` were split from; throws Error (SHMBROKER_E_MISUSE)
    // for halves of different sessions.
    static Session rejoin(Sender &&sender, Receiver &&receiver) {
        if (!sender.shared_ || sender.shared_ != receiver.shared_) {
            throw Error(SHMBROKER_E_MISUSE,
                        "a sender rejoins only the receiver of the session it was split from", -1);
        }
        shmbroker_session *s = std::exchange(sender.shared_->s, nullptr);
        sender.s_ = nullptr;
        sender.shared_.reset();
        receiver.shared_.reset();
        return Session(s);
    }
    // The C handle, for calls this header does not wrap.
    shmbroker_session *get() const noexcept { return s_; }

    // barrier with a deadline of its own (shmbroker::forever: none); the other collectives take
    // the session's (set_timeout).
    using Collectives::barrier;
    void barrier(std::chrono::milliseconds timeout) {
        detail::check(shmbroker_barrier_timeout(s_, detail::milliseconds(timeout)));
    }


    // Every rank's `fd`, in rank order, as fds this process owns.
    std::vector<Fd> exchange_fds(int fd) {
        std::vector<int> raw(world_size(), -1);
        detail::check(shmbroker_exchange_fds(s_, fd, raw.data()));
        std::vector<Fd> fds;
        fds.reserve(raw.size());
        for (int r : raw) fds.emplace_back(r);
        return fds;
    }

    // `root`'s `fd` on every rank (`fd` is ignored elsewhere).
    Fd broadcast_fd(std::uint32_t root, int fd) {
        int out = -1;
        detail::check(shmbroker_broadcast_fd(s_, root, fd, &out));
        return Fd(out);
    }

    // Every rank's `fds` (every rank passes as many), by rank and then in each rank's order, as
    // fds this process owns (this rank's own as duplicates): two ring trips for the whole batch.
    std::vector<std::vector<Fd>> exchange_fd_batch(const std::vector<int> &fds) {
        const std::size_t count = fds.size();
        // Everything allocated before the call: nothing can throw once the fds are ours.
        std::vector<int> raw(world_size() * count, -1);
        std::vector<std::vector<Fd>> all(world_size());
        for (auto &batch : all) batch.reserve(count);
        detail::check(shmbroker_exchange_fd_batch(s_, fds.data(), count, raw.data()));
        for (std::size_t at = 0; at < raw.size(); ++at) all[at / count].emplace_back(raw[at]);
        return all;
    }

    // `root`'s `count` fds on every rank, in the root's order (`fds` is read on the root only;
    // every rank passes the same `count`).
    std::vector<Fd> broadcast_fd_batch(std::uint32_t root, const std::vector<int> &fds,
                                       std::size_t count) {
        if (rank() == root && fds.size() != count)
            throw std::invalid_argument("shmbroker: the root of an fd batch broadcast gave " +
                                        std::to_string(fds.size()) + " fds for a count of " +
                                        std::to_string(count));
        std::vector<int> raw(count, -1);
        std::vector<Fd> out;
        out.reserve(count);
        detail::check(shmbroker_broadcast_fd_batch(s_, root, fds.empty() ? nullptr : fds.data(),
                                                   count, raw.data()));
        for (int r : raw) out.emplace_back(r);
        return out;
    }

    // Every rank's GPU handle (a shmbroker_gpu_handle), in rank order, each with its fd for
    // the kinds that carry one (an empty Fd otherwise); `fd` is this rank's, -1 for none.
    std::vector<std::pair<shmbroker_gpu_handle, Fd>> all_gather_gpu_handles(
        const shmbroker_gpu_handle &handle, int fd = -1) {
        std::vector<shmbroker_gpu_handle> handles(world_size());
        std::vector<int> fds(world_size(), -1);
        detail::check(
            shmbroker_all_gather_gpu_handles(s_, &handle, fd, handles.data(), fds.data()));
        std::vector<std::pair<shmbroker_gpu_handle, Fd>> out;
        out.reserve(handles.size());
        for (std::size_t r = 0; r < handles.size(); ++r) out.emplace_back(handles[r], Fd(fds[r]));
        return out;
    }

    // `root`'s GPU handle on every rank, with its fd for the kinds that carry one; the root
    // passes its handle (and fd), the others nothing.
    std::pair<shmbroker_gpu_handle, Fd> broadcast_gpu_handle(
        std::uint32_t root, const shmbroker_gpu_handle *handle = nullptr, int fd = -1) {
        shmbroker_gpu_handle out{};
        int out_fd = -1;
        detail::check(shmbroker_broadcast_gpu_handle(s_, root, handle, fd, &out, &out_fd));
        return {out, Fd(out_fd)};
    }

    // `len` bytes of this rank's outbox, lent out: write them, then send_loan or
    // broadcast_loan it.
    Loan loan(std::size_t len) {
        shmbroker_loan *loan = nullptr;
        void *data = nullptr;
        detail::check(shmbroker_loan_create(s_, len, &loan, &data));
        return Loan(loan, data, len);
    }

    // `count` zeroed elements of `T` in this rank's outbox: all_reduce(symmetric, op) reads
    // them in place on every peer.
    template <typename T>
    Symmetric<T> symmetric(std::size_t count) {
        if (count > SIZE_MAX / sizeof(T)) throw std::length_error("shmbroker: symmetric buffer too large");
        Loan held = loan(count * sizeof(T));
        std::memset(held.data(), 0, held.size());
        return Symmetric<T>(std::move(held), count);
    }

    // Pieces of this session's all-reduces read in place (on symmetric buffers), to check a
    // program's buffers are on that path.
    std::uint64_t reductions_read_in_place() {
        std::uint64_t count = 0;
        detail::check(shmbroker_reductions_read_in_place(s_, &count));
        return count;
    }

    // `root`'s loan on every other rank, viewed in place; the root passes its loan and gets an
    // empty view.
    LoanView broadcast_loan(std::uint32_t root, Loan loan = Loan()) {
        shmbroker_loan_view *view = nullptr;
        const void *data = nullptr;
        std::size_t len = 0;
        detail::check(shmbroker_broadcast_loan(s_, root, loan.release(), &view, &data, &len));
        return LoanView(view, data, len);
    }

    // The deadline of every later call, on any thread (shmbroker::forever: none); a call
    // already waiting keeps its own.
    void set_timeout(std::chrono::milliseconds timeout) {
        detail::check(shmbroker_set_timeout(s_, detail::milliseconds(timeout)));
    }

    // How fds move: the choice (SHMBROKER_FD_TRANSPORT_AUTO, _PIDFD, _RELAY) and how this
    // session's exchanges have moved them so far (_NONE before the first, _PIDFD, _RELAY).
    struct FdTransport {
        int chosen;
        int used;
    };
    FdTransport fd_transport() {
        FdTransport transport{};
        detail::check(shmbroker_fd_transport(s_, &transport.chosen, &transport.used));
        return transport;
    }

   private:
    explicit Session(shmbroker_session *s) noexcept : Collectives(s, nullptr) {}

    void leave() noexcept {
        detail::leave(s_);
        s_ = nullptr;
    }
};

}  // namespace shmbroker

#endif  // SHMBROKER_HPP
