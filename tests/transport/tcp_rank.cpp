// One rank of a TCP job in a process of its own, for the tests that need real processes (a rank
// that dies for real, with the kernel closing its sockets):
//
//   transport_tcp_rank RANK SIZE PORT REPORT
//
// Joins the job whose rank 0 listens on 127.0.0.1:PORT and exchanges 1 MiB messages with every
// other rank, all at once, until a transfer fails. Then it writes the error to the file REPORT,
// keeps its connections open for a second (so that the others see its failure as the first
// rank's, not as this one closing) and exits with status 3. The test kills one of these.
#include <chrono>
#include <cohort/transport/tcp/tcp.hpp>
#include <cstdint>
#include <exception>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace tcp = cohort::transport::tcp;
using cohort::transport::Header;
using cohort::transport::Receive;
using cohort::transport::Send;

int main(int argc, char** argv) {
  if (argc != 5) return 64;
  const int rank = std::stoi(argv[1]);
  const int size = std::stoi(argv[2]);
  const auto port = static_cast<std::uint16_t>(std::stoi(argv[3]));
  const std::string report = argv[4];
  try {
    tcp::Tcp transport({.rank = rank,
                        .size = size,
                        .job_id = "process-test",
                        .rendezvous_port = port,
                        .connect_timeout = std::chrono::seconds(10),
                        .operation_timeout = std::chrono::seconds(20)});
    const std::size_t length = std::size_t{1} << 20;
    std::vector<std::byte> out(length, std::byte{0x5a});
    std::vector<std::vector<std::byte>> in(static_cast<std::size_t>(size),
                                           std::vector<std::byte>(length));
    try {
      for (std::uint64_t sequence = 0;; ++sequence) {
        const Header header{cohort::transport::message_type::kCollective, sequence, 0};
        std::vector<Send> sends;
        std::vector<Receive> receives;
        for (int peer = 0; peer < size; ++peer) {
          if (peer == rank) continue;
          sends.push_back({peer, header, out});
          receives.push_back({peer, header, in[static_cast<std::size_t>(peer)]});
        }
        transport.transfer(sends, receives);
      }
    } catch (const std::exception& error) {
      std::ofstream(report) << error.what();
      std::this_thread::sleep_for(std::chrono::seconds(1));
      return 3;
    }
  } catch (const std::exception& error) {
    std::ofstream(report) << "setup: " << error.what();
    return 2;
  }
}
