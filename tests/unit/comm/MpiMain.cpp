// main() of test_comm: MPI's lifetime around GoogleTest. Rank 0 prints the usual report; the
// other ranks print only their failures, each line prefixed with the rank. The exit code is
// non-zero on every rank where a test failed (mpirun then fails too).
#include <cstdio>
#include <memory>

#include "gtest/gtest.h"
#include "runtime/comm/MpiCommunicator.h"
#include "tests/unit/comm/MpiTestUtil.h"

namespace hcp::testing {
namespace {

comm::Communicator* g_world = nullptr;

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.message());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
    }
  }

 private:
  int rank_;
};

}  // namespace

comm::Communicator& World() { return *g_world; }

std::unique_ptr<comm::Communicator> NewWorldCommunicator() {
  absl::StatusOr<std::unique_ptr<comm::MpiCommunicator>> comm = comm::MpiCommunicator::Create();
  if (!comm.ok()) World().Abort(comm.status());
  return *std::move(comm);
}

std::unique_ptr<comm::Communicator> NewCommunicator(const plan::Mesh& mesh) {
  std::unique_ptr<comm::Communicator> comm = NewWorldCommunicator();
  if (absl::Status s = comm->SetMesh(mesh); !s.ok()) World().Abort(s);
  return comm;
}

}  // namespace hcp::testing

int main(int argc, char** argv) {
  hcp::comm::MpiSession mpi(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  // Every rank must run the same tests in the same order.
  GTEST_FLAG_SET(shuffle, false);
  absl::StatusOr<std::unique_ptr<hcp::comm::MpiCommunicator>> world =
      hcp::comm::MpiCommunicator::Create();
  if (!world.ok()) {
    std::fprintf(stderr, "%s\n", std::string(world.status().message()).c_str());
    return 1;
  }
  hcp::testing::g_world = world->get();
  const int rank = (*world)->world_rank();
  if (rank != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new hcp::testing::FailurePrinter(rank));
  } else {
    std::printf("test_comm: %d rank%s\n", (*world)->world_size(),
                (*world)->world_size() == 1 ? "" : "s");
  }
  const int result = RUN_ALL_TESTS();
  world->reset();  // before MPI_Finalize
  return result;
}
