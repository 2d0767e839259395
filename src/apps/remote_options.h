// `--remote redis://host:port[/db]` and its knobs, shared by `serve` and `chunks precompute`
// (issue 13; the tier itself is kv/remote_tier.h).
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
// The tier's options, or none without --remote; std::invalid_argument on a bad url.
std::optional<RemoteTierOptions> remote_tier_options(const RemoteArgs& a);

}  // namespace cf::apps
