// TCP_INFO's received-byte count for GuardedServer's header budget. A file of its own because
// glibc's <netinet/tcp.h> (which httplib includes) has an older struct tcp_info without
// tcpi_bytes_received, and it cannot be included together with the kernel's <linux/tcp.h>.
#include <linux/tcp.h>
#include <netinet/in.h>  // IPPROTO_TCP
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>

namespace cf::detail {

uint64_t tcp_bytes_received(int fd) {  // 0 when unknown (old kernel, not TCP)
  tcp_info info{};
  socklen_t len = sizeof info;
  if (fd < 0 || ::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return 0;
  if (len < offsetof(tcp_info, tcpi_bytes_received) + sizeof info.tcpi_bytes_received) return 0;
  return info.tcpi_bytes_received;
}

}  // namespace cf::detail
