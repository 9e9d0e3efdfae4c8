// transport::tcp::Connection: one connection to one peer and the frame in flight each way on it
// (frame.hpp has the layout). Tcp (tcp.hpp) owns one per peer and drives them from its loop; it
// holds the queues of the transfer in progress, a Connection only the frame being written and the
// frame being read.
//
// Sending: start_send() begins a frame, write_some() makes one gathering write of header, payload
// and trailer from where they are, until the frame is whole on the wire. A payload of up to 256
// KiB is checksummed (or MACed) in one call before its first byte leaves; a longer one leaves 256
// KiB at a time, each piece folded in right after the kernel's copy has read it, while it is in
// cache. Encrypting, each piece is sealed into a buffer of the connection before it leaves.
//
// Receiving: start_receive() expects a header, read_some() reads as far as the bytes that have
// arrived allow: the header is checked before a byte of its payload is taken, the payload goes
// straight into the caller's buffer (bytes that came with the header through the inbox), each
// piece is checksummed, MAC-checked or decrypted right after the kernel wrote it, and the trailer
// is verified. next_frame_arrived() gathers a whole frame in the inbox without consuming it
// (wait_any).
//
// A failure that leaves the stream out of step shuts the connection down and comes back as a
// Broken with its message. A peer that leaves says why first (Tcp::leave, write_farewell()); its
// message, found in the inbox ahead of the end of the stream, becomes the failure's text.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>

#include "cohort/transport/tcp/frame.hpp"
#include "cohort/transport/tcp/frame_mac.hpp"
#include "cohort/transport/tcp/options.hpp"
#include "cohort/transport/tcp/rendezvous.hpp"
#include "cohort/transport/transport.hpp"

namespace cohort::transport::tcp {

class Connection {
 public:
  // A leave message: its reason is cut to this length (a whole one fits the inbox), and sending
  // it to every peer, or looking for one from a peer that closed, may take this long.
  static constexpr std::size_t kLeaveReasonBytes = 4096;
  static constexpr std::chrono::milliseconds kLeaveWait{1000};

  // A failure that left the stream out of step: the connection is shut down already.
  struct Broken {
    std::string detail;
    std::optional<HeaderMismatch> mismatch{};
  };

  // What one write_some() or read_some() did.
  struct Progress {
    bool moved = false;     // bytes moved
    bool finished = false;  // the frame is whole: written, or read and verified
    std::optional<Broken> broken{};
  };

  // `keys` (under a secret) put a MAC in each direction in the checksum's place (frame_mac.hpp).
  Connection(detail::Socket socket, int peer, const Options& options,
             const std::optional<SessionKeys>& keys)
      : socket_(std::move(socket)),
        self_(options.rank),
        peer_(peer),
        checksum_(options.checksum),
        max_frame_bytes_(options.max_frame_bytes) {
    if (!keys) return;
    out_mac_.emplace(keys->send, FrameMac::Side::kSend, options.encrypt);
    in_mac_.emplace(keys->receive, FrameMac::Side::kReceive, options.encrypt);
    if (options.encrypt) sealed_ = std::make_unique<std::byte[]>(kChecksumAhead);
  }

  void set_non_blocking(detail::ErrorCode& ec) { socket_.non_blocking(true, ec); }
  int descriptor() { return socket_.native_handle(); }

  // Ends a connection whose stream is out of step; the descriptor stays open until the
  // destructor (Tcp::close() may be using it from another thread).
  void shut_down() noexcept {
    detail::ErrorCode ignored;
    socket_.shutdown(boost::asio::socket_base::shutdown_both, ignored);
  }

  // --- sending -------------------------------------------------------------------------------

  void start_send(const Send& send) {
    out_header_ = encode_header(send.header, send.payload.size());
    sent_ = 0;
    if (out_mac_) {
      out_mac_->begin(out_header_);
      hashed_ = 0;
      if (out_mac_->encrypts()) {
        seal_next(send.payload);
      } else if (send.payload.size() <= kChecksumAhead) {
        fold_sent(send.payload, send.payload.size());
      }
      return;
    }
    if (!checksum_) {
      out_trailer_ = {};
      hashed_ = send.payload.size();
      return;
    }
    const std::uint64_t seed = checksum_seed(out_header_.data());
    if (send.payload.size() <= kChecksumAhead) {
      detail::store_le(out_trailer_.data(), checksum(seed, send.payload));
      hashed_ = send.payload.size();
    } else {
      out_checksum_.reset(seed);
      hashed_ = 0;
    }
  }

  // One gathering write of what is left of the frame started for `send`.
  Progress write_some(const Send& send) {
    const std::size_t length = send.payload.size();
    const std::size_t payload_sent =
        std::min(length, sent_ > kHeaderBytes ? sent_ - kHeaderBytes : 0);
    // A long payload leaves a piece at a time, each folded into the checksum or MAC right
    // after the kernel's copy has read it (so from cache); the trailer follows the last.
    // Encrypting, each piece is sealed before it leaves, from `sealed_`.
    const std::byte* source = send.payload.data() + payload_sent;
    std::size_t payload_end =
        hashed_ == length ? length : std::min(length, payload_sent + kChecksumAhead);
    if (sealed_) {
      if (payload_sent == hashed_ && hashed_ < length) seal_next(send.payload);
      source = sealed_.get() + (payload_sent - sealed_from_);
      payload_end = hashed_;
    }
    // Header, payload and trailer from where they are, in one gathering write.
    std::array<boost::asio::const_buffer, 3> pieces;
    if (sent_ < kHeaderBytes) {
      pieces[0] = boost::asio::buffer(out_header_.data() + sent_, kHeaderBytes - sent_);
    }
    pieces[1] = boost::asio::buffer(source, payload_end - payload_sent);
    if (hashed_ == length) {
      const std::size_t trailer_sent =
          sent_ > kHeaderBytes + length ? sent_ - kHeaderBytes - length : 0;
      pieces[2] =
          boost::asio::buffer(out_trailer_.data() + trailer_sent, kTrailerBytes - trailer_sent);
    }
    detail::ErrorCode ec;
    const std::size_t written = socket_.write_some(pieces, ec);
    if (ec == boost::asio::error::would_block || ec == boost::asio::error::try_again) return {};
    if (ec) {
      return {.broken = connection_failure(
                  ec,
                  "sending " + describe(send.header, length) + ", " + std::to_string(sent_) +
                      " of " + std::to_string(kHeaderBytes + length + kTrailerBytes) +
                      " frame bytes written",
                  send.header.sequence)};
    }
    sent_ += written;
    const std::size_t now_sent = std::min(length, sent_ > kHeaderBytes ? sent_ - kHeaderBytes : 0);
    if (hashed_ < now_sent) fold_sent(send.payload, now_sent - hashed_);
    return {.moved = true, .finished = sent_ == kHeaderBytes + length + kTrailerBytes};
  }

  // Bytes of the frame being sent that have left, header and trailer included.
  std::size_t frame_bytes_written() const noexcept { return sent_; }

  // A failed transfer left the frame started for `send` with some of it written: kept, so that
  // write_farewell() can finish it (its payload is still the caller's) and the leave message
  // after it can be read.
  void cut_off(const Send& send) {
    if (sent_ > 0) cut_ = send;
  }

  // Finishes a frame cut off, then writes `frame` (a leave message); best effort until
  // `deadline`.
  void write_farewell(std::span<const std::byte> frame,
                      std::chrono::steady_clock::time_point deadline) {
    if (!socket_.is_open() || !finish_cut_frame(deadline)) return;
    std::size_t written = 0;
    while (written < frame.size() && std::chrono::steady_clock::now() < deadline) {
      detail::ErrorCode ec;
      written += socket_.write_some(
          boost::asio::buffer(frame.data() + written, frame.size() - written), ec);
      if (ec && ec != boost::asio::error::would_block && ec != boost::asio::error::try_again) {
        break;
      }
    }
  }

  // --- receiving -----------------------------------------------------------------------------

  // The next bytes are a frame's header.
  void start_receive() noexcept { stage_ = Stage::kHeader; }

  // Reads the frame `receive` expects as far as the bytes that have arrived allow.
  Progress read_some(const Receive& receive) {
    const std::size_t length = receive.payload.size();
    Progress progress;
    // One read, into `direct` first and the inbox after it.
    const auto fetch = [&](std::span<std::byte> direct, std::size_t& into_direct) {
      detail::ErrorCode ec;
      const Read result = read_into(direct, into_direct, ec);
      if (result == Read::kDone) progress.moved = true;
      if (result == Read::kFailed) {
        progress.broken = connection_failure(ec, receiving(receive), receive.expected.sequence);
      }
      return result;
    };
    while (true) {
      switch (stage_) {
        case Stage::kHeader: {
          if (inbox_.size() < kHeaderBytes) {
            std::size_t ignored = 0;
            if (fetch({}, ignored) != Read::kDone) return progress;
            continue;
          }
          std::string reason;
          if (const Farewell farewell = read_farewell(reason); farewell != Farewell::kNone) {
            if (farewell == Farewell::kComplete) {
              progress.broken = broken(left(reason));
              return progress;
            }
            std::size_t ignored = 0;
            if (fetch({}, ignored) != Read::kDone) return progress;
            continue;
          }
          if (auto refused = check_header(receive, inbox_.front())) {
            progress.broken = std::move(refused);
            return progress;
          }
          in_seed_ = checksum_ ? checksum_seed(inbox_.front()) : 0;
          if (in_mac_) {
            in_mac_->begin(std::span<const std::byte, kHeaderBytes>(inbox_.front(), kHeaderBytes));
          }
          inbox_.consume(kHeaderBytes);
          received_ = 0;
          in_length_ = length;
          in_streaming_ = false;
          in_digest_ = length == 0 && checksum_ ? checksum(in_seed_, {}) : 0;
          stage_ = Stage::kPayload;
          continue;
        }
        case Stage::kPayload: {
          // Folds bytes that just arrived into the checksum: in one call when they are the
          // whole payload, else in pieces.
          const auto arrived = [&](std::size_t bytes) {
            const auto piece = receive.payload.subspan(received_, bytes);
            if (in_mac_ && in_mac_->encrypts()) {
              in_mac_->open(piece);
            } else if (in_mac_) {
              in_mac_->update(piece);
            } else if (checksum_ && received_ == 0 && bytes == length) {
              in_digest_ = checksum(in_seed_, piece);
            } else if (checksum_) {
              if (!in_streaming_) in_checksum_.reset(in_seed_);
              in_streaming_ = true;
              in_checksum_.update(piece);
            }
            received_ += bytes;
          };
          if (received_ < length && inbox_.size() > 0) {
            const std::size_t bytes = std::min(inbox_.size(), length - received_);
            std::memcpy(receive.payload.data() + received_, inbox_.front(), bytes);
            inbox_.consume(bytes);
            arrived(bytes);
          }
          if (received_ == length) {
            stage_ = Stage::kTrailer;
            continue;
          }
          // At most kChecksumAhead at a time, so that the checksum reads what the kernel just
          // wrote while it is still in cache.
          const std::size_t direct = std::min(length - received_, kChecksumAhead);
          std::size_t into_payload = 0;
          if (fetch(receive.payload.subspan(received_, direct), into_payload) != Read::kDone) {
            return progress;
          }
          if (into_payload > 0) arrived(into_payload);
          continue;
        }
        case Stage::kTrailer: {
          if (inbox_.size() < kTrailerBytes) {
            std::size_t ignored = 0;
            if (fetch({}, ignored) != Read::kDone) return progress;
            continue;
          }
          const auto sent = detail::load_le<std::uint64_t>(inbox_.front());
          inbox_.consume(kTrailerBytes);
          // Made only for a frame refused: this runs for every frame.
          const auto from = [&] { return "rank " + std::to_string(peer_); };
          if (in_mac_ && !in_mac_->verify(sent)) {
            progress.broken = broken(
                "the frame from " + from() + " " + describe(receive.expected, length) +
                " fails its MAC: it was changed on the way, or " + from() + " did not send it");
            return progress;
          }
          const std::uint64_t computed = in_streaming_ ? in_checksum_.digest() : in_digest_;
          if (!in_mac_ && checksum_ && sent != computed) {
            progress.broken =
                broken("the frame from " + from() + " " + describe(receive.expected, length) +
                       " fails its checksum: the payload was corrupted in transit");
            return progress;
          }
          stage_ = Stage::kHeader;
          return {.moved = true, .finished = true};
        }
      }
    }
  }

  // wait_any: whether the next frame is whole in the inbox, or cannot be read (a header
  // check_header refuses, whatever its receive expects; an ended connection), after reading what
  // has arrived. The inbox grows, doubling with the bytes that came, to hold one whole frame.
  bool next_frame_arrived() {
    while (true) {
      std::size_t whole = kHeaderBytes;
      if (inbox_.size() >= kHeaderBytes) {
        const FrameHeader frame = decode_header(inbox_.front());
        if (frame.magic != kMagic || frame.version != kProtocolVersion ||
            frame.length > max_frame_bytes_) {
          return true;
        }
        whole = kHeaderBytes + static_cast<std::size_t>(frame.length) + kTrailerBytes;
        if (inbox_.size() >= whole) return true;
      }
      inbox_.compact();
      if (inbox_.size() == inbox_.capacity) {
        // Grows with the bytes that came, not with the length a header announces.
        inbox_.reserve(std::min(whole, 2 * inbox_.capacity));
      }
      detail::ErrorCode ec;
      std::size_t ignored = 0;
      const Read read = read_into({}, ignored, ec);
      if (read == Read::kWouldBlock) return false;
      if (read == Read::kFailed) return true;
    }
  }

  // The receive in progress, for a failure's or a warning's text.
  [[gnu::cold]] std::string receiving(const Receive& receive) const {
    const std::size_t arrived = stage_ == Stage::kHeader ? 0 : received_;
    return "receiving " + describe(receive.expected, receive.payload.size()) + ", " +
           std::to_string(arrived) + " payload bytes arrived";
  }

 private:
  // A payload of at most this many bytes is checksummed in one call before its first byte
  // leaves; a longer one leaves in writes of at most this many bytes, each checksummed right
  // after the kernel's copy has read it, while it is still in cache (the copy takes the misses
  // of a payload that is not, as it would anyway). Received pieces are checksummed the same way,
  // right after the kernel wrote them.
  static constexpr std::size_t kChecksumAhead = std::size_t{256} << 10;
  // Bytes read beyond the frame being received wait here for the next receive; a whole small
  // frame (header, payload, trailer) arrives in one read.
  static constexpr std::size_t kInboxBytes = std::size_t{64} << 10;

  enum class Stage { kHeader, kPayload, kTrailer };

  struct Inbox {
    std::unique_ptr<std::byte[]> data;
    std::size_t capacity = 0;  // kInboxBytes, or more while wait_any gathers a whole frame
    std::size_t begin = 0;
    std::size_t end = 0;

    std::size_t size() const { return end - begin; }
    const std::byte* front() const { return data.get() + begin; }
    void consume(std::size_t bytes) {
      begin += bytes;
      if (begin == end) begin = end = 0;
    }
    // Moves what is left to the front, so that the free space is as large as it can be.
    void compact() {
      if (!data) {
        data = std::make_unique<std::byte[]>(kInboxBytes);
        capacity = kInboxBytes;
      }
      if (begin == 0) return;
      std::memmove(data.get(), data.get() + begin, size());
      end -= begin;
      begin = 0;
    }
    // Room for `bytes` from the front (wait_any: one whole frame). The inbox keeps its size, as
    // the next frames of a serving connection are likely as long.
    void reserve(std::size_t bytes) {
      compact();
      if (bytes <= capacity) return;
      auto grown = std::make_unique<std::byte[]>(bytes);
      std::memcpy(grown.get(), data.get(), size());
      data = std::move(grown);
      capacity = bytes;
    }
  };

  // --- sending -------------------------------------------------------------------------------

  // Folds the next `piece` of the payload being sent into its checksum or MAC; the trailer is
  // ready when the whole payload is in.
  void fold_sent(std::span<const std::byte> payload, std::size_t piece) {
    const auto bytes = payload.subspan(hashed_, piece);
    if (out_mac_) {
      out_mac_->update(bytes);
    } else {
      out_checksum_.update(bytes);
    }
    hashed_ += piece;
    if (hashed_ == payload.size()) {
      detail::store_le(out_trailer_.data(), out_mac_ ? out_mac_->finish() : out_checksum_.digest());
    }
  }

  // Encrypting: the next piece of the payload being sent, into `sealed_`, once the one before it
  // has left; the trailer is ready when the whole payload is.
  void seal_next(std::span<const std::byte> payload) {
    const std::size_t piece = std::min(kChecksumAhead, payload.size() - hashed_);
    out_mac_->seal(payload.subspan(hashed_, piece), sealed_.get());
    sealed_from_ = hashed_;
    hashed_ += piece;
    if (hashed_ == payload.size()) detail::store_le(out_trailer_.data(), out_mac_->finish());
  }

  // Writes the rest of the frame a failed transfer cut off, if any; false if it cannot.
  bool finish_cut_frame(std::chrono::steady_clock::time_point deadline) {
    if (!cut_) return true;
    bool finished = false;
    while (!finished && std::chrono::steady_clock::now() < deadline) {
      const Progress progress = write_some(*cut_);
      if (progress.broken) break;
      finished = progress.finished;
      if (progress.moved) continue;
      // The peer may be stuck writing to this rank: read and drop what it sends, so that both
      // ends move.
      detail::ErrorCode ec;
      std::size_t ignored = 0;
      if (read_into({}, ignored, ec) == Read::kDone) {
        inbox_.consume(inbox_.size());
      } else {
        std::this_thread::yield();
      }
    }
    cut_.reset();
    return finished;
  }

  // --- receiving -----------------------------------------------------------------------------

  enum class Read { kDone, kWouldBlock, kFailed };

  // One read: into `direct` (the caller's payload) first, whatever follows into the inbox.
  Read read_into(std::span<std::byte> direct, std::size_t& into_direct, detail::ErrorCode& ec) {
    inbox_.compact();
    const std::array<boost::asio::mutable_buffer, 2> pieces{
        boost::asio::buffer(direct.data(), direct.size()),
        boost::asio::buffer(inbox_.data.get() + inbox_.end, inbox_.capacity - inbox_.end)};
    const std::size_t read = socket_.read_some(pieces, ec);
    if (ec == boost::asio::error::would_block || ec == boost::asio::error::try_again) {
      return Read::kWouldBlock;
    }
    if (ec) return Read::kFailed;
    into_direct = std::min(read, direct.size());
    inbox_.end += read - into_direct;
    return Read::kDone;
  }

  // Everything about an incoming header is checked here, before a byte of its payload is
  // taken: the magic, the version, the length against max_frame_bytes, then header and length
  // against the receive's.
  std::optional<Broken> check_header(const Receive& receive, const std::byte* bytes) {
    const FrameHeader frame = decode_header(bytes);
    // The message's parts, made only for a refused header: this runs for every frame.
    const auto from = [&] { return "rank " + std::to_string(peer_); };
    const std::uint64_t sequence = receive.expected.sequence;
    const auto during = [&] { return " during sequence " + std::to_string(sequence); };
    if (frame.magic != kMagic) {
      return broken(from() + " sent bytes that are not a cohort frame" + during() +
                    " (the stream is out of step)");
    }
    if (frame.version != kProtocolVersion) {
      return broken(from() + " sent a frame of protocol version " + std::to_string(frame.version) +
                    during() + ", this is version " + std::to_string(kProtocolVersion));
    }
    if (frame.length > max_frame_bytes_) {
      return broken(from() + " announced a frame of " + std::to_string(frame.length) + " bytes" +
                    during() + ", more than max_frame_bytes = " + std::to_string(max_frame_bytes_) +
                    "; refused before reading it");
    }
    const std::size_t length = receive.payload.size();
    if (frame.header != receive.expected || frame.length != length) {
      HeaderMismatch mismatch(self_, peer_, receive.expected, length, frame.header,
                              static_cast<std::size_t>(frame.length));
      Broken refused = broken(std::string(mismatch.detail()));
      refused.mismatch = std::move(mismatch);
      return refused;
    }
    return std::nullopt;
  }

  // --- farewells and failures ----------------------------------------------------------------

  // Whether the inbox starts with a leave message (Tcp::leave), and its reason when it is whole.
  enum class Farewell { kNone, kPartial, kComplete };
  Farewell read_farewell(std::string& reason) const {
    if (inbox_.size() < kHeaderBytes) return Farewell::kNone;
    const FrameHeader frame = decode_header(inbox_.front());
    if (frame.magic != kMagic || frame.header.type != setup_type::kAbort ||
        frame.length > kLeaveReasonBytes) {
      return Farewell::kNone;
    }
    if (inbox_.size() < kHeaderBytes + frame.length + kTrailerBytes) return Farewell::kPartial;
    reason = decode_text({inbox_.front() + kHeaderBytes, static_cast<std::size_t>(frame.length)});
    return Farewell::kComplete;
  }

  std::string left(const std::string& reason) const {
    return "rank " + std::to_string(peer_) + " left: " + quote_peer_text(reason);
  }

  // A peer that closed may have said why first (Tcp::leave): its message is already in this
  // socket's receive queue, ahead of the close. The frames before it (the rest of one being
  // received, whole ones not yet asked for) are skipped to reach it: the transfer fails either
  // way. Bounded by kLeaveWait.
  std::optional<std::string> farewell() {
    std::size_t skip = stage_ == Stage::kHeader    ? 0
                       : stage_ == Stage::kPayload ? in_length_ - received_ + kTrailerBytes
                                                   : kTrailerBytes;
    const auto deadline = std::chrono::steady_clock::now() + kLeaveWait;
    std::string reason;
    while (std::chrono::steady_clock::now() < deadline) {
      const std::size_t skipped = std::min(skip, inbox_.size());
      inbox_.consume(skipped);
      skip -= skipped;
      if (skip == 0 && inbox_.size() >= kHeaderBytes) {
        const Farewell farewell = read_farewell(reason);
        if (farewell == Farewell::kComplete) return reason;
        if (farewell == Farewell::kNone) {
          // A data frame the peer finished before it left: the farewell may follow it.
          const FrameHeader frame = decode_header(inbox_.front());
          if (frame.magic != kMagic || frame.length > max_frame_bytes_) return std::nullopt;
          skip = kHeaderBytes + frame.length + kTrailerBytes;
          continue;
        }
      }
      detail::ErrorCode ec;
      std::size_t ignored = 0;
      const Read read = read_into({}, ignored, ec);
      if (read == Read::kFailed) return std::nullopt;
      if (read == Read::kWouldBlock) std::this_thread::yield();
    }
    return std::nullopt;
  }

  // The failure paths below build messages only when a transfer fails: compiled for size.
  // A failure of the connection, from Asio's error code.
  [[gnu::cold]] Broken connection_failure(const detail::ErrorCode& ec, const std::string& doing,
                                          std::uint64_t sequence) {
    if (auto reason = farewell()) return broken(left(*reason));
    const std::string peer = "rank " + std::to_string(peer_);
    const std::string during = " during sequence " + std::to_string(sequence);
    if (ec == boost::asio::error::eof) {
      return broken(peer + " closed the connection" + during + " (" + doing + ")");
    }
    if (detail::is_closed(ec)) {
      return broken(peer + " closed the connection" + during + " (" + doing + ": " + ec.message() +
                    ")");
    }
    return broken("the connection to " + peer + " failed" + during + " (" + doing +
                  "): " + ec.message());
  }

  [[gnu::cold]] Broken broken(std::string what) {
    shut_down();
    return {std::move(what)};
  }

  detail::Socket socket_;
  int self_;  // this rank, and the peer at the other end
  int peer_;
  bool checksum_;
  std::size_t max_frame_bytes_;
  // Outgoing: frame bytes written, payload bytes folded into the checksum.
  std::size_t sent_ = 0;
  std::size_t hashed_ = 0;
  std::optional<Send> cut_;
  HeaderBytes out_header_{};
  std::array<std::byte, kTrailerBytes> out_trailer_{};
  StreamingChecksum out_checksum_;
  // Under a secret, the MAC of each direction takes the checksum's place (frame_mac.hpp).
  std::optional<FrameMac> out_mac_;
  std::optional<FrameMac> in_mac_;
  // Encrypting: the ciphertext of payload bytes [sealed_from_, hashed_) of the send being
  // written, at most kChecksumAhead of them.
  std::unique_ptr<std::byte[]> sealed_;
  std::size_t sealed_from_ = 0;
  // Incoming: payload bytes arrived.
  Stage stage_ = Stage::kHeader;
  std::size_t received_ = 0;
  std::size_t in_length_ = 0;  // payload bytes of the frame being received
  std::uint64_t in_seed_ = 0;
  std::uint64_t in_digest_ = 0;  // when the payload was checksummed in one call
  bool in_streaming_ = false;    // when it is checksummed in pieces, by in_checksum_
  StreamingChecksum in_checksum_;
  Inbox inbox_;
};

}  // namespace cohort::transport::tcp
