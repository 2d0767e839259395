// Connection limits for `chunkfuse serve` (issue 17, items 1-2): what cpp-httplib 0.11.4
// (Debian 12) does not offer, added around it without forking it.
//
// What httplib 0.11.4 offers and we use: set_read_timeout / set_write_timeout (per recv /
// send call, not per request), set_keep_alive_timeout (idle wait between requests),
// set_payload_max_length (checked against Content-Length only: a chunked body or one without
// a length is buffered without bound, issue 17 hole 1), new_task_queue (a custom pool; its
// ThreadPool has no queue bound in 0.11) and content-reader handlers (the body in pieces).
// What it lacks: a deadline for a whole request (a client trickling one header byte every
// few seconds holds a thread forever, hole 2) and a cap on open connections.
//
// GuardedServer adds both. Every connection runs on its own thread of a fixed pool of
// `max_connections` threads (thread per connection is httplib's model); a connection past
// that is answered 503 at once on the accept thread and closed, so it never waits in an
// unbounded queue. A watchdog gives each connection a deadline: from the end of its last
// response (or its accept) a complete request (line, headers and body) must arrive within
// keep_alive_timeout + request_timeout, else the socket is shut down (counted as a timeout).
// While a handler runs (model work, streaming) there is no deadline: the engine's queue
// bounds that, and httplib's write timeout bounds a reader that stops reading a stream.
//
// Deviation from a real event loop (nginx): each slow connection still costs one thread
// until its deadline; the cap turns a flood into clear 503s instead of a stall. README
// (RELIABILITY) shows the internet-facing setup with a proxy in front.
#pragma once
#include <httplib.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <string>
#include <thread>

namespace cf {

struct ConnectionLimits {
  size_t max_connections = 256;  // open connections (one thread each); more get 503
  int request_timeout_s = 10;    // a request's line, headers and body must arrive within this
  int keep_alive_timeout_s = 5;  // idle wait for the next request on a kept-alive connection
  int write_timeout_s = 10;      // one send() to a client that does not read
};

struct ConnectionCounters {
  uint64_t refused = 0;   // connections answered 503 at the cap
  uint64_t timeouts = 0;  // connections shut down at their deadline
  uint64_t oversized_headers = 0;  // connections shut down past the header-phase byte budget
  uint64_t open = 0;      // connections open now
};

class GuardedServer : public httplib::Server {
 public:
  explicit GuardedServer(ConnectionLimits limits);
  ~GuardedServer() override;

  // Called on a connection's thread (handlers, logger). headers_read(): the request line and
  // headers are parsed (the header-phase byte budget ends). request_read(): the request is in,
  // no deadline while it is handled. response_done(): the response is written; the next
  // request must come within the idle + request time. close_after_response(): the client
  // sent bytes we will not read (a refused body); the connection ends after this response.
  static void headers_read();
  static void request_read();
  static void response_done();
  static void close_after_response();
  // Called on a connection's thread while its request is handled: whether the client has
  // closed the connection (end of stream or an error on the socket, seen without reading
  // anything; issue 58 item 4). A client that pipelined its next request is not gone.
  static bool client_gone();

  // After bind: a listen backlog of max_connections (httplib's is 5).
  void widen_backlog();

  ConnectionCounters counters() const;
  const ConnectionLimits& limits() const { return limits_; }

 private:
  struct Conn {
    int watch_fd = -1;                 // a dup of the socket: shutdown() reaches it, its number
                                       // cannot be reused by another connection meanwhile
    std::atomic<int64_t> deadline_ms{0};  // steady clock; 0: none
    int64_t idle_window_ms = 0;        // keep-alive wait + request time
    std::atomic<bool> in_headers{true};   // reading a request line and headers
    std::atomic<uint64_t> phase_start_bytes{0};  // TCP bytes received when the header phase began
    bool close_after = false;          // touched only by the connection's own thread
    bool timed_out = false;            // under mu_
  };
  class TaskQueue;

  // Bytes a client may send while its request line and headers are still unparsed. httplib
  // buffers a line without a newline, and any number of header lines, without bound; the
  // watchdog closes a connection past this (TCP_INFO's byte count, polled every 100 ms).
  // Generous so that a body sent right behind the headers never trips it.
  static constexpr uint64_t kHeaderPhaseBytes = uint64_t{16} << 20;
  static constexpr int64_t kLingerMs = 2000;  // how long a refused body is drained (discarded)
  static void linger_and_close(int fd);
  bool process_and_close_socket(socket_t sock) override;
  void refuse(socket_t sock);
  void watchdog();

  static thread_local Conn* current_;  // the connection this thread serves

  ConnectionLimits limits_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::list<Conn> conns_;
  bool stopping_ = false;
  std::atomic<uint64_t> refused_{0}, timeouts_{0}, oversized_{0};
  std::thread watchdog_;
};

// Whether the request carries a body (a Transfer-Encoding, or a Content-Length other than 0).
bool request_has_body(const httplib::Request& req);

// Reads a POST body through httplib's content reader, never holding more than max_bytes:
// a declared Content-Length over the limit is refused before reading, any other encoding
// (chunked, none) as soon as it passes the limit. Throws RequestError 413 (too large) or 400
// (the body could not be read) and marks the connection to close.
std::string read_body_bounded(const httplib::Request& req, const httplib::ContentReader& reader, size_t max_bytes);

}  // namespace cf
