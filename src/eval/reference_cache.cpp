#include "eval/reference_cache.h"

#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "model/kernels.h"

namespace cf::eval {
namespace {

namespace fs = std::filesystem;
constexpr char kMagic[8] = {'C', 'F', 'R', 'E', 'F', '1', '\0', '\0'};

// XXH3-64 of the running executable; 0 when it cannot be read.
uint64_t hash_of_running_binary() {
  std::ifstream in("/proc/self/exe", std::ios::binary);
  if (!in) return 0;
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return bytes.empty() ? 0 : XXH3_64bits(bytes.data(), bytes.size());
}

// A folder this cache made: 16 hex digits holding only record files (.ref, or a .ref.tmpN
// left by a killed write). Anything else under a user-given --reference-cache is never removed.
bool is_record_folder(const fs::path& p) {
  std::error_code ec;
  const std::string name = p.filename().string();
  if (!fs::is_directory(p, ec) || name.size() != 16 ||
      name.find_first_not_of("0123456789abcdef") != std::string::npos)
    return false;
  for (const auto& f : fs::directory_iterator(p, ec)) {
    const std::string file = f.path().filename().string();
    if (!f.is_regular_file(ec) || (f.path().extension() != ".ref" && file.find(".ref.tmp") == std::string::npos))
      return false;
  }
  return !ec;
}

template <typename T>
void append_raw(std::string& s, const T& v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}

}  // namespace

ReferenceCache::ReferenceCache(std::string dir) {
  if (dir.empty()) return;
  static const uint64_t binary = hash_of_running_binary();
  binary_hash_ = binary;
  if (binary_hash_ == 0) {
    std::fprintf(stderr, "bench: cannot read the running binary; references are not cached\n");
    return;
  }
  // One folder per binary: records of another build can never match, so folders of builds
  // not used for a week are removed (the cache stays bounded as the binary changes).
  char sub[17];
  std::snprintf(sub, sizeof sub, "%016llx", static_cast<unsigned long long>(binary_hash_));
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir, ec)) {
    std::error_code e2;
    if (f.path().filename() != sub && is_record_folder(f.path()) &&
        fs::last_write_time(f.path(), e2) < fs::file_time_type::clock::now() - std::chrono::hours(24 * 7))
      fs::remove_all(f.path(), e2);
  }
  dir_ = (fs::path(dir) / sub).string();
}

std::string ReferenceCache::key(uint64_t model_fingerprint, std::span<const TokenId> prompt, int max_tokens,
                                int threads) const {
  std::string bytes = "chunkfuse.bench.reference/1";
  append_raw(bytes, binary_hash_);
  bytes += isa_name(active_isa());
  append_raw(bytes, threads);
  append_raw(bytes, model_fingerprint);
  append_raw(bytes, max_tokens);
  bytes.append(reinterpret_cast<const char*>(prompt.data()), prompt.size_bytes());
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  char hex[33];
  std::snprintf(hex, sizeof hex, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return hex;
}

std::string ReferenceCache::path(const std::string& key) const { return (fs::path(dir_) / (key + ".ref")).string(); }

std::optional<ReferenceRecord> ReferenceCache::load(const std::string& key) const {
  if (!enabled()) return std::nullopt;
  const std::string file = path(key);
  std::ifstream in(file, std::ios::binary);
  if (!in) return std::nullopt;
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto refuse = [&](const char* why) -> std::optional<ReferenceRecord> {
    std::fprintf(stderr, "bench: ignored reference %s (%s); full prefill runs again\n", file.c_str(), why);
    return std::nullopt;
  };
  uint64_t header_len = 0, sum = 0;
  if (bytes.size() < sizeof kMagic + 2 * sizeof(uint64_t) || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
    return refuse("not a reference file");
  std::memcpy(&sum, bytes.data() + bytes.size() - sizeof sum, sizeof sum);
  if (XXH3_64bits(bytes.data(), bytes.size() - sizeof sum) != sum) return refuse("checksum mismatch");
  std::memcpy(&header_len, bytes.data() + sizeof kMagic, sizeof header_len);
  const size_t body = sizeof kMagic + sizeof header_len;
  if (header_len > bytes.size() - body - sizeof sum) return refuse("header length out of range");
  try {
    const auto h = nlohmann::json::parse(bytes.substr(body, header_len));
    ReferenceRecord r;
    const size_t answer_len = h.at("answer_bytes").get<size_t>(), n = h.at("n_logits").get<size_t>();
    if (answer_len + n * sizeof(float) != bytes.size() - body - header_len - sizeof sum)
      return refuse("length mismatch");
    r.answer.answer = bytes.substr(body + header_len, answer_len);
    r.logits.resize(n);
    std::memcpy(r.logits.data(), bytes.data() + body + header_len + answer_len, n * sizeof(float));
    r.answer.tokens = h.at("tokens").get<size_t>();
    r.answer.stop_reason = h.at("stop_reason").get<std::string>();
    r.answer.decode_tok_s = h.at("decode_tok_s").get<double>();
    return r;
  } catch (const nlohmann::json::exception&) {
    return refuse("malformed header");
  }
}

void ReferenceCache::save(const std::string& key, const ReferenceRecord& r) const {
  if (!enabled()) return;
  // The answer follows the header as raw bytes: it may end inside a UTF-8 character
  // (results_line), which JSON cannot hold, and the metrics read the raw bytes.
  const std::string header = nlohmann::json{{"answer_bytes", r.answer.answer.size()},
                                            {"tokens", r.answer.tokens},
                                            {"stop_reason", r.answer.stop_reason},
                                            {"decode_tok_s", r.answer.decode_tok_s},
                                            {"n_logits", r.logits.size()}}
                                 .dump();
  std::string bytes(kMagic, sizeof kMagic);
  append_raw(bytes, static_cast<uint64_t>(header.size()));
  bytes += header;
  bytes += r.answer.answer;
  bytes.append(reinterpret_cast<const char*>(r.logits.data()), r.logits.size() * sizeof(float));
  append_raw(bytes, static_cast<uint64_t>(XXH3_64bits(bytes.data(), bytes.size())));
  std::error_code ec;
  fs::create_directories(dir_, ec);
  const std::string file = path(key), tmp = file + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::fprintf(stderr, "bench: cannot write %s; the reference is not cached\n", tmp.c_str());
      fs::remove(tmp, ec);
      return;
    }
  }
  fs::rename(tmp, file, ec);
  if (ec) {
    std::fprintf(stderr, "bench: cannot write %s (%s); the reference is not cached\n", file.c_str(), ec.message().c_str());
    fs::remove(tmp, ec);
  }
}

}  // namespace cf::eval
