// GuardedServer: connection cap and per-request deadlines around cpp-httplib (see http_guard.h).
#include "serve/http_guard.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>

#include "base/clock.h"
#include "serve/request.h"

namespace cf {

namespace detail {
bool httplib_process_and_close_socket(httplib::Server& svr, int sock);  // http_guard_base.cpp
int httplib_listen_socket(const httplib::Server& svr);                   // http_guard_base.cpp
uint64_t tcp_bytes_received(int fd);                                     // http_guard_tcp.cpp
}
using detail::tcp_bytes_received;

namespace {

// Ends a connection for good: shutdown wakes its thread (recv sees end-of-file), and a zero
// linger makes the final close send a reset, so a client blocked sending into a full window
// learns at once instead of hanging on a half-closed socket.
void abort_connection(int fd) {
  const linger no_linger{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &no_linger, sizeof no_linger);
  ::shutdown(fd, SHUT_RDWR);
}

// Set on the accept thread while it runs a connection it refuses (see TaskQueue::enqueue).
thread_local bool t_refusing = false;

// The whole 503 answer, built once: sent with one non-blocking send.
const std::string& refusal() {
  static const std::string r = [] {
    const std::string body =
        R"({"error":{"message":"too many open connections; retry later","type":"server_error","param":null,)"
        R"("code":"too_many_connections"}})";
    return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
           "Retry-After: 1\r\nContent-Length: " +
           std::to_string(body.size()) + "\r\n\r\n" + body;
  }();
  return r;
}

}  // namespace

thread_local GuardedServer::Conn* GuardedServer::current_ = nullptr;

// One thread per open connection, at most `cap` of them. Past the cap the job (httplib's call
// of process_and_close_socket) runs at once on the accept thread with t_refusing set, which
// answers 503 without reading and closes: nothing waits in an unbounded queue.
class GuardedServer::TaskQueue : public httplib::TaskQueue {
 public:
  explicit TaskQueue(size_t cap) : cap_(cap), pool_(cap) {}
  void enqueue(std::function<void()> fn) override {
    if (busy_.load() >= cap_) {
      t_refusing = true;
      fn();
      t_refusing = false;
      return;
    }
    ++busy_;
    pool_.enqueue([this, fn = std::move(fn)] {
      fn();
      --busy_;
    });
  }
  void shutdown() override { pool_.shutdown(); }

 private:
  const size_t cap_;
  std::atomic<size_t> busy_{0};
  httplib::ThreadPool pool_;
};

GuardedServer::GuardedServer(ConnectionLimits limits) : limits_(limits) {
  if (limits_.max_connections == 0) limits_.max_connections = 1;
  const size_t cap = limits_.max_connections;
  new_task_queue = [cap] { return new TaskQueue(cap); };
  // httplib's own per-call timeouts stay as a second line: one recv may not block longer
  // than the whole request may take.
  set_read_timeout(limits_.request_timeout_s, 0);
  set_write_timeout(limits_.write_timeout_s, 0);
  set_keep_alive_timeout(limits_.keep_alive_timeout_s);
  watchdog_ = std::thread([this] { watchdog(); });
}

GuardedServer::~GuardedServer() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  watchdog_.join();
}

void GuardedServer::widen_backlog() {
  const int fd = detail::httplib_listen_socket(*this);
  if (fd >= 0) ::listen(fd, static_cast<int>(std::min<size_t>(limits_.max_connections, 4096)));
}

void GuardedServer::refuse(socket_t sock) {
  ++refused_;
  // Non-blocking: the accept thread must never wait on this client.
  (void)::send(sock, refusal().data(), refusal().size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
}

bool GuardedServer::process_and_close_socket(socket_t sock) {
  if (t_refusing) {
    refuse(sock);
    return false;
  }
  std::list<Conn>::iterator it;
  {
    std::lock_guard lk(mu_);
    it = conns_.emplace(conns_.end());
    it->watch_fd = ::dup(sock);  // -1 (out of descriptors): this connection just has no deadline
    it->idle_window_ms = 1000 * int64_t{limits_.keep_alive_timeout_s + limits_.request_timeout_s};
    it->deadline_ms = now_whole_ms() + it->idle_window_ms;
  }
  current_ = &*it;
  const bool ok = detail::httplib_process_and_close_socket(*this, sock);
  current_ = nullptr;
  std::lock_guard lk(mu_);
  if (it->watch_fd >= 0) ::close(it->watch_fd);
  conns_.erase(it);
  return ok;
}

bool GuardedServer::client_gone() {
  const Conn* c = current_;
  if (!c || c->watch_fd < 0) return false;
  pollfd p{c->watch_fd, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLERR | POLLHUP)) return true;
  char byte;
  const ssize_t n = ::recv(c->watch_fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

void GuardedServer::watchdog() {
  std::unique_lock lk(mu_);
  while (!stopping_) {
    cv_.wait_for(lk, std::chrono::milliseconds(100));
    const int64_t now = now_whole_ms();
    for (auto& c : conns_) {
      if (c.timed_out || c.watch_fd < 0) continue;
      const int64_t d = c.deadline_ms.load();
      const bool late = d != 0 && d <= now;
      const bool oversized =
          !late && c.in_headers && tcp_bytes_received(c.watch_fd) - c.phase_start_bytes > kHeaderPhaseBytes;
      if (!late && !oversized) continue;
      abort_connection(c.watch_fd);
      c.timed_out = true;
      ++(late ? timeouts_ : oversized_);
    }
  }
}

void GuardedServer::headers_read() {
  if (current_) current_->in_headers = false;
}

void GuardedServer::request_read() {
  if (current_) current_->deadline_ms = 0;
}

void GuardedServer::response_done() {
  Conn* c = current_;
  if (!c) return;
  if (c->close_after && c->watch_fd >= 0) {
    c->close_after = false;
    linger_and_close(c->watch_fd);
  }
  c->phase_start_bytes = tcp_bytes_received(c->watch_fd);
  c->in_headers = true;
  c->deadline_ms = now_whole_ms() + c->idle_window_ms;
}

void GuardedServer::linger_and_close(int fd) {
  // The response is written but the client may still be sending the body we refused. Closing
  // now would answer its next segment with a reset, which can destroy our response before the
  // client reads it. So, as nginx's lingering close does: end our side (FIN after the
  // response), read and discard for a short, bounded while, then abort: httplib's next
  // keep-alive wait sees end-of-file and closes, and a client still sending gets a reset. Memory stays at
  // one small buffer whatever the client sends.
  ::shutdown(fd, SHUT_WR);
  char buf[16384];
  const int64_t until = now_whole_ms() + kLingerMs;
  for (int64_t now = now_whole_ms(); now < until; now = now_whole_ms()) {
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(until - now, 100)));
    if (r < 0 && errno != EINTR) break;
    if (r <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) break;
  }
  abort_connection(fd);
}

void GuardedServer::close_after_response() {
  if (current_) current_->close_after = true;
}

ConnectionCounters GuardedServer::counters() const {
  std::lock_guard lk(mu_);
  return ConnectionCounters{refused_.load(), timeouts_.load(), oversized_.load(), conns_.size()};
}

bool request_has_body(const httplib::Request& req) {
  return req.has_header("Transfer-Encoding") ||
         (req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0");
}

std::string read_body_bounded(const httplib::Request& req, const httplib::ContentReader& reader, size_t max_bytes) {
  auto too_large = [&] {
    GuardedServer::close_after_response();
    return invalid_request("request body larger than the limit of " + std::to_string(max_bytes) + " bytes (--max-body)", "", 413);
  };
  if (req.has_header("Content-Length")) {
    const std::string v = req.get_header_value("Content-Length");
    // Digits only; a length too long to parse is too large.
    if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos) {
      GuardedServer::close_after_response();
      throw invalid_request("malformed Content-Length");
    }
    if (v.size() > 18 || std::stoull(v) > max_bytes) throw too_large();
  }
  std::string body;
  bool over = false;
  const bool ok = reader([&](const char* data, size_t n) {
    if (n > max_bytes - body.size()) {
      over = true;
      return false;
    }
    body.append(data, n);
    return true;
  });
  if (over) throw too_large();
  if (!ok) {
    GuardedServer::close_after_response();
    throw invalid_request("the request body could not be read (malformed or cut off)");
  }
  return body;
}

}  // namespace cf
