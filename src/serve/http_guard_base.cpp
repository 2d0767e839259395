// The only uses of private members of httplib::Server (0.11.4): GuardedServer overrides the
// virtual process_and_close_socket and must run the library's own version inside it, and it
// widens the listen backlog, which the library fixes at 5 at compile time (a burst of
// connections would otherwise wait in SYN retries before the cap can even see them). This
// file alone is compiled with -fno-access-control (CMakeLists.txt) so that no other code can
// reach httplib's internals by accident.
#include <httplib.h>

#include <string_view>

// Both members below are private, so a new cpp-httplib may rename, retype or drop them, or
// change what process_and_close_socket does, without any compile error in code that can see
// through access control. An upgrade therefore fails here, at build time: re-check that
// (1) Server::process_and_close_socket(socket_t) is still the virtual that the accept loop
// calls once per accepted socket, reads/writes the whole keep-alive connection and closes it;
// (2) Server::svr_sock_ is still the listening socket (-1 before listen / after stop); and
// (3) CPPHTTPLIB_LISTEN_BACKLOG is still the compile-time backlog. Then run
// tests/serve_e2e (test_hostile*.py: the connection cap and deadlines) and update the version.
static_assert(std::string_view(CPPHTTPLIB_VERSION) == "0.11.4",
              "http_guard_base.cpp reaches private members of httplib::Server written against cpp-httplib "
              "0.11.4: re-check process_and_close_socket and svr_sock_ in the new httplib.h (see the comment "
              "above), then update this version");

namespace cf::detail {

bool httplib_process_and_close_socket(httplib::Server& svr, int sock) {
  return svr.httplib::Server::process_and_close_socket(sock);
}

int httplib_listen_socket(const httplib::Server& svr) { return svr.svr_sock_; }

}  // namespace cf::detail
