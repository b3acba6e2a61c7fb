#include "orchestrator/net/deadline_socket.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace ablate {

DeadlineSocket::DeadlineSocket(boost::asio::ip::tcp::socket* socket) : socket_(socket) {
  boost::system::error_code ec;
  socket_->non_blocking(true, ec);  // fails only on a closed socket: its reads fail anyway
}

bool DeadlineSocket::Wait(short events) {
  while (true) {
    const absl::Duration left = deadline_ - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    // Rounded up: a wait of 0 ms would spin for the last fraction of a millisecond.
    const int64_t ms = std::min<int64_t>(
        absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), 60 * 1000);
    pollfd p{socket_->native_handle(), events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(ms));
    if (n > 0) return true;  // ready, or an error / hang-up the next operation reports
    if (n < 0 && errno != EINTR) return true;  // let the operation report it
  }
}

bool DeadlineSocket::PeerClosed() {
  pollfd p{socket_->native_handle(), POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

absl::Status ConnectBefore(boost::asio::ip::tcp::socket* socket, const std::string& host, int port,
                           absl::Time deadline) {
  namespace asio = boost::asio;
  using tcp = asio::ip::tcp;
  boost::system::error_code ec;
  tcp::resolver resolver(socket->get_executor());
  const tcp::resolver::results_type addresses =
      resolver.resolve(host, std::to_string(port), tcp::resolver::numeric_service, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", host, ": ", ec.message()));
  }
  std::string last = "no address";
  for (const tcp::endpoint& endpoint : addresses) {
    socket->close(ec);
    socket->open(endpoint.protocol(), ec);
    if (ec) {
      last = ec.message();
      continue;
    }
    DeadlineSocket timed(socket);  // non-blocking: connect returns at once
    timed.set_deadline(deadline);
    socket->connect(endpoint, ec);
    if (ec == asio::error::in_progress || ec == asio::error::would_block) {
      if (!timed.Wait(POLLOUT)) {
        socket->close(ec);
        return absl::DeadlineExceededError(
            absl::StrCat("no answer from ", host, ":", port, " in time (connecting)"));
      }
      int error = 0;
      socklen_t size = sizeof(error);
      ::getsockopt(socket->native_handle(), SOL_SOCKET, SO_ERROR, &error, &size);
      ec = boost::system::error_code(error, boost::system::system_category());
    }
    if (!ec) return absl::OkStatus();
    last = ec.message();
  }
  socket->close(ec);
  return absl::UnavailableError(absl::StrCat("cannot connect to ", host, ":", port, ": ", last));
}

}  // namespace ablate
