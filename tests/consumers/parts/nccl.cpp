// kvtier::nccl: the NCCL communicator type, and a call into libnccl (works without a GPU).
#include <kvtier/comm/nccl.hpp>

#include <string>

static_assert(kvtier::comm::communicator<kvtier::comm::nccl_communicator>);

std::string use_nccl() {
  int version = 0;
  return ncclGetVersion(&version) == ncclSuccess ? "ok (NCCL " + std::to_string(version) + ")"
                                                 : "ncclGetVersion failed";
}
