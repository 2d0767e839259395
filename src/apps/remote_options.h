// `--remote redis://host:port[/db]` and its knobs, and `--store-key-file`, shared by `serve`
// and the `chunks` commands that write (issue 13; the tier itself is kv/remote_tier.h; the
// key, kv/entry_auth.h, is required with a remote tier: the store refuses one without it).
#pragma once
#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "kv/remote_tier.h"

namespace cf::apps {

struct RemoteArgs {
  std::string url;  // empty: no remote tier
  RemoteTierOptions tier;
};

void add_remote_options(CLI::App& cmd, RemoteArgs& a);
// --store-key-file: every cache entry written carries an HMAC tag under this key, and entries
// without a valid one are never served.
void add_store_key_option(CLI::App& cmd, std::string& key_file);
// The tier's options, or none without --remote; std::invalid_argument on a bad url.
std::optional<RemoteTierOptions> remote_tier_options(const RemoteArgs& a);

}  // namespace cf::apps
