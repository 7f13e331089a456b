// shmbroker_mpi.hpp: shmbroker_mpi.h for C++ (see that header for the layout, the algorithms
// and what each call promises). Header only, compiled into the program with its MPI:
//
//     shmbroker::mpi::Nodes nodes(MPI_COMM_WORLD);       // collective over the communicator
//     nodes.all_reduce(values, shmbroker::Op::sum);      // std::vector<float>, in place
//
// Failures throw shmbroker::Error, whose rank() is the communicator's rank it names. Threads:
// as shmbroker_mpi.h says, one at a time, in the same order on every rank.
#ifndef SHMBROKER_MPI_HPP
#define SHMBROKER_MPI_HPP

#include <shmbroker.hpp>
#include <shmbroker_mpi.h>

#include <chrono>
#include <cstdint>
#include <vector>

namespace shmbroker {
namespace mpi {

// shmbroker's collectives over the ranks of an MPI communicator that spans nodes: shared memory
// inside each node, the program's MPI between nodes. Move-only; released when destroyed.
class Nodes {
   public:
    explicit Nodes(MPI_Comm comm, std::chrono::milliseconds timeout = std::chrono::seconds(30))
        : Nodes(comm, nullptr, timeout) {}
    // With this rank's node named by the caller (what its launcher says): ranks that pass the
    // same name are on one node. nullptr: SHMBROKER_NODE, or the host's identity.
    Nodes(MPI_Comm comm, const char *node,
          std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
        int rc = shmbroker_mpi_init_on(comm, node, detail::milliseconds(timeout), &m_);
        if (rc != SHMBROKER_OK) {
            // Every rank gets the worst code of any rank: the failure may be another node's.
            throw Error(rc, "shmbroker_mpi_init failed on this rank or another one", -1);
        }
    }
    Nodes(Nodes &&other) noexcept : m_(other.m_) { other.m_ = nullptr; }
    Nodes &operator=(Nodes &&other) noexcept {
        if (this != &other) {
            shmbroker_mpi_free(m_);
            m_ = other.m_;
            other.m_ = nullptr;
        }
        return *this;
    }
    Nodes(const Nodes &) = delete;
    Nodes &operator=(const Nodes &) = delete;
    ~Nodes() { shmbroker_mpi_free(m_); }

    int rank() const noexcept { return m_->rank; }
    int size() const noexcept { return m_->size; }
    int nodes() const noexcept { return m_->nodes; }
    // This rank's index in its node, and how many ranks its node has.
    int local_rank() const noexcept { return m_->local_rank; }
    int local_size() const noexcept { return m_->local_size; }

    void barrier() { check(shmbroker_mpi_barrier(m_)); }

    template <typename T>
    void all_reduce(T *data, std::size_t count, Op op) {
        check(shmbroker_mpi_all_reduce(m_, data, count, dtype_of<T>::value, static_cast<int>(op)));
    }
    template <typename T>
    void all_reduce(std::vector<T> &data, Op op) {
        all_reduce(data.data(), data.size(), op);
    }

    // Rank `root`'s bytes of `data` into every rank's (the same size on every rank).
    template <typename T>
    void broadcast(int root, std::vector<T> &data) {
        check(shmbroker_mpi_broadcast(m_, root, data.data(), data.size() * sizeof(T)));
    }

    // Every rank's `data` (the same size on every rank), in rank order.
    template <typename T>
    std::vector<T> all_gather(const std::vector<T> &data) {
        std::vector<T> out(data.size() * static_cast<std::size_t>(m_->size));
        check(shmbroker_mpi_all_gather(m_, data.data(), data.size() * sizeof(T), out.data()));
        return out;
    }

    // The C handle, for calls this class does not wrap.
    shmbroker_mpi *handle() noexcept { return m_; }

   private:
    void check(int rc) const {
        if (rc != SHMBROKER_OK) {
            throw Error(rc, shmbroker_mpi_last_error(m_), shmbroker_mpi_last_error_rank(m_));
        }
    }

    shmbroker_mpi *m_ = nullptr;
};

}  // namespace mpi
}  // namespace shmbroker

#endif  // SHMBROKER_MPI_HPP
