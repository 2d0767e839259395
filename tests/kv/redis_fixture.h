// A real redis-server (Debian's) for the remote tier's tests: started on a free loopback port
// with a private temp directory and no persistence, stopped (or paused, or killed) by the test.
#pragma once
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kv_test_util.h"

namespace cf::test {

inline int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw std::runtime_error("no free port");
  ::close(fd);
  return ntohs(a.sin_port);
}

class RedisServer {
 public:
  // extra: more redis-server arguments, e.g. {"--maxmemory", "2mb"}.
  explicit RedisServer(std::vector<std::string> extra = {}, int port = 0)
      : port_(port ? port : free_loopback_port()), extra_(std::move(extra)) {
    start();
  }
  ~RedisServer() { stop(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  int port() const { return port_; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

  void start() {
    std::vector<std::string> args{"redis-server", "--port", std::to_string(port_), "--bind", "127.0.0.1",
                                  "--save", "", "--appendonly", "no", "--dir", dir_.path(), "--loglevel", "warning",
                                  "--logfile", dir_.path() + "/redis.log"};
    args.insert(args.end(), extra_.begin(), extra_.end());
    pid_ = ::fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execvp("redis-server", argv.data());
      ::_exit(127);  // not installed: scripts/setup.sh installs Debian's redis-server
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("redis-server exited at start (is it installed? scripts/setup.sh)");
      }
      if (ping()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    throw std::runtime_error("redis-server did not answer in 10 s");
  }

  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);
    ::kill(pid_, SIGKILL);  // no persistence configured: nothing to lose
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  void pause() { ::kill(pid_, SIGSTOP); }
  void resume() { ::kill(pid_, SIGCONT); }

  bool ping() {
    redisReply* r = command({"PING"});
    const bool ok = r && r->type == REDIS_REPLY_STATUS;
    if (r) freeReplyObject(r);
    return ok;
  }

  // One command on a fresh connection; the caller frees the reply (nullptr on failure).
  redisReply* command(const std::vector<std::string>& args) {
    timeval tv{1, 0};
    redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, tv);
    if (!c || c->err) {
      if (c) redisFree(c);
      return nullptr;
    }
    redisSetTimeout(c, tv);
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    auto* r = static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(args.size()), argv.data(), lens.data()));
    redisFree(c);
    return r;
  }
  // The reply as text (strings, status, errors) or number (integers); "" for nil.
  std::string text(const std::vector<std::string>& args) {
    redisReply* r = command(args);
    std::string s;
    if (r && r->type == REDIS_REPLY_INTEGER) s = std::to_string(r->integer);
    else if (r && r->str) s.assign(r->str, r->len);
    if (r) freeReplyObject(r);
    return s;
  }
  std::vector<std::string> keys(const std::string& pattern) {
    redisReply* r = command({"KEYS", pattern});
    std::vector<std::string> out;
    if (r && r->type == REDIS_REPLY_ARRAY)
      for (size_t i = 0; i < r->elements; ++i) out.emplace_back(r->element[i]->str, r->element[i]->len);
    if (r) freeReplyObject(r);
    return out;
  }

 private:
  int port_;
  std::vector<std::string> extra_;
  TempDir dir_;
  pid_t pid_ = -1;
};

}  // namespace cf::test
