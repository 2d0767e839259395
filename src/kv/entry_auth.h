// Keyed integrity for chunk-cache entries (issue 17, item 6). The xxHash checksums of a cache
// file catch accidents, not tampering: whoever can write the store (or, with the Redis tier,
// the shared cache) can recompute them and have garbage served to every replica. With a
// secret key (`--store-key-file`), every entry carries an HMAC-SHA256 (OpenSSL) over its
// bytes, header and payload, and an entry without a valid tag is never served: it counts as
// unauthenticated, is moved aside like a damaged file and recomputed.
//
// The tag travels inside the entry, as a trailer after the payload, so an entry's bytes are
// self-contained wherever they are kept (file or remote tier):
//   entry bytes | "CFKVMAC1" | HMAC-SHA256(key, entry bytes)   (8 + 32 bytes)
// Readers without a key ignore a well-formed trailer (integrity checks still apply).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cf {

class EntryAuth {
 public:
  static constexpr size_t kTagBytes = 32;
  static constexpr char kTrailerMagic[9] = "CFKVMAC1";
  static constexpr size_t kTrailerBytes = 8 + kTagBytes;
  static constexpr size_t kMinKeyBytes = 32;  // 256 bits, the HMAC-SHA256 block's worth (issue 29 item 10)
  using Tag = std::array<uint8_t, kTagBytes>;

  // The key's bytes; at least kMinKeyBytes (std::invalid_argument otherwise).
  explicit EntryAuth(std::vector<uint8_t> key);
  // The store key file (issue 29 item 10). What it holds:
  //   - 64 hex digits (either case), optionally followed by one newline: the 32 bytes they
  //     spell are the key. Made by `head -c 32 /dev/urandom | xxd -p -c 64 > key` or
  //     `openssl rand -hex 32 > key`.
  //     Only hex digits but not 64 of them: refused.
  //   - anything else: the file's bytes are the key (one trailing newline dropped), at least
  //     32 of them (e.g. `head -c 32 /dev/urandom > key`).
  // Like ssh's rule for private keys, the file must be a regular file (not a symlink), owned
  // by the current user or root, with no permission for group or others (chmod 600).
  // std::runtime_error naming the file and the rule otherwise.
  static EntryAuth from_key_file(const std::string& path);
  // from_key_file for a store's options: nullptr for an empty path (no keyed integrity).
  static std::shared_ptr<const EntryAuth> optional_from_key_file(const std::string& path);

  Tag tag(const uint8_t* data, size_t n) const;
  // Constant-time comparison of tag(data, n) with `tag`.
  bool verify(const uint8_t* data, size_t n, const uint8_t* tag) const;
  // Appends the trailer for the bytes already in `entry`.
  void seal(std::vector<uint8_t>& entry) const;

  // Whether data[n - kTrailerBytes, n) starts with the trailer magic.
  static bool has_trailer(const uint8_t* data, size_t n);

 private:
  std::vector<uint8_t> key_;
};

}  // namespace cf
