// Uses every optional kvtier part the consumer was configured with and prints one line per
// part ("part <name>: ...") for run_consumer.cmake to check.
#include <cstdio>
#include <string>

std::string use_asio();
std::string use_tls();
std::string use_uring();
std::string use_uring_tls();
std::string use_nccl();
std::string use_openssl();
std::string use_cuda();
std::string use_mpi();
std::string use_doc_initializers();

int main() {
  std::printf("consumer_parts: start\n");
  std::printf("doc initializers: %s\n", use_doc_initializers().c_str());
#ifdef KVTIER_CONSUMER_HAS_ASIO
  std::printf("part asio: %s\n", use_asio().c_str());
#endif
#ifdef KVTIER_CONSUMER_HAS_TLS
  std::printf("part tls: %s\n", use_tls().c_str());
#endif
#ifdef KVTIER_CONSUMER_HAS_URING
  std::printf("part uring: %s\n", use_uring().c_str());
#endif
#ifdef KVTIER_CONSUMER_HAS_URING_TLS
  std::printf("part uring_tls: %s\n", use_uring_tls().c_str());
#endif
#ifdef KVTIER_CONSUMER_HAS_NCCL
  std::printf("part nccl: %s\n", use_nccl().c_str());
#endif
#ifdef KVTIER_CONSUMER_HAS_OPENSSL
  std::printf("part openssl: %s\n", use_openssl().c_str());
#endif
#ifdef KVTIER_CONSUMER_HAS_CUDA
  std::printf("part cuda: %s\n", use_cuda().c_str());
#endif
#ifdef KVTIER_CONSUMER_HAS_MPI
  std::printf("part mpi: %s\n", use_mpi().c_str());
#endif
  return 0;
}
