// shmbroker_mpi.hpp in an MPI program whose job spans nodes, against MPI's own calls. Built
// by examples/cpp/CMakeLists.txt when CMake finds MPI; run under mpirun with SHMBROKER_NODE set
// per rank (see examples/c/mpi_nodes.c). Prints "OK mpi_nodes_cpp rank R" on every rank.
#include <shmbroker_mpi.hpp>

#include <cstdio>
#include <numeric>
#include <vector>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int status = 0;
    {
        shmbroker::mpi::Nodes nodes(MPI_COMM_WORLD);
        int rank = nodes.rank();
        auto fail = [&](const char *what) {
            std::fprintf(stderr, "FAILED rank %d: %s\n", rank, what);
            MPI_Abort(MPI_COMM_WORLD, 1);
        };
        if (nodes.nodes() < 2) fail("the layout spans nodes (set SHMBROKER_NODE per rank)");
        for (std::size_t count : {std::size_t{1}, std::size_t{1000}, std::size_t{100001}}) {
            std::vector<float> ours(count), theirs(count);
            for (std::size_t i = 0; i < count; i++) ours[i] = theirs[i] = float((i + rank) % 4);
            nodes.all_reduce(ours, shmbroker::Op::sum);
            MPI_Allreduce(MPI_IN_PLACE, theirs.data(), int(count), MPI_FLOAT, MPI_SUM,
                          MPI_COMM_WORLD);
            if (ours != theirs) fail("all_reduce as MPI_Allreduce");
        }
        std::vector<int> word(4, rank == 1 ? 7 : 0);
        nodes.broadcast(1, word);
        if (word != std::vector<int>(4, 7)) fail("broadcast");
        auto ranks = nodes.all_gather(std::vector<int>{rank});
        std::vector<int> want(std::size_t(nodes.size()));
        std::iota(want.begin(), want.end(), 0);
        if (ranks != want) fail("all_gather");
        try {
            nodes.broadcast(nodes.size(), word);
            fail("a broadcast from a root outside the communicator passed");
        } catch (const shmbroker::Error &error) {
            if (error.code() != SHMBROKER_E_MISUSE || error.rank().has_value()) {
                fail("a root outside the communicator is a misuse naming no rank");
            }
        }
        nodes.barrier();
        std::printf("OK mpi_nodes_cpp rank %d\n", rank);
    }
    MPI_Finalize();
    return status;
}
