// transport::tcp::Tcp over real sockets on 127.0.0.1: ranks as threads of this process for the
// logic, a raw socket speaking the wire format by hand for malformed and hostile peers, and real
// processes (transport_tcp_rank) for a rank that dies. Every test is bounded by the transport's
// own timeouts, of a few seconds at most.
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cohort/transport/tcp/frame.hpp>
#include <cohort/transport/tcp/handshake.hpp>
#include <cohort/transport/tcp/tcp.hpp>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

#include "tcp_peers.hpp"

using namespace tcp_test;  // NOLINT: the helpers are this file's vocabulary

// --- the wire format and the handshake, without sockets ---------------------------------------

TEST_CASE("a frame header round-trips and its checksum covers header and payload") {
  const Header header{7, 123456789012345ull, 0xdeadbeefcafef00dull};
  const auto bytes = tcp::encode_header(header, 4099);
  const tcp::FrameHeader decoded = tcp::decode_header(bytes.data());
  CHECK(decoded.magic == tcp::kMagic);
  CHECK(decoded.version == tcp::kProtocolVersion);
  CHECK(decoded.header == header);
  CHECK(decoded.length == 4099);
  // "CHRT" on the wire, whatever the host's byte order.
  CHECK(std::memcmp(bytes.data(), "CHRT", 4) == 0);

  const auto payload = filled(1, 2, 100000);
  const std::uint64_t whole = tcp::checksum(tcp::checksum_seed(bytes.data()), payload);
  tcp::StreamingChecksum pieces;
  pieces.reset(tcp::checksum_seed(bytes.data()));
  for (std::size_t at = 0; at < payload.size(); at += 4097) {
    pieces.update(std::span(payload).subspan(at, std::min<std::size_t>(4097, payload.size() - at)));
  }
  CHECK(pieces.digest() == whole);
  const auto other = tcp::encode_header({7, 123456789012346ull, header.tag}, 4099);
  CHECK(tcp::checksum(tcp::checksum_seed(other.data()), payload) != whole);
}

TEST_CASE("the checksum is XXH3-64 on every processor, whole or in pieces") {
  // checksum() takes the AVX2 kernel where the processor has it; the portable XXH3 is the
  // reference every rank must agree with.
  const auto payload = filled(3, 1, 1000003);
  for (const std::size_t length : {0, 1, 240, 241, 1000, 4099, 65536, 1000003}) {
    for (const std::uint64_t seed : {std::uint64_t{0}, std::uint64_t{12345}}) {
      CAPTURE(length);
      const auto part = std::span(payload).first(length);
      const std::uint64_t reference = XXH3_64bits_withSeed(part.data(), part.size(), seed);
      CHECK(tcp::checksum(seed, part) == reference);
      tcp::StreamingChecksum pieces;
      pieces.reset(seed);
      for (std::size_t at = 0; at < length; at += 777) {
        pieces.update(part.subspan(at, std::min<std::size_t>(777, length - at)));
      }
      CHECK(pieces.digest() == reference);
    }
  }
}

TEST_CASE(
    "a streaming checksum made where another one of the same seed lay computes its secret afresh: "
    "a connection of the next mesh in the memory of the last one's") {
  const auto payload = filled(5, 1, 300000);
  const std::uint64_t seed = 0x5eed;
  const std::uint64_t reference = XXH3_64bits_withSeed(payload.data(), payload.size(), seed);
  // The memory as the allocator may leave it: the earlier state's seed, the rest written over.
  static_assert(sizeof(tcp::StreamingChecksum) == sizeof(XXH3_state_t));
  alignas(tcp::StreamingChecksum) std::array<std::byte, sizeof(tcp::StreamingChecksum)> memory;
  std::ranges::fill(memory, std::byte{0xab});
  XXH3_state_t earlier;
  std::memcpy(&earlier, memory.data(), sizeof earlier);
  earlier.seed = seed;
  earlier.extSecret = nullptr;
  std::memcpy(memory.data(), &earlier, sizeof earlier);
  auto* pieces = new (memory.data()) tcp::StreamingChecksum;  // default-initialized, as a member
  pieces->reset(seed);
  for (std::size_t at = 0; at < payload.size(); at += 65536) {
    pieces->update(
        std::span(payload).subspan(at, std::min<std::size_t>(65536, payload.size() - at)));
  }
  CHECK(pieces->digest() == reference);
  pieces->~StreamingChecksum();
}

TEST_CASE("hello and table payloads round-trip and malformed ones are refused") {
  const tcp::Hello hello = hello_of(3, 5);
  const auto bytes = tcp::encode_hello(hello);
  const auto decoded = tcp::decode_hello(bytes);
  REQUIRE(decoded);
  CHECK(decoded->rank == 3);
  CHECK(decoded->size == 5);
  CHECK(decoded->job_id == "tcp-test");
  CHECK(decoded->nonce == hello.nonce);
  CHECK(tcp::rank_of_hello(bytes) == 3);
  CHECK_FALSE(tcp::decode_hello(std::span(bytes).first(bytes.size() - 1)));

  const std::vector<tcp::Address> table = {{"127.0.0.1", 1}, {"::1", 65535}};
  const auto decoded_table = tcp::decode_table(tcp::encode_table(table), 2);
  REQUIRE(decoded_table);
  CHECK(*decoded_table == table);
  CHECK_FALSE(tcp::decode_table(tcp::encode_table(table), 3));
}

TEST_CASE("hello checks name both values of the first difference") {
  tcp::Hello peer = hello_of(2, 4);
  const tcp::Expectation mine{.rank = 0,
                              .size = 4,
                              .job_id = "tcp-test",
                              .authenticates = false,
                              .checksums = true,
                              .lowest_peer = 1,
                              .highest_peer = 3};
  CHECK(tcp::check_hello(peer, mine) == "");
  peer.job_id = "other";
  CHECK(contains(tcp::check_hello(peer, mine), "job id 'other' differs from 'tcp-test'"));
  peer = hello_of(2, 5);
  CHECK(contains(tcp::check_hello(peer, mine), "rank 2 was told the job has 5 ranks"));
  peer = hello_of(2, 4);
  peer.authenticates = true;
  CHECK(contains(tcp::check_hello(peer, mine), "rank 2 requires authentication"));
}

TEST_CASE("handshake proofs depend on the secret, the role and both hellos") {
  const auto c = tcp::make_frame({setup_type::kHello}, tcp::encode_hello(hello_of(1, 2)));
  const auto a = tcp::make_frame({setup_type::kHello}, tcp::encode_hello(hello_of(0, 2)));
  const auto proof = tcp::proof("secret", tcp::Role::kConnector, c, a);
  CHECK(tcp::proofs_equal(proof, tcp::proof("secret", tcp::Role::kConnector, c, a)));
  CHECK_FALSE(tcp::proofs_equal(proof, tcp::proof("secreT", tcp::Role::kConnector, c, a)));
  CHECK_FALSE(tcp::proofs_equal(proof, tcp::proof("secret", tcp::Role::kAcceptor, c, a)));
  CHECK_FALSE(tcp::proofs_equal(proof, tcp::proof("secret", tcp::Role::kConnector, a, c)));
}

TEST_CASE("bad options are refused naming the field") {
  const auto refusal = [](auto change) {
    tcp::Options options = options_for(1, 2);
    options.rendezvous_port = 1234;
    change(options);
    try {
      tcp::Listener listener(options);
    } catch (const cohort::ConfigError& error) {
      return std::string(error.what());
    }
    return std::string("accepted");
  };
  CHECK(contains(refusal([](auto& o) { o.size = 0; }), "size = 0"));
  CHECK(contains(refusal([](auto& o) { o.rank = 2; }), "rank = 2"));
  CHECK(contains(refusal([](auto& o) { o.rendezvous_port = 0; }), "rendezvous_port = 0"));
  CHECK(contains(refusal([](auto& o) { o.job_id = ""; }), "job_id = ''"));
  CHECK(contains(refusal([](auto& o) { o.bind_address = "localhost"; }),
                 "bind_address = 'localhost'"));
  CHECK(contains(refusal([](auto& o) { o.connect_timeout = milliseconds(0); }),
                 "connect_timeout = 0 ms"));
  CHECK(contains(refusal([](auto& o) { o.operation_timeout = milliseconds(-1); }),
                 "operation_timeout = -1 ms"));
  CHECK(contains(refusal([](auto& o) { o.max_frame_bytes = 0; }), "max_frame_bytes = 0"));
  CHECK(contains(refusal([](auto& o) { o.spin = std::chrono::microseconds(-1); }), "spin = -1 us"));
  CHECK(contains(refusal([](auto& o) { o.receive_buffer_bytes = std::size_t{1} << 31; }),
                 "receive_buffer_bytes = 2147483648: must be at most 2147483647"));
  CHECK(contains(refusal([](auto& o) { o.unsent_limit_bytes = std::size_t{1} << 31; }),
                 "unsent_limit_bytes = 2147483648"));
}

// --- ranks as threads -------------------------------------------------------------------------

TEST_CASE("a single rank needs no network and refuses itself as a peer") {
  tcp::Tcp transport(options_for(0, 1));
  CHECK(transport.size() == 1);
  transport.transfer({}, {});
  std::vector<std::byte> buffer(4);
  const Send send{0, {kCollective, 0, 0}, buffer};
  CHECK_THROWS_WITH_AS(transport.transfer({&send, 1}, {}),
                       doctest::Contains("rank 0: no peer rank 0 in a job of 1 ranks"),
                       cohort::CommError);
}

TEST_CASE("a ring of 2, 3 and 4 ranks passes messages of every length with their contents") {
  for (const int size : {2, 3, 4}) {
    CAPTURE(size);
    require_no_errors(run_ranks(size, [](tcp::Tcp& transport) {
      const int right = (transport.rank() + 1) % transport.size();
      const int left = (transport.rank() + transport.size() - 1) % transport.size();
      std::uint64_t sequence = 0;
      // One message per transfer, every length, several rounds.
      for (std::uint64_t round = 0; round < 3; ++round) {
        for (const std::size_t length : kLengths) {
          const auto out = filled(transport.rank(), round, length);
          std::vector<std::byte> in(length);
          const Header header{kCollective, sequence++, length};
          const Send send{right, header, out};
          const Receive receive{left, header, in};
          transport.transfer({&send, 1}, {&receive, 1});
          REQUIRE(holds(in, left, round));
        }
      }
      // Every length in one transfer: frames to one peer queue up and complete in list order.
      std::vector<std::vector<std::byte>> outs, ins;
      std::vector<Send> sends;
      std::vector<Receive> receives;
      for (const std::size_t length : kLengths) {
        outs.push_back(filled(transport.rank(), 9, length));
        ins.emplace_back(length);
      }
      for (std::size_t i = 0; i < kLengths.size(); ++i) {
        const Header header{kCollective, sequence++, i};
        sends.push_back({right, header, outs[i]});
        receives.push_back({left, header, ins[i]});
      }
      transport.transfer(sends, receives);
      for (const auto& in : ins) REQUIRE(holds(in, left, 9));
    }));
  }
}

TEST_CASE("every pair exchanges at once in one transfer, all to all") {
  for (const int size : {2, 3, 5}) {
    CAPTURE(size);
    require_no_errors(run_ranks(size, [](tcp::Tcp& transport) {
      for (const std::size_t length : {std::size_t{4099}, std::size_t{1} << 22}) {
        const auto out = filled(transport.rank(), length, length);
        std::vector<std::vector<std::byte>> ins(static_cast<std::size_t>(transport.size()));
        std::vector<Send> sends;
        std::vector<Receive> receives;
        const Header header{kCollective, length, 42};
        for (int peer = 0; peer < transport.size(); ++peer) {
          if (peer == transport.rank()) continue;
          ins[static_cast<std::size_t>(peer)].resize(length);
          sends.push_back({peer, header, out});
          receives.push_back({peer, header, ins[static_cast<std::size_t>(peer)]});
        }
        transport.transfer(sends, receives);
        for (int peer = 0; peer < transport.size(); ++peer) {
          if (peer != transport.rank()) {
            REQUIRE(holds(ins[static_cast<std::size_t>(peer)], peer, length));
          }
        }
      }
    }));
  }
}

// The receive buffer (SO_RCVBUF, which Linux reports doubled) and the unsent limit
// (TCP_NOTSENT_LOWAT) of every connected TCP socket of this process.
struct SocketTuning {
  int receive_buffer;
  int unsent_limit;
};
std::vector<SocketTuning> connected_socket_tuning() {
  std::vector<SocketTuning> found;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int descriptor = std::stoi(entry.path().filename().string());
    sockaddr_in peer{};
    socklen_t length = sizeof peer;
    if (::getpeername(descriptor, reinterpret_cast<sockaddr*>(&peer), &length) != 0 ||
        peer.sin_family != AF_INET) {
      continue;
    }
    SocketTuning tuning{-1, -1};  // -1: the kernel did not say
    socklen_t size = sizeof(int);
    ::getsockopt(descriptor, SOL_SOCKET, SO_RCVBUF, &tuning.receive_buffer, &size);
    size = sizeof(int);
    ::getsockopt(descriptor, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &tuning.unsent_limit, &size);
    found.push_back(tuning);
  }
  return found;
}

TEST_CASE("every connection gets the receive buffer and the unsent limit of its options") {
  // Below Linux's default net.core.rmem_max (212992), so that every kernel grants it.
  constexpr std::size_t kReceiveBuffer = 150000;
  constexpr std::size_t kUnsentLimit = 32768;
  std::promise<std::vector<SocketTuning>> seen;
  require_no_errors(run_ranks(
      3,
      [&](tcp::Tcp& transport) {
        // The others wait for rank 0's word, so that every socket is open while it looks.
        std::byte word{};
        if (transport.rank() == 0) {
          seen.set_value(connected_socket_tuning());
          const std::vector<Send> sends{{1, {kCollective, 0, 0}, {&word, 1}},
                                        {2, {kCollective, 0, 0}, {&word, 1}}};
          transport.transfer(sends, {});
        } else {
          const Receive receive{0, {kCollective, 0, 0}, {&word, 1}};
          transport.transfer({}, {&receive, 1});
        }
      },
      [&](tcp::Options& options) {
        options.receive_buffer_bytes = kReceiveBuffer;
        options.unsent_limit_bytes = kUnsentLimit;
      }));
  // Three ranks as threads of this process: both ends of each of the 3 connections are here.
  const auto tunings = seen.get_future().get();
  CHECK(tunings.size() == 6);
  for (const SocketTuning& tuning : tunings) {
    CHECK(tuning.receive_buffer == 2 * static_cast<int>(kReceiveBuffer));
    CHECK(tuning.unsent_limit == static_cast<int>(kUnsentLimit));
  }
}

TEST_CASE("ranks bound to every interface are reached where rank 0 saw them connect from") {
  require_no_errors(
      run_ranks(3, ring_once, [](tcp::Options& options) { options.bind_address = "0.0.0.0"; }));
}

TEST_CASE("a header mismatch names both ranks and both headers and holds them") {
  const auto errors = run_ranks(2, [](tcp::Tcp& transport) {
    std::vector<std::byte> buffer(64);
    if (transport.rank() == 1) {
      const Send send{0, {kCollective, 5, 0x2a}, buffer};
      transport.transfer({&send, 1}, {});
      return;
    }
    const Receive receive{1, {kCollective, 6, 0x2a}, buffer};
    try {
      transport.transfer({}, {&receive, 1});
    } catch (const HeaderMismatch& mismatch) {
      CHECK(mismatch.rank() == 0);
      CHECK(mismatch.peer() == 1);
      CHECK(mismatch.sequence() == 6);      // the one this rank expected
      CHECK(mismatch.operation().empty());  // the layer above names it
      CHECK(mismatch.expected == Header{kCollective, 6, 0x2a});
      CHECK(mismatch.received == Header{kCollective, 5, 0x2a});
      CHECK(mismatch.expected_length == 64);
      CHECK(mismatch.received_length == 64);
      throw;
    }
  });
  const std::string error = message_of(errors[0]);
  CHECK(contains(error,
                 "rank 0: header mismatch with rank 1: expected (type 1, sequence 6, "
                 "tag 0x2a, 64 bytes), rank 1 sent (type 1, sequence 5, tag 0x2a, 64 bytes)"));
  CHECK(message_of(errors[1]) == "");
}

TEST_CASE("a length mismatch is a header mismatch too") {
  const auto errors = run_ranks(2, [](tcp::Tcp& transport) {
    std::vector<std::byte> buffer(transport.rank() == 1 ? 100 : 64);
    const Header header{kCollective, 1, 0};
    if (transport.rank() == 1) {
      const Send send{0, header, buffer};
      transport.transfer({&send, 1}, {});
    } else {
      const Receive receive{1, header, buffer};
      transport.transfer({}, {&receive, 1});
    }
  });
  CHECK_THROWS_AS(std::rethrow_exception(errors[0]), HeaderMismatch);
  CHECK(
      contains(message_of(errors[0]), "64 bytes), rank 1 sent (type 1, sequence 1, tag 0x0, 100"));
}

TEST_CASE(
    "a peer that sends nothing is named by one warning line at a quarter of operation_timeout, "
    "then fails the transfer, named again") {
  CapturedStderr log;
  std::promise<void> failed;
  auto failed_future = failed.get_future().share();
  const auto errors = run_ranks(
      2,
      [&](tcp::Tcp& transport) {
        if (transport.rank() == 1) {
          failed_future.wait();  // keeps the connection open, silent
          return;
        }
        std::vector<std::byte> buffer(16);
        const Receive receive{1, {kCollective, 17, 0}, buffer};
        try {
          transport.transfer({}, {&receive, 1});
        } catch (...) {
          failed.set_value();
          throw;
        }
        failed.set_value();
      },
      [](tcp::Options& options) {
        options.operation_timeout = milliseconds(1200);
        options.stall_warning = 0.25;
      });
  const std::string logged = log.finish();
  CAPTURE(logged);
  CHECK(std::count(logged.begin(), logged.end(), '\n') == 1);
  CHECK(contains(logged, "cohort: rank 0: no progress for 3"));
  CHECK(contains(logged, " ms during sequence 17, waiting for: receive from rank 1 "));
  CHECK(contains(logged, "the transfer fails at operation_timeout = 1200 ms"));
  const std::string error = message_of(errors[0]);
  CHECK(contains(error, "rank 0: no progress within 1200 ms during sequence 17"));
  CHECK(contains(error, "receive from rank 1"));
}

TEST_CASE(
    "a peer that closes is named with the sequence, as fields too, and the failure is final") {
  const auto errors = run_ranks(2, [](tcp::Tcp& transport) {
    if (transport.rank() == 1) return;  // destroying the transport closes the connection
    std::vector<std::byte> buffer(16);
    const Receive receive{1, {kCollective, 17, 0}, buffer};
    std::optional<cohort::CommError> first;
    try {
      transport.transfer({}, {&receive, 1});
    } catch (const cohort::CommError& error) {
      first = error;
    }
    REQUIRE(first.has_value());
    CHECK(contains(first->what(), "rank 0: rank 1 closed the connection during sequence 17"));
    CHECK(first->rank() == 0);
    CHECK(first->peer() == 1);
    CHECK(first->sequence() == 17);
    CHECK(first->operation().empty());  // the layer above names it
    bool refused = false;
    try {
      transport.transfer({}, {&receive, 1});
    } catch (const cohort::CommError& again) {
      refused = true;
      CHECK(contains(again.what(), "failed earlier"));
      CHECK(again.peer() == 1);  // still the peer of the failure that closed the transport
      CHECK(again.sequence() == 17);
    }
    CHECK(refused);
    std::error_code code;
    transport.transfer({}, {&receive, 1}, code);
    CHECK(code == cohort::Errc::kComm);
    CHECK(contains(transport.last_failure(), "failed earlier"));
    CHECK(contains(transport.last_failure(), "rank 1 closed the connection during sequence 17"));
  });
  require_no_errors(errors);
}

namespace {

// 2 ranks wait in a transfer from each other; 100 ms in, another thread of rank 0 calls
// interrupt(transport) on rank 0's transport. Returns what each rank threw.
std::vector<std::exception_ptr> interrupted_on_rank_0(
    const std::function<void(tcp::Tcp&)>& interrupt) {
  return run_ranks(2, [&](tcp::Tcp& transport) {
    std::vector<std::byte> buffer(16);
    const Receive receive{1 - transport.rank(), {kCollective, 4, 0}, buffer};
    std::thread interrupter;
    if (transport.rank() == 0) {
      interrupter = std::thread([&] {
        std::this_thread::sleep_for(milliseconds(100));
        interrupt(transport);  // while rank 0 waits in transfer()
      });
    }
    try {
      transport.transfer({}, {&receive, 1});
    } catch (...) {
      if (interrupter.joinable()) interrupter.join();
      throw;
    }
  });
}

}  // namespace

TEST_CASE("close() from another thread ends a transfer at once and the peer sees it") {
  const auto errors = interrupted_on_rank_0([](tcp::Tcp& transport) { transport.close(); });
  CHECK(contains(message_of(errors[0]), "rank 0: the transport was closed during the transfer"));
  CHECK(contains(message_of(errors[1]), "rank 1: rank 0 closed the connection during sequence 4"));
}

TEST_CASE("abort() from another thread ends a transfer at once, and the peer learns its reason") {
  // As a collective's abort() does when a replica fails on its own.
  const auto errors = interrupted_on_rank_0(
      [](tcp::Tcp& transport) { transport.abort("replica 1 ran out of memory"); });
  CHECK(contains(message_of(errors[0]), "rank 0: this rank aborted: replica 1 ran out of memory"));
  CHECK(contains(message_of(errors[1]), "rank 1: rank 0 left: 'replica 1 ran out of memory'"));
}

TEST_CASE("abort() with no transfer in flight tells the peers its reason at once") {
  std::promise<void> told;
  std::future<void> told_future = told.get_future();
  const auto errors = run_ranks(2, [&](tcp::Tcp& transport) {
    if (transport.rank() == 0) {
      transport.abort("the model threw: bad shape");
      transport.abort("a later reason, not the first");
      told_future.wait();  // the transport lives on: the peer learns it from abort() itself
      return;
    }
    std::vector<std::byte> buffer(16);
    const Receive receive{0, {kCollective, 9, 0}, buffer};
    try {
      transport.transfer({}, {&receive, 1});
    } catch (...) {
      told.set_value();
      throw;
    }
    told.set_value();
  });
  CHECK(message_of(errors[0]).empty());
  CHECK(contains(message_of(errors[1]), "rank 1: rank 0 left: 'the model threw: bad shape'"));
}

TEST_CASE("under a timeline, a transfer's wait for a peer that has not begun to send is a span") {
  cohort::trace::Recorder recorder("test", 0);
  const cohort::trace::Installed installed(&recorder);
  const auto errors = run_ranks(2, [](tcp::Tcp& transport) {
    std::vector<std::byte> buffer(64);
    const Header header{kCollective, 5, 0};
    if (transport.rank() == 1) {
      std::this_thread::sleep_for(milliseconds(300));  // rank 0 is waiting for this rank
      const Send send{0, header, buffer};
      transport.transfer({&send, 1}, {});
      return;
    }
    const Receive receive{1, header, buffer};
    transport.transfer({}, {&receive, 1});
  });
  require_no_errors(errors);
  const auto events = recorder.events();
  const auto wait = std::find_if(events.begin(), events.end(), [](const auto& event) {
    return event.phase == cohort::trace::Phase::kPeerWait;
  });
  REQUIRE(wait != events.end());
  CHECK(wait->detail.index == 1);  // the peer heard last
}

TEST_CASE("a send longer than max_frame_bytes is refused and the transport stays usable") {
  require_no_errors(run_ranks(
      2,
      [](tcp::Tcp& transport) {
        const int peer = 1 - transport.rank();
        std::vector<std::byte> big(2048), small(8);
        const Send too_long{peer, {kCollective, 0, 0}, big};
        CHECK_THROWS_WITH_AS(transport.transfer({&too_long, 1}, {}),
                             doctest::Contains("exceeds max_frame_bytes = 1024"),
                             cohort::CommError);
        const Send send{peer, {kCollective, 1, 0}, small};
        const Receive receive{peer, {kCollective, 1, 0}, small};
        transport.transfer({&send, 1}, {&receive, 1});
      },
      [](tcp::Options& options) { options.max_frame_bytes = 1024; }));
}

TEST_CASE("a wrong secret is refused on both sides; the right one is accepted") {
  // Rank 0, which has the secret, refuses the connection and waits on for a rank 1 that can
  // prove it: at its deadline it names the missing rank and the refusal.
  const auto wrong = run_ranks(
      2, [](tcp::Tcp&) {},
      [](tcp::Options& options) {
        options.secret = std::string(options.rank == 0 ? "alpha" : "beta");
        options.connect_timeout = milliseconds(1500);
      });
  CHECK(contains(message_of(wrong[0]), "rank 1 never joined"));
  CHECK(contains(message_of(wrong[0]), "claiming to be rank 1: authentication failed"));
  CHECK(contains(message_of(wrong[1]), "rank 1: rendezvous: authentication failed with rank 0"));

  const auto one_sided = run_ranks(
      2, [](tcp::Tcp&) {},
      [](tcp::Options& options) {
        options.secret = std::string(options.rank == 0 ? "alpha" : "");
        options.connect_timeout = milliseconds(1500);
      });
  CHECK(contains(message_of(one_sided[0]), "rank 1 never joined"));
  CHECK(contains(message_of(one_sided[1]), "rank 1 has no secret"));

  require_no_errors(
      run_ranks(3, ring_once, [](tcp::Options& options) { options.secret = "shared"; }));
}

TEST_CASE("checksums can be turned off, by every rank or by none") {
  require_no_errors(run_ranks(
      3,
      [](tcp::Tcp& transport) {
        const int right = (transport.rank() + 1) % 3, left = (transport.rank() + 2) % 3;
        for (const std::size_t length : kLengths) {
          auto out = filled(transport.rank(), 0, length);
          std::vector<std::byte> in(length);
          const Send send{right, {kCollective, length, 0}, out};
          const Receive receive{left, {kCollective, length, 0}, in};
          transport.transfer({&send, 1}, {&receive, 1});
          CHECK(holds(in, left, 0));
        }
      },
      [](tcp::Options& options) { options.checksum = false; }));
  const auto errors = run_ranks(
      2, [](tcp::Tcp&) {}, [](tcp::Options& options) { options.checksum = options.rank == 0; });
  CHECK(contains(message_of(errors[0]),
                 "rank 0: rendezvous: rank 1 has checksum = false, rank 0 has checksum = true"));
  CHECK(contains(message_of(errors[1]), "rank 1 has checksum = false"));
}

TEST_CASE("a rank of another job is refused naming both job ids") {
  const auto errors = run_ranks(
      2, [](tcp::Tcp&) {},
      [](tcp::Options& options) { options.job_id = std::string(options.rank == 0 ? "a" : "b"); });
  CHECK(contains(message_of(errors[0]),
                 "rank 0: rendezvous: rank 1 belongs to another job: job id 'b' differs from 'a'"));
  CHECK(contains(message_of(errors[1]), "job id 'b' differs from 'a'"));
}

TEST_CASE(
    "with a secret, ranks told different sizes or jobs both fail at once, naming the difference, "
    "not after connect_timeout") {
  const auto sizes = run_ranks(
      2, [](tcp::Tcp&) {},
      [](tcp::Options& options) {
        options.secret = kSecret;
        options.connect_timeout = std::chrono::seconds(30);
        if (options.rank == 1) options.size = 3;  // as after roll calls that disagree
      });
  CHECK(contains(message_of(sizes[0]),
                 "rank 0: rendezvous: rank 1 was told the job has 3 ranks, rank 0 was told 2"));
  CHECK(contains(message_of(sizes[1]),
                 "rank 1: rendezvous: rank 0 was told the job has 2 ranks, rank 1 was told 3"));
  const auto jobs = run_ranks(
      2, [](tcp::Tcp&) {},
      [](tcp::Options& options) {
        options.secret = kSecret;
        options.connect_timeout = std::chrono::seconds(30);
        options.job_id = std::string(options.rank == 0 ? "a" : "b");
      });
  for (const auto& error : jobs) {
    CAPTURE(message_of(error));
    CHECK(contains(message_of(error), "job id"));
    CHECK(!contains(message_of(error), "timed out"));
  }
}

TEST_CASE("ranks that never join are named by every rank that waits, after connect_timeout") {
  const auto errors = run_ranks(
      4, [](tcp::Tcp&) {},
      [](tcp::Options& options) { options.connect_timeout = milliseconds(1000); }, {0, 1});
  CAPTURE(message_of(errors[0]));
  CAPTURE(message_of(errors[1]));
  CHECK(contains(message_of(errors[0]),
                 "rank 0: rendezvous: timed out after 1000 ms: ranks 2, 3 never joined"));
  CHECK(contains(message_of(errors[1]), "rank 1: rendezvous: aborted by rank 0: 'rank 0: "));
  CHECK(contains(message_of(errors[1]), "ranks 2, 3 never joined"));
}

TEST_CASE("a rank whose rank 0 never starts names it and the address after connect_timeout") {
  std::uint16_t port = 0;
  const RawSocket bound_not_listening = [&] {
    RawSocket socket(::socket(AF_INET, SOCK_STREAM, 0));
    sockaddr_in address = loopback(0);
    REQUIRE(::bind(socket.fd(), reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0);
    socklen_t length = sizeof address;
    REQUIRE(::getsockname(socket.fd(), reinterpret_cast<sockaddr*>(&address), &length) == 0);
    port = ntohs(address.sin_port);
    return socket;
  }();
  tcp::Options options = options_for(1, 2);
  options.rendezvous_port = port;
  options.connect_timeout = milliseconds(300);
  const std::string expected =
      "rank 1: rendezvous: timed out after 300 ms: rank 0 never answered at 127.0.0.1:" +
      std::to_string(port) + " (last attempt: Connection refused)";
  // A process started to join a running job (a worker started again) is told why it may find
  // nobody there.
  const std::string once_ended =
      "; a process that joins a running job finds none there once the job's fit has ended";
  const auto failure = [](const tcp::Options& each) -> std::string {
    try {
      const tcp::Tcp transport(each);
    } catch (const cohort::CommError& error) {
      return error.what();
    }
    return "(no error)";
  };
  const std::string starting = failure(options);
  CHECK(contains(starting, expected));
  CHECK_FALSE(contains(starting, once_ended));
  options.joins_running_job = true;
  const std::string joining = failure(options);
  CHECK(contains(joining, expected));
  CHECK(contains(joining, once_ended));
}

TEST_CASE(
    "ranks other than 0 listen in listen_port_first-listen_port_last, and say when it is full") {
  // Three free ports in a row: one the system gave, if the two after it are free too.
  const auto bindable = [](std::uint16_t port) {
    RawSocket socket(::socket(AF_INET, SOCK_STREAM, 0));
    const sockaddr_in address = loopback(port);
    return ::bind(socket.fd(), reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0;
  };
  std::uint16_t first = 0;
  for (int attempt = 0; attempt < 50 && first == 0; ++attempt) {
    std::uint16_t port = 0;
    { const RawSocket probe = listen_raw(port); }
    if (port < 65000 && bindable(port) && bindable(port + 1) && bindable(port + 2)) first = port;
  }
  REQUIRE(first != 0);
  const auto in_range = [&](tcp::Options& options) {
    options.listen_port_first = first;
    options.listen_port_last = static_cast<std::uint16_t>(first + 2);
  };
  require_no_errors(run_ranks(
      3, [](tcp::Tcp&) {}, in_range));  // the job meets in the range
  std::vector<tcp::Listener> taken;
  tcp::Options options = options_for(1, 2);
  options.rendezvous_port = 1;
  in_range(options);
  for (int i = 0; i < 3; ++i) {
    taken.emplace_back(options);
    CHECK(taken.back().port() == first + i);
  }
  const std::string expected = "rank 1: cannot listen on 127.0.0.1:" + std::to_string(first + 2) +
                               " (every port of listen_port_first-listen_port_last, " +
                               std::to_string(first) + "-" + std::to_string(first + 2) +
                               ", is taken)";
  CHECK_THROWS_WITH_AS(tcp::Listener{options}, doctest::Contains(expected.c_str()),
                       cohort::CommError);
  options.listen_port_last = 0;
  CHECK_THROWS_WITH_AS(tcp::Listener{options},
                       doctest::Contains("listen_port_first, listen_port_last"),
                       cohort::ConfigError);
}

TEST_CASE("a busy rendezvous port is refused naming the address and port") {
  std::uint16_t port = 0;
  const RawSocket busy = listen_raw(port);
  tcp::Options options = options_for(0, 2);
  options.rendezvous_port = port;
  const std::string where = "rank 0: cannot listen on 127.0.0.1:" + std::to_string(port);
  CHECK_THROWS_WITH_AS(tcp::Listener{options}, doctest::Contains(where.c_str()), cohort::CommError);
  CHECK_THROWS_WITH_AS(tcp::Listener{options}, doctest::Contains("in use"), cohort::CommError);
}

// --- hostile and broken peers, written by hand ------------------------------------------------

TEST_CASE("a peer speaking protocol version 99 is refused naming both versions") {
  RankZero rank_zero(2, [](tcp::Tcp&) {});
  RawSocket socket = connect_raw(rank_zero.port);
  write_all(socket, tcp::make_frame({setup_type::kHello}, tcp::encode_hello(hello_of(1, 2)),
                                    /*version=*/99));
  const RawFrame abort = read_frame(socket);  // rank 0 says why before it closes
  CHECK(abort.header.header.type == setup_type::kAbort);
  const std::string why = tcp::decode_text(abort.payload());
  CHECK(why == "rank 0: rendezvous: rank 1 speaks protocol version 99, this is version 5");
  CHECK(contains(rank_zero.finish(), why));
}

TEST_CASE("a rank 0 speaking protocol version 99 is refused by the joining rank") {
  std::uint16_t port = 0;
  const RawSocket listener = listen_raw(port);
  std::thread fake_root([&] {
    RawSocket peer(::accept(listener.fd(), nullptr, nullptr));
    const timeval timeout{5, 0};
    ::setsockopt(peer.fd(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    std::vector<std::byte> hello(tcp::kHeaderBytes);
    if (!read_all(peer, hello)) return;
    const auto header = tcp::decode_header(hello.data());
    hello.resize(tcp::kHeaderBytes + header.length + tcp::kTrailerBytes);
    if (!read_all(peer, std::span(hello).subspan(tcp::kHeaderBytes))) return;
    write_all(peer, tcp::make_frame({setup_type::kHello}, tcp::encode_hello(hello_of(0, 2)), 99));
    std::byte ignored[256];
    while (::recv(peer.fd(), ignored, sizeof ignored, 0) > 0) {
    }
  });
  tcp::Options options = options_for(1, 2);
  options.rendezvous_port = port;
  CHECK_THROWS_WITH_AS(
      tcp::Tcp{options},
      doctest::Contains("rank 1: rendezvous: rank 0 speaks protocol version 99, this is version 5"),
      cohort::CommError);
  fake_root.join();
}

TEST_CASE("a rank restarted with the same address during the rendezvous takes its own place") {
  // Rank 1 joins, then dies before the others came (its process crashed; the launcher starts it
  // again): its new connection replaces the ended one instead of being "rank 1 joined twice".
  RankZero rank_zero(3, [](tcp::Tcp& transport) {
    std::vector<std::byte> buffer(3);
    const Receive receive{1, {kCollective, 0, 0}, buffer};
    transport.transfer({}, {&receive, 1});
    CHECK(buffer == std::vector{std::byte{1}, std::byte{2}, std::byte{3}});
  });
  {
    RawSocket first_life = connect_raw(rank_zero.port);
    write_all(first_life, tcp::make_frame({setup_type::kHello}, tcp::encode_hello(hello_of(1, 3))));
    REQUIRE(read_frame(first_life).header.header.type == setup_type::kHello);
    write_all(first_life, tcp::make_frame({setup_type::kConfirm}, {}));
    REQUIRE(read_frame(first_life).header.header.type == setup_type::kConfirm);
  }  // closed: the first life ends here
  std::this_thread::sleep_for(milliseconds(100));
  std::vector<std::string> errors(3);
  std::vector<std::thread> ranks;
  for (const int rank : {1, 2}) {
    ranks.emplace_back([&, rank] {
      try {
        tcp::Options options = options_for(rank, 3);
        options.rendezvous_port = rank_zero.port;
        tcp::Tcp transport(options);
        if (rank == 1) {
          const std::vector<std::byte> payload = {std::byte{1}, std::byte{2}, std::byte{3}};
          const Send send{0, {kCollective, 0, 0}, payload};
          transport.transfer({&send, 1}, {});
        }
      } catch (...) {
        errors[static_cast<std::size_t>(rank)] = message_of(std::current_exception());
      }
    });
  }
  for (auto& rank : ranks) rank.join();
  CHECK(errors[1] == "");
  CHECK(errors[2] == "");
  CHECK(rank_zero.finish() == "");
}

TEST_CASE("a connection that is not a cohort rank is dropped and the rendezvous goes on") {
  RankZero rank_zero(2, [](tcp::Tcp& transport) {
    std::vector<std::byte> buffer(3);
    const Receive receive{1, {kCollective, 0, 0}, buffer};
    transport.transfer({}, {&receive, 1});
    CHECK(buffer == std::vector{std::byte{1}, std::byte{2}, std::byte{3}});
  });
  {
    RawSocket stray = connect_raw(rank_zero.port);
    const char request[] = "GET / HTTP/1.0\r\n\r\n   and some more bytes to fill a header";
    write_all(stray, std::as_bytes(std::span(request)));
    std::byte byte;
    CHECK(::recv(stray.fd(), &byte, 1, 0) <= 0);  // dropped: end of file or reset
  }
  RawSocket socket = join_as_rank_1(rank_zero.port);
  const std::vector<std::byte> payload = {std::byte{1}, std::byte{2}, std::byte{3}};
  write_all(socket, tcp::make_frame({kCollective, 0, 0}, payload));
  CHECK(rank_zero.finish() == "");
}

TEST_CASE("a frame announcing more than max_frame_bytes is refused before its payload") {
  RankZero rank_zero(
      2,
      [](tcp::Tcp& transport) {
        std::vector<std::byte> buffer(4096);
        const Receive receive{1, {kCollective, 3, 0}, buffer};
        transport.transfer({}, {&receive, 1});
      },
      [](tcp::Options& options) { options.max_frame_bytes = std::size_t{1} << 20; });
  RawSocket socket = join_as_rank_1(rank_zero.port);
  const auto header = tcp::encode_header({kCollective, 3, 0}, std::uint64_t{1} << 40);
  write_all(socket, header);
  CHECK(contains(
      rank_zero.finish(),
      "rank 0: rank 1 announced a frame of 1099511627776 bytes during sequence 3, more than "
      "max_frame_bytes = 1048576; refused before reading it"));
}

TEST_CASE("a truncated frame is the peer closing mid-frame, named with what had arrived") {
  RankZero rank_zero(2, [](tcp::Tcp& transport) {
    std::vector<std::byte> buffer(4099);
    const Receive receive{1, {kCollective, 3, 0}, buffer};
    transport.transfer({}, {&receive, 1});
  });
  RawSocket socket = join_as_rank_1(rank_zero.port);
  const auto frame = tcp::make_frame({kCollective, 3, 0}, filled(1, 0, 4099));
  write_all(socket, std::span(frame).first(tcp::kHeaderBytes + 2000));
  socket.close();
  CHECK(contains(
      rank_zero.finish(),
      "rank 0: rank 1 closed the connection during sequence 3 (receiving (type 1, sequence 3, "
      "tag 0x0, 4099 bytes), 2000 payload bytes arrived)"));
}

TEST_CASE("a corrupted payload fails its checksum") {
  RankZero rank_zero(2, [](tcp::Tcp& transport) {
    std::vector<std::byte> buffer(4099);
    const Receive receive{1, {kCollective, 3, 0}, buffer};
    transport.transfer({}, {&receive, 1});
  });
  RawSocket socket = join_as_rank_1(rank_zero.port);
  auto frame = tcp::make_frame({kCollective, 3, 0}, filled(1, 0, 4099));
  frame[tcp::kHeaderBytes + 1000] ^= std::byte{0x10};
  write_all(socket, frame);
  CHECK(contains(rank_zero.finish(),
                 "rank 0: the frame from rank 1 (type 1, sequence 3, tag "
                 "0x0, 4099 bytes) fails its checksum"));
}

// --- real processes ---------------------------------------------------------------------------

namespace {

// Child processes that are killed and reaped whatever happens to the test.
struct Children {
  std::vector<pid_t> pids;
  pid_t spawn(std::vector<std::string> arguments) {
    arguments.insert(arguments.begin(), COHORT_TCP_RANK);
    std::vector<char*> argv;
    for (auto& argument : arguments) argv.push_back(argument.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    REQUIRE(::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) == 0);
    pids.push_back(pid);
    return pid;
  }
  int wait(pid_t pid) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    pids.erase(std::find(pids.begin(), pids.end(), pid));
    return status;
  }
  ~Children() {
    for (const pid_t pid : pids) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
};

std::string read_file(const std::filesystem::path& file) {
  std::ifstream in(file);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("a rank process killed mid-transfer is named by the others as closed, not timed out") {
  const auto directory = std::filesystem::temp_directory_path();
  const auto report_1 = directory / ("cohort-tcp-test-" + std::to_string(::getpid()) + "-1");
  const auto report_2 = directory / ("cohort-tcp-test-" + std::to_string(::getpid()) + "-2");
  tcp::Options options = options_for(0, 3);
  options.job_id = "process-test";
  options.operation_timeout = std::chrono::seconds(20);  // failure must come from the kill
  tcp::Listener listener(options);
  const std::string port = std::to_string(listener.rendezvous_port());
  Children children;
  const pid_t rank_1 = children.spawn({"1", "3", port, report_1.string()});
  const pid_t rank_2 = children.spawn({"2", "3", port, report_2.string()});
  tcp::Tcp transport(std::move(listener));

  const std::size_t length = std::size_t{1} << 20;
  std::vector<std::byte> out(length, std::byte{0x5a});
  std::vector<std::vector<std::byte>> in(3, std::vector<std::byte>(length));
  std::string error;
  bool killed = false;
  for (std::uint64_t sequence = 0; error.empty(); ++sequence) {
    if (sequence == 20) {
      ::kill(rank_2, SIGKILL);
      killed = true;
    }
    const Header header{kCollective, sequence, 0};
    const std::vector<Send> sends = {{1, header, out}, {2, header, out}};
    const std::vector<Receive> receives = {{1, header, in[1]}, {2, header, in[2]}};
    try {
      transport.transfer(sends, receives);
    } catch (const cohort::CommError& failure) {
      error = failure.what();
    }
    REQUIRE(sequence < 1000);
  }
  REQUIRE(killed);
  CAPTURE(error);
  const int status_2 = children.wait(rank_2);
  CHECK((WIFSIGNALED(status_2) && WTERMSIG(status_2) == SIGKILL));
  const int status_1 = children.wait(rank_1);
  CHECK((WIFEXITED(status_1) && WEXITSTATUS(status_1) == 3));
  CHECK(contains(read_file(report_1), "rank 1: rank 2 closed the connection during sequence"));
  // Rank 2's frame of the sequence it was killed in may have reached rank 0 whole before it died:
  // rank 0 then waits only on rank 1, which failed on rank 2 (above) and ended, and rank 0 names
  // rank 1's end instead. Either way a closed connection, not a timeout.
  CHECK((contains(error, "rank 0: rank 2 closed the connection during sequence") ||
         contains(error, "rank 0: rank 1 closed the connection during sequence")));
  std::filesystem::remove(report_1);
  std::filesystem::remove(report_2);
}
