// libFuzzer target for what the remote tier takes from Redis and the command line (issue 13):
// manifests, the pieces' bytes (length, checksum, zstd frame, claimed sizes) and --remote
// urls. Each must be accepted or refused with a reason; crashes, sanitizer reports,
// exceptions and out-of-memory are findings. (The image inside then goes through
// decode_cache_file, the same checks as a cache file.)
//
// First byte: 0 url, 1 manifest text, 2 pieces under a manifest that agrees on length and
// checksum (so inputs reach zstd), the claimed decompressed size taken from bytes 1-4.
#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "kv/entry_auth.h"
#include "kv/remote_tier.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0:
      try {
        (void)cf::parse_redis_url(text);
      } catch (const std::invalid_argument&) {
      }
      break;
    case 1:
      (void)cf::parse_remote_manifest(text);
      break;
    default: {
      if (size < 5) return 0;
      cf::RemoteManifest m;
      m.raw = static_cast<size_t>(data[1]) | static_cast<size_t>(data[2]) << 8 | static_cast<size_t>(data[3]) << 16 |
              static_cast<size_t>(data[4]) << 24;
      const std::vector<uint8_t> z(data + 5, data + size);
      m.zlen = z.size();
      m.pieces = 1;
      char sum[17];
      std::snprintf(sum, sizeof sum, "%016llx", static_cast<unsigned long long>(XXH3_64bits(z.data(), z.size())));
      m.sum = sum;
      // Signed with the fuzzer's key, so that the checks past the tag (issue 29 item 9) run.
      static const cf::EntryAuth key(std::vector<uint8_t>(32, 0x5a));
      m.tag = cf::remote_entry_tag(key, "fuzz", m.raw, z.data(), z.size());
      std::string why;
      const auto image = cf::unpack_remote_entry(m, z, size_t{1} << 24, key, "fuzz", why);
      if (image && image->size() != m.raw) __builtin_trap();  // must hold exactly what was claimed
      if (!image && why.empty()) __builtin_trap();            // a refusal always says why
    }
  }
  return 0;
}
