#include "apps/remote_options.h"

namespace cf::apps {

void add_remote_options(CLI::App& cmd, RemoteArgs& a) {
  cmd.add_option("--remote", a.url,
                 "shared chunk-cache tier below memory and disk: redis://host:port[/db] (Redis, Valkey); needs "
                 "--store-key-file");
  cmd.add_option("--remote-connect-timeout-ms", a.tier.connect_timeout_ms, "connect timeout of the remote tier")
      ->check(CLI::Range(1, 600000))
      ->capture_default_str();
  cmd.add_option("--remote-timeout-ms", a.tier.command_timeout_ms,
                 "command timeout of the remote tier (a slower read is a miss)")
      ->check(CLI::Range(1, 600000))
      ->capture_default_str();
  cmd.add_option("--remote-pool", a.tier.pool_size, "connections to the remote tier at most")
      ->check(CLI::Range(size_t{1}, size_t{256}))
      ->capture_default_str();
  cmd.add_option("--remote-retry-ms", a.tier.retry_ms, "after a failed connect, wait this long before the next")
      ->check(CLI::Range(1, 600000))
      ->capture_default_str();
  cmd.add_option("--remote-queue", a.tier.queue_entries, "pending remote writes at most; more are dropped")
      ->check(CLI::Range(size_t{1}, size_t{1} << 20))
      ->capture_default_str();
}

void add_store_key_option(CLI::App& cmd, std::string& key_file) {
  cmd.add_option("--store-key-file", key_file,
                 "secret key file, the same on every replica and for `chunks precompute`: 64 hex digits (or at "
                 "least 32 raw bytes), a regular file owned by you or root with mode 600, made by `head -c 32 "
                 "/dev/urandom | xxd -p -c 64 > KEY && chmod 600 KEY`. Cache entries carry an HMAC-SHA256 and "
                 "entries without a valid one are never served; required with --remote")
      ->check(CLI::ExistingFile);
}

std::optional<RemoteTierOptions> remote_tier_options(const RemoteArgs& a) {
  if (a.url.empty()) return std::nullopt;
  RemoteTierOptions o = a.tier;
  o.url = a.url;
  parse_redis_url(o.url);  // a bad url fails at start, with its reason
  return o;
}

}  // namespace cf::apps
