// EntryAuth: HMAC-SHA256 trailers for cache entries (see entry_auth.h).
#include "kv/entry_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>

namespace cf {

EntryAuth::EntryAuth(std::vector<uint8_t> key) : key_(std::move(key)) {
  if (key_.size() < kMinKeyBytes)
    throw std::invalid_argument("store key: " + std::to_string(key_.size()) + " bytes, at least " +
                                std::to_string(kMinKeyBytes) + " needed");
}

EntryAuth EntryAuth::from_key_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read the store key file " + path);
  std::vector<uint8_t> key{std::istreambuf_iterator<char>(f), {}};
  if (!key.empty() && key.back() == '\n') key.pop_back();
  if (key.size() < kMinKeyBytes)
    throw std::runtime_error("store key file " + path + " holds " + std::to_string(key.size()) +
                             " bytes; at least " + std::to_string(kMinKeyBytes) + " are needed");
  return EntryAuth(std::move(key));
}

std::shared_ptr<const EntryAuth> EntryAuth::optional_from_key_file(const std::string& path) {
  if (path.empty()) return nullptr;
  return std::make_shared<const EntryAuth>(from_key_file(path));
}

EntryAuth::Tag EntryAuth::tag(const uint8_t* data, size_t n) const {
  Tag t{};
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key_.data(), static_cast<int>(key_.size()), data, n, t.data(), &len) || len != t.size())
    throw std::runtime_error("HMAC-SHA256 failed (OpenSSL)");
  return t;
}

bool EntryAuth::verify(const uint8_t* data, size_t n, const uint8_t* expected) const {
  const Tag t = tag(data, n);
  return CRYPTO_memcmp(t.data(), expected, t.size()) == 0;
}

void EntryAuth::seal(std::vector<uint8_t>& entry) const {
  const Tag t = tag(entry.data(), entry.size());
  entry.insert(entry.end(), kTrailerMagic, kTrailerMagic + 8);
  entry.insert(entry.end(), t.begin(), t.end());
}

bool EntryAuth::has_trailer(const uint8_t* data, size_t n) {
  return n >= kTrailerBytes && std::memcmp(data + n - kTrailerBytes, kTrailerMagic, 8) == 0;
}

}  // namespace cf
