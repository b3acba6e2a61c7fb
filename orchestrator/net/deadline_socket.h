// A TCP socket whose every synchronous read and write ends at a deadline: what the dashboard's
// connections (orchestrator/dashboard) and the alerter's webhook posts (orchestrator/alerts) read
// and write through, plain or under TLS (asio::ssl::stream<DeadlineSocket&>), with Beast's
// synchronous http::read and http::write.
#ifndef ABLATE_ORCHESTRATOR_NET_DEADLINE_SOCKET_H_
#define ABLATE_ORCHESTRATOR_NET_DEADLINE_SOCKET_H_

#include <poll.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/system/system_error.hpp>
#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace ablate {

// The throwing read_some/write_some that Asio's SyncReadStream and SyncWriteStream also require,
// from a stream's boost::system::error_code ones (Stream declares `using
// ThrowingOverloads<Stream>::...`).
template <class Stream>
struct ThrowingOverloads {
  template <class MutableBuffers>
  size_t read_some(const MutableBuffers& buffers) {
    return Throwing([&](boost::system::error_code& ec) {
      return static_cast<Stream*>(this)->read_some(buffers, ec);
    });
  }
  template <class ConstBuffers>
  size_t write_some(const ConstBuffers& buffers) {
    return Throwing([&](boost::system::error_code& ec) {
      return static_cast<Stream*>(this)->write_some(buffers, ec);
    });
  }

 private:
  // What `op(ec)` transferred; its error, if any, thrown as boost::system::system_error.
  template <class Op>
  static size_t Throwing(const Op& op) {
    boost::system::error_code ec;
    const size_t n = op(ec);
    if (ec) throw boost::system::system_error(ec);
    return n;
  }
};

// A connected socket as a SyncReadStream and SyncWriteStream whose every read_some and write_some
// fails with boost::asio::error::timed_out once the deadline has passed. The socket is
// non-blocking: an operation that would block waits in poll() for at most the time left, so a
// client that trickles bytes, or stops reading, holds its thread no longer than the deadline.
// (SO_RCVTIMEO would not do: asio's synchronous operations go back to polling forever after
// EAGAIN.) shutdown(2) on the socket (the dashboard's Stop()) wakes the wait.
class DeadlineSocket : public ThrowingOverloads<DeadlineSocket> {
 public:
  using ThrowingOverloads::read_some;
  using ThrowingOverloads::write_some;
  using lowest_layer_type = boost::asio::ip::tcp::socket::lowest_layer_type;
  using executor_type = boost::asio::ip::tcp::socket::executor_type;

  // `socket` is not owned. Makes it non-blocking.
  explicit DeadlineSocket(boost::asio::ip::tcp::socket* socket);

  void set_deadline(absl::Time deadline) { deadline_ = deadline; }
  int native_handle() { return socket_->native_handle(); }
  lowest_layer_type& lowest_layer() { return socket_->lowest_layer(); }
  executor_type get_executor() { return socket_->get_executor(); }

  template <class MutableBuffers>
  size_t read_some(const MutableBuffers& buffers, boost::system::error_code& ec) {
    return Retry(POLLIN, ec, [&] { return socket_->read_some(buffers, ec); });
  }
  template <class ConstBuffers>
  size_t write_some(const ConstBuffers& buffers, boost::system::error_code& ec) {
    return Retry(POLLOUT, ec, [&] { return socket_->write_some(buffers, ec); });
  }

  // Waits until the socket is ready for `events` (POLLIN, POLLOUT); false when the deadline
  // passed first.
  bool Wait(short events);
  // The client has closed or reset the connection (seen without reading: its FIN, TLS or not).
  bool PeerClosed();

 private:
  // Calls `op` until it does not say would_block, waiting for `events` in between.
  template <class Op>
  size_t Retry(short events, boost::system::error_code& ec, Op op) {
    while (true) {
      const size_t n = op();
      if (ec != boost::asio::error::would_block && ec != boost::asio::error::try_again) return n;
      if (!Wait(events)) {
        ec = boost::asio::error::timed_out;
        return 0;
      }
    }
  }

  boost::asio::ip::tcp::socket* const socket_;
  absl::Time deadline_ = absl::InfiniteFuture();
};

// Connects `socket` (closed) to `host`:`port` before `deadline`, trying each address the name
// resolves to. DeadlineExceeded when the deadline passes first (a peer that never answers the
// SYN); Unavailable naming the address and the error otherwise. The name is resolved with
// getaddrinfo, which the deadline does not bound (a literal address or /etc/hosts never waits).
absl::Status ConnectBefore(boost::asio::ip::tcp::socket* socket, const std::string& host, int port,
                           absl::Time deadline);

}  // namespace ablate

#endif  // ABLATE_ORCHESTRATOR_NET_DEADLINE_SOCKET_H_
