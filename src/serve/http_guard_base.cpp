// The only uses of private members of httplib::Server (0.11.4): GuardedServer overrides the
// virtual process_and_close_socket and must run the library's own version inside it, and it
// widens the listen backlog, which the library fixes at 5 at compile time (a burst of
// connections would otherwise wait in SYN retries before the cap can even see them). This
// file alone is compiled with -fno-access-control (CMakeLists.txt) so that no other code can
// reach httplib's internals by accident.
#include <httplib.h>

namespace cf::detail {

bool httplib_process_and_close_socket(httplib::Server& svr, int sock) {
  return svr.httplib::Server::process_and_close_socket(sock);
}

int httplib_listen_socket(const httplib::Server& svr) { return svr.svr_sock_; }

}  // namespace cf::detail
