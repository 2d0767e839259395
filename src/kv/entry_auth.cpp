// EntryAuth: HMAC-SHA256 trailers for cache entries (see entry_auth.h).
#include "kv/entry_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace cf {

EntryAuth::EntryAuth(std::vector<uint8_t> key) : key_(std::move(key)) {
  if (key_.size() < kMinKeyBytes)
    throw std::invalid_argument("store key: " + std::to_string(key_.size()) + " bytes, at least " +
                                std::to_string(kMinKeyBytes) + " needed");
}

EntryAuth EntryAuth::from_key_file(const std::string& path) {
  const std::string what = "store key file " + path;
  // O_NOFOLLOW: a symlink is refused, not followed; O_NONBLOCK: a FIFO cannot hang the open.
  // The checks run on the opened file (fstat), so nothing can be swapped in between.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ELOOP) throw std::runtime_error(what + " is a symlink; give the key file itself");
    throw std::runtime_error("cannot read the " + what + ": " + std::strerror(err));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw std::runtime_error("cannot stat the " + what + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw std::runtime_error(what + " is not a regular file");
  if (st.st_uid != ::geteuid() && st.st_uid != 0)
    throw std::runtime_error(what + " is owned by uid " + std::to_string(st.st_uid) +
                             "; it must be owned by you (uid " + std::to_string(::geteuid()) + ") or root");
  if (st.st_mode & (S_IRWXG | S_IRWXO)) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    throw std::runtime_error("permissions " + std::string(mode) + " for the " + what +
                             " are too open: it must not be accessible by group or others (chmod 600 " + path + ")");
  }
  if (st.st_size > 1 << 20) throw std::runtime_error(what + " is larger than 1 MiB; a key is 32 bytes");
  std::vector<uint8_t> bytes;
  uint8_t buf[4096];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::runtime_error("cannot read the " + what + ": " + std::strerror(errno));
    if (n == 0) break;
    bytes.insert(bytes.end(), buf, buf + n);
    if (bytes.size() > (1 << 20)) throw std::runtime_error(what + " is larger than 1 MiB; a key is 32 bytes");
  }
  std::vector<uint8_t> text = bytes;
  if (!text.empty() && text.back() == '\n') text.pop_back();
  auto nibble = [](uint8_t c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  bool all_hex = !text.empty();
  for (uint8_t c : text) all_hex = all_hex && nibble(c) >= 0;
  if (all_hex) {  // the hex form: exactly 64 digits (a cut-off one is refused, not taken as raw bytes)
    if (text.size() != 64)
      throw std::runtime_error(what + " holds " + std::to_string(text.size()) +
                               " hex digits; a key is 64 (make one: head -c 32 /dev/urandom | xxd -p -c 64 > " + path +
                               " && chmod 600 " + path + ")");
    std::vector<uint8_t> key;
    for (size_t i = 0; i < 64; i += 2) key.push_back(static_cast<uint8_t>(nibble(text[i]) << 4 | nibble(text[i + 1])));
    return EntryAuth(std::move(key));
  }
  if (text.size() < kMinKeyBytes)
    throw std::runtime_error(what + " holds " + std::to_string(text.size()) + " bytes; a key is 64 hex digits or at least " +
                             std::to_string(kMinKeyBytes) + " raw bytes (make one: head -c 32 /dev/urandom | xxd -p -c 64 > " +
                             path + " && chmod 600 " + path + ")");
  return EntryAuth(std::move(text));
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
