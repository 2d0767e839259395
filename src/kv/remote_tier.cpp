#include "kv/remote_tier.h"

#include <hiredis/hiredis.h>
#include <openssl/crypto.h>
#include <xxhash.h>
#include <zstd.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "base/clock.h"
#include "base/bounded_json.h"
#include "kv/entry_auth.h"

namespace cf {
namespace {

timeval to_timeval(int ms) {
  timeval tv{};
  tv.tv_sec = ms / 1000;
  tv.tv_usec = (ms % 1000) * 1000;
  return tv;
}

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Owns one reply; hiredis hands them out as void*.
struct Reply {
  redisReply* r = nullptr;
  explicit Reply(void* p) : r(static_cast<redisReply*>(p)) {}
  Reply(const Reply&) = delete;
  Reply& operator=(const Reply&) = delete;
  ~Reply() {
    if (r) freeReplyObject(r);
  }
  bool error() const { return !r || r->type == REDIS_REPLY_ERROR; }
  bool nil() const { return r && r->type == REDIS_REPLY_NIL; }
  std::string text() const { return r && r->str ? std::string(r->str, r->len) : std::string(); }
};

Reply next_reply(redisContext* c) {
  void* p = nullptr;
  if (redisGetReply(c, &p) != REDIS_OK) return Reply(nullptr);
  return Reply(p);
}

// A command's arguments as hiredis's argv/argvlen arrays (binary-safe: lengths, not NULs);
// `args` must outlive it.
struct Argv {
  explicit Argv(const std::vector<std::string>& args) {
    for (const auto& a : args) {
      ptrs.push_back(a.data());
      lens.push_back(a.size());
    }
  }
  int count() const { return static_cast<int>(ptrs.size()); }
  std::vector<const char*> ptrs;
  std::vector<size_t> lens;
};

// Sends one command and reads its reply; a null reply (connection/timeout) leaves c->err set.
Reply command(redisContext* c, const std::vector<std::string>& args) {
  Argv a(args);
  return Reply(redisCommandArgv(c, a.count(), a.ptrs.data(), a.lens.data()));
}

// Queues one command for pipelining; its reply is read later with next_reply.
void append(redisContext* c, const std::vector<std::string>& args) {
  Argv a(args);
  redisAppendCommandArgv(c, a.count(), a.ptrs.data(), a.lens.data());
}

}  // namespace

RedisUrl parse_redis_url(const std::string& url) {
  const std::string scheme = "redis://";
  if (url.compare(0, scheme.size(), scheme) != 0)
    throw std::invalid_argument("remote tier url \"" + url + "\" must start with redis://");
  std::string rest = url.substr(scheme.size());
  RedisUrl u;
  auto number = [&](const std::string& s, int lo, int hi, const char* what) {
    if (s.empty() || s.size() > 6 || s.find_first_not_of("0123456789") != std::string::npos)
      throw std::invalid_argument("remote tier url \"" + url + "\": bad " + what + " \"" + s + "\"");
    const int v = std::stoi(s);
    if (v < lo || v > hi) throw std::invalid_argument("remote tier url \"" + url + "\": " + what + " out of range");
    return v;
  };
  if (auto slash = rest.find('/'); slash != std::string::npos) {
    u.db = number(rest.substr(slash + 1), 0, 1 << 20, "database");
    rest.resize(slash);
  }
  if (rest.find('@') != std::string::npos)
    throw std::invalid_argument("remote tier url \"" + url + "\": credentials in the url are not supported");
  if (auto colon = rest.rfind(':'); colon != std::string::npos) {
    u.port = number(rest.substr(colon + 1), 1, 65535, "port");
    rest.resize(colon);
  }
  if (rest.empty()) throw std::invalid_argument("remote tier url \"" + url + "\" has no host");
  u.host = rest;
  return u;
}

RemoteTier::RemoteTier(RemoteTierOptions opt) : opt_(std::move(opt)), url_(parse_redis_url(opt_.url)) {
  if (!opt_.report) opt_.report = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
  if (opt_.pool_size == 0 || opt_.piece_bytes == 0 || opt_.connect_timeout_ms <= 0 || opt_.command_timeout_ms <= 0)
    throw std::invalid_argument("remote tier: pool size, piece size and timeouts must be positive");
  if (!opt_.auth)  // manifests carry the key's tag (issue 29 item 9)
    throw std::invalid_argument("remote tier: needs a store key (--store-key-file) to tag its entries");
  stats_.read_ms_buckets.assign(std::size(kRemoteLatencyBoundsMs) + 1, 0);
  worker_ = std::thread([this] { worker(); });
}

RemoteTier::~RemoteTier() {
  flush(opt_.flush_timeout_ms);
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    if (!queue_.empty())
      opt_.report("remote tier: " + std::to_string(queue_.size()) + " queued writes not flushed in time, dropped");
  }
  queue_cv_.notify_all();
  worker_.join();
  for (redisContext* c : idle_) redisFree(c);
}

std::string RemoteTier::manifest_key(const std::string& id) const { return opt_.key_prefix + "{" + id + "}"; }

std::string RemoteTier::piece_key(const std::string& id, const std::string& sum, size_t i) const {
  return manifest_key(id) + ":" + sum + ":" + std::to_string(i);
}

// --- connection pool

redisContext* RemoteTier::connect() {
  redisContext* c = redisConnectWithTimeout(url_.host.c_str(), url_.port, to_timeval(opt_.connect_timeout_ms));
  std::string why;
  if (!c || c->err) {
    why = c ? c->errstr : "cannot allocate a context";
  } else if (redisSetTimeout(c, to_timeval(opt_.command_timeout_ms)) != REDIS_OK) {
    why = "cannot set the command timeout";
  } else if (url_.db != 0) {
    Reply r = command(c, {"SELECT", std::to_string(url_.db)});
    if (r.error()) why = "SELECT " + std::to_string(url_.db) + ": " + (r.r ? r.text() : std::string(c->errstr));
  }
  std::lock_guard lock(mu_);
  if (why.empty()) {
    ++stats_.connects;
    return c;
  }
  if (c) redisFree(c);
  ++stats_.connect_failures;
  ++stats_.errors;
  // Report the first failure of an outage, not every retry.
  if (stats_.up || stats_.connect_failures == 1)
    opt_.report("remote tier redis://" + url_.host + ":" + std::to_string(url_.port) + ": " + why +
                " (serving from local tiers; retrying every " + std::to_string(opt_.retry_ms) + " ms)");
  stats_.up = false;
  down_until_ms_ = now_ms() + opt_.retry_ms;
  return nullptr;
}

redisContext* RemoteTier::acquire() {
  std::unique_lock lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(opt_.command_timeout_ms);
  while (true) {
    if (!idle_.empty()) {
      redisContext* c = idle_.back();
      idle_.pop_back();
      return c;
    }
    if (now_ms() < down_until_ms_) return nullptr;  // down: do not wait for a connect timeout again
    if (open_ < opt_.pool_size) {
      ++open_;
      lock.unlock();
      redisContext* c = connect();
      lock.lock();
      if (!c) {
        --open_;
        pool_cv_.notify_one();
      }
      return c;
    }
    if (pool_cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
      ++stats_.errors;  // every connection busy for a whole command timeout
      return nullptr;
    }
  }
}

void RemoteTier::release(redisContext* c, bool ok) {
  std::lock_guard lock(mu_);
  if (ok && !c->err) {
    idle_.push_back(c);
    stats_.up = true;
  } else {
    redisFree(c);  // a broken or timed-out connection may hold a half-read reply: never reuse it
    --open_;
  }
  pool_cv_.notify_one();
}

void RemoteTier::note_error(const std::string& what, bool connection_lost) {
  bool first;
  {
    std::lock_guard lock(mu_);
    ++stats_.errors;
    first = stats_.up;
    stats_.up = false;
    // A timeout or a dropped connection: back off like a failed connect, so that a stalled
    // Redis costs one timeout per retry_ms, not one per request.
    if (connection_lost) down_until_ms_ = now_ms() + opt_.retry_ms;
  }
  if (first) opt_.report("remote tier: " + what + " (serving from local tiers)");
}

// --- reading

std::optional<RemoteManifest> parse_remote_manifest(const std::string& text) {
  try {
    // Bounded nesting: a manifest comes from Redis, which other replicas write (issue 29).
    const auto j = parse_json_bounded(text);
    // Whole non-negative numbers only: a float or negative one would not convert safely.
    auto count = [&](const char* k) {
      const auto& v = j.at(k);
      if (!v.is_number_unsigned()) throw std::invalid_argument(k);
      return v.get<uint64_t>();
    };
    const uint64_t format = count("format");
    if (format != 1 && format != 2) return std::nullopt;
    RemoteManifest m;
    m.format = static_cast<int>(format);
    m.raw = count("raw");
    m.zlen = count("zlen");
    m.pieces = count("pieces");
    m.sum = j.at("sum").get<std::string>();
    if (m.format >= 2) m.tag = j.at("tag").get<std::string>();
    auto hex = [](const std::string& s, size_t n) {
      return s.size() == n && s.find_first_not_of("0123456789abcdef") == std::string::npos;
    };
    // Bounds keep allocations sane whatever the manifest says (the reader's entry limit is
    // checked on top: remote_manifest_within).
    if (!hex(m.sum, 16) || (m.format >= 2 && !hex(m.tag, 64)) || m.pieces == 0 || m.pieces > 65536 || m.zlen == 0 ||
        m.zlen > (size_t{1} << 36) || m.raw == 0 || m.raw > (size_t{1} << 36))
      return std::nullopt;
    return m;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

bool remote_manifest_within(const RemoteManifest& m, size_t max_entry_bytes, std::string& why) {
  if (m.format != kRemoteFormat) {
    why = "manifest format " + std::to_string(m.format) + " (written before issue 29, without a tag over the " +
          "compressed bytes); this build reads format " + std::to_string(kRemoteFormat) + " only";
    return false;
  }
  if (m.raw > max_entry_bytes || m.zlen > ZSTD_compressBound(max_entry_bytes) || m.pieces > m.zlen) {
    why = "manifest claims " + std::to_string(m.raw) + " bytes (" + std::to_string(m.zlen) + " compressed, " +
          std::to_string(m.pieces) + " pieces), over the entry limit of " + std::to_string(max_entry_bytes) + " bytes";
    return false;
  }
  return true;
}

std::string remote_entry_tag(const EntryAuth& auth, const std::string& id, size_t raw, const uint8_t* z, size_t zlen) {
  // Two HMACs rather than one over a concatenation: the compressed bytes are not copied.
  const EntryAuth::Tag inner = auth.tag(z, zlen);
  std::vector<uint8_t> msg{'C', 'F', 'R', 'E', 'M', 'O', 'T', '2'};
  auto u64 = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i) msg.push_back(static_cast<uint8_t>(v >> (8 * i)));
  };
  u64(id.size());
  msg.insert(msg.end(), id.begin(), id.end());
  u64(raw);
  u64(zlen);
  msg.insert(msg.end(), inner.begin(), inner.end());
  const EntryAuth::Tag outer = auth.tag(msg.data(), msg.size());
  std::string hex;
  for (uint8_t b : outer) {
    char buf[3];
    std::snprintf(buf, sizeof buf, "%02x", b);
    hex += buf;
  }
  return hex;
}

std::optional<bool> RemoteTier::exists(const std::string& id) {
  redisContext* c = acquire();
  if (!c) return std::nullopt;
  Reply r = command(c, {"EXISTS", manifest_key(id)});
  const bool ok = !r.error() && r.r->type == REDIS_REPLY_INTEGER;
  if (!ok) note_error("EXISTS " + manifest_key(id) + ": " + (r.r ? r.text() : std::string(c->errstr)), !r.r);
  release(c, ok);
  if (!ok) return std::nullopt;
  return r.r->integer > 0;
}

std::optional<std::vector<uint8_t>> RemoteTier::get(const std::string& id) {
  redisContext* c = acquire();
  if (!c) {
    std::lock_guard lock(mu_);
    ++stats_.misses;
    return std::nullopt;
  }
  const double t0 = now_ms();
  bool ok = true;
  std::optional<std::vector<uint8_t>> out;
  std::string bad;  // non-empty: the entry is bad, delete it
  bool incomplete = false;
  size_t wire = 0;
  std::string manifest_text;
  try {  // an exception (allocation, OpenSSL) must still give the connection back
  do {
    Reply r = command(c, {"GET", manifest_key(id)});
    if (!r.r || r.error()) {
      ok = false;
      note_error("GET " + manifest_key(id) + ": " + (r.r ? r.text() : std::string(c->errstr)), !r.r);
      break;
    }
    if (r.nil()) break;
    manifest_text = r.text();
    const auto m = parse_remote_manifest(manifest_text);
    if (!m) {
      bad = "unreadable manifest";
      break;
    }
    // The entry limit before any piece is fetched or any buffer sized (issue 29 item 9): a
    // manifest may claim 64 GiB, and an allocation failure here would end a prefetch thread.
    if (!remote_manifest_within(*m, opt_.max_entry_bytes, bad)) break;
    for (size_t i = 0; i < m->pieces; ++i) append(c, {"GET", piece_key(id, m->sum, i)});
    std::vector<uint8_t> z;  // grows with what arrives, never past zlen
    for (size_t i = 0; i < m->pieces; ++i) {
      Reply p = next_reply(c);
      if (!p.r || p.error()) {
        ok = false;
        note_error("GET piece of " + id + ": " + (p.r ? p.text() : std::string(c->errstr)), !p.r);
        break;
      }
      if (p.nil() || p.r->type != REDIS_REPLY_STRING) {
        incomplete = true;  // keep reading: the pipeline's replies must all be consumed
        continue;
      }
      wire += p.r->len;
      if (z.size() + p.r->len <= m->zlen) z.insert(z.end(), p.r->str, p.r->str + p.r->len);
      else bad = "pieces longer than the manifest says";
    }
    if (!ok || incomplete || !bad.empty()) break;
    out = unpack_remote_entry(*m, z, opt_.max_entry_bytes, *opt_.auth, id, bad);
  } while (false);
  } catch (const std::exception& e) {
    opt_.report("remote chunk cache " + manifest_key(id) + ": read failed (" + e.what() + "), recomputing");
    ok = false;  // the pipeline may be half read: the connection is closed, not reused
    out.reset();
  }

  if (ok && incomplete) {
    // Evicted or replaced under us. Delete the manifest only if it is still the one we read.
    // delete_entry compares under WATCH, so a rewrite landing meanwhile is kept.
    delete_entry(c, id, &manifest_text);
    ok = !c->err;
  }
  if (ok && !bad.empty()) {
    opt_.report("remote chunk cache " + manifest_key(id) + ": " + bad + ", deleting and recomputing");
    delete_entry(c, id, &manifest_text);
    ok = !c->err;
  }
  const double ms = now_ms() - t0;
  release(c, ok);
  std::lock_guard lock(mu_);
  ++stats_.reads;
  stats_.read_ms_sum += ms;
  for (size_t b = 0; b < stats_.read_ms_buckets.size(); ++b)
    if (b == std::size(kRemoteLatencyBoundsMs) || ms <= kRemoteLatencyBoundsMs[b]) ++stats_.read_ms_buckets[b];
  stats_.bytes_read += wire;
  if (incomplete) ++stats_.incomplete;
  if (!bad.empty()) ++stats_.corrupt;
  ++(out ? stats_.hits : stats_.misses);
  return out;
}

std::optional<std::vector<uint8_t>> unpack_remote_entry(const RemoteManifest& m, const std::vector<uint8_t>& z,
                                                        size_t max_entry_bytes, const EntryAuth& auth,
                                                        const std::string& id, std::string& why) {
  if (!remote_manifest_within(m, max_entry_bytes, why)) return std::nullopt;
  if (z.size() != m.zlen) {
    why = "pieces hold " + std::to_string(z.size()) + " bytes, the manifest says " + std::to_string(m.zlen);
    return std::nullopt;
  }
  if (hex16(XXH3_64bits(z.data(), z.size())) != m.sum) {
    why = "checksum differs";
    return std::nullopt;
  }
  // The tag over the compressed bytes before decompressing: without the key, no zstd bomb is
  // ever inflated (issue 29 item 9). Constant time, like the trailer check.
  const std::string want = remote_entry_tag(auth, id, m.raw, z.data(), z.size());
  if (want.size() != m.tag.size() || CRYPTO_memcmp(want.data(), m.tag.data(), want.size()) != 0) {
    why = "manifest tag does not match (written without the store key, or another one)";
    return std::nullopt;
  }
  // The writer's frame records its content size: allocate only what both agree on.
  if (ZSTD_getFrameContentSize(z.data(), z.size()) != m.raw) {
    why = "decompressed size " + std::to_string(m.raw) + " not what the zstd frame says, or too large";
    return std::nullopt;
  }
  std::vector<uint8_t> raw(m.raw);
  const size_t n = ZSTD_decompress(raw.data(), raw.size(), z.data(), z.size());
  if (ZSTD_isError(n) || n != m.raw) {
    why = ZSTD_isError(n) ? std::string("zstd: ") + ZSTD_getErrorName(n) : "decompressed size differs";
    return std::nullopt;
  }
  return raw;
}

// WATCH on the manifest, then the transaction (issue 59): a writer or a deleter that commits
// between our read of the manifest and our EXEC aborts it, and we read again. Without it two
// replicas writing one id each deleted the pieces of the manifest they had read, and the
// pieces of whichever committed first stayed in Redis forever, named by no manifest.
std::optional<std::string> RemoteTier::watch_manifest(redisContext* c, const std::string& id, bool& ok) {
  ok = false;
  Reply w = command(c, {"WATCH", manifest_key(id)});
  if (!w.r || w.error()) return std::nullopt;
  Reply r = command(c, {"GET", manifest_key(id)});
  if (!r.r || r.error()) return std::nullopt;
  ok = true;
  if (r.nil()) return std::nullopt;
  return r.text();
}

bool RemoteTier::unwatch(redisContext* c) {
  Reply r = command(c, {"UNWATCH"});
  return r.r && !r.error();
}

// Reads the replies of MULTI, n queued commands and EXEC. false: the connection failed.
// aborted: EXEC answered nil (a watched key changed); error: the first error reply.
bool RemoteTier::read_transaction(redisContext* c, size_t n_cmds, bool& aborted, std::string& error) {
  aborted = false;
  for (size_t i = 0; i < n_cmds + 2; ++i) {  // MULTI, the queued commands, EXEC
    Reply r = next_reply(c);
    if (!r.r) return false;
    if (r.error() && error.empty()) error = r.text();
    if (i == n_cmds + 1 && r.nil() && error.empty()) aborted = true;
    if (i == n_cmds + 1 && r.r->type == REDIS_REPLY_ARRAY)
      for (size_t e = 0; e < r.r->elements && error.empty(); ++e)
        if (r.r->element[e]->type == REDIS_REPLY_ERROR) error.assign(r.r->element[e]->str, r.r->element[e]->len);
  }
  return true;
}

bool RemoteTier::delete_entry(redisContext* c, const std::string& id, const std::string* manifest_text) {
  for (int attempt = 0; attempt < kCommitAttempts; ++attempt) {
    bool ok = false;
    const std::optional<std::string> text = watch_manifest(c, id, ok);
    if (!ok) return false;
    // Gone, or replaced since the caller read it (a bad entry's rewrite is not ours to delete).
    if (!text || (manifest_text && *text != *manifest_text)) return unwatch(c);
    if (opt_.before_commit) opt_.before_commit(id);
    std::vector<std::string> del{"DEL", manifest_key(id)};
    if (auto m = parse_remote_manifest(*text))
      for (size_t i = 0; i < m->pieces; ++i) del.push_back(piece_key(id, m->sum, i));
    append(c, {"MULTI"});
    append(c, del);
    append(c, {"EXEC"});
    bool aborted = false;
    std::string error;
    if (!read_transaction(c, 1, aborted, error)) return false;
    if (aborted) {
      std::lock_guard lock(mu_);
      ++stats_.commit_retries;
      continue;
    }
    if (!error.empty()) return false;
    std::lock_guard lock(mu_);
    ++stats_.deletes;
    return true;
  }
  opt_.report("remote tier: delete of " + id + " gave way to other writers " + std::to_string(kCommitAttempts) +
              " times; left to them");
  return true;
}

// --- writing

bool RemoteTier::put_async(const std::string& id, std::vector<uint8_t> image) {
  if (image.empty()) return false;
  std::lock_guard lock(mu_);
  if (stopping_ || queue_.size() >= opt_.queue_entries || queue_bytes_ + image.size() > opt_.queue_bytes ||
      now_ms() < down_until_ms_) {  // down: writing later would only fail later
    ++stats_.writes_dropped;
    return false;
  }
  queue_bytes_ += image.size();
  queue_.push_back({id, std::move(image)});
  queue_cv_.notify_one();
  return true;
}

void RemoteTier::remove_async(const std::string& id) {
  std::lock_guard lock(mu_);
  if (stopping_) return;
  queue_.push_back({id, {}});  // deletes are tiny and always queued, whatever the bounds
  queue_cv_.notify_one();
}

void RemoteTier::report_bad(const std::string& id, const std::string& why) {
  opt_.report("remote chunk cache " + manifest_key(id) + ": " + why + ", deleting and recomputing");
  {
    std::lock_guard lock(mu_);
    ++stats_.corrupt;
    // The get that fetched it counted a hit; it was not one.
    if (stats_.hits) --stats_.hits;
    ++stats_.misses;
  }
  remove_async(id);
}

bool RemoteTier::write_entry(redisContext* c, const Task& t) {
  std::string z(ZSTD_compressBound(t.image.size()), '\0');
  const size_t zn = ZSTD_compress(z.data(), z.size(), t.image.data(), t.image.size(), opt_.zstd_level);
  if (ZSTD_isError(zn)) {
    opt_.report(std::string("remote tier: zstd: ") + ZSTD_getErrorName(zn));
    return true;  // not the connection's fault
  }
  z.resize(zn);
  const std::string sum = hex16(XXH3_64bits(z.data(), z.size()));
  const size_t pieces = (zn + opt_.piece_bytes - 1) / opt_.piece_bytes;
  const nlohmann::json manifest{{"format", kRemoteFormat}, {"raw", t.image.size()}, {"zlen", zn}, {"sum", sum},
                                {"pieces", pieces},
                                {"tag", remote_entry_tag(*opt_.auth, t.id, t.image.size(),
                                                         reinterpret_cast<const uint8_t*>(z.data()), zn)}};

  std::string error;
  bool committed = false;
  for (int attempt = 0; attempt < kCommitAttempts && !committed && error.empty(); ++attempt) {
    bool ok = false;
    const std::optional<std::string> old = watch_manifest(c, t.id, ok);
    if (!ok) return false;
    std::optional<RemoteManifest> previous;
    if (old) previous = parse_remote_manifest(*old);
    if (previous && previous->format == kRemoteFormat && previous->sum == sum && previous->pieces == pieces &&
        previous->tag == manifest["tag"]) {
      if (!unwatch(c)) return false;
      std::lock_guard lock(mu_);
      ++stats_.writes_present;
      return true;
    }
    if (opt_.before_commit) opt_.before_commit(t.id);
    // One transaction: the pieces, the manifest that commits them, the old pieces' deletion;
    // EXEC applies it only if the manifest is still the one read above.
    append(c, {"MULTI"});
    for (size_t i = 0; i < pieces; ++i)
      append(c, {"SET", piece_key(t.id, sum, i), z.substr(i * opt_.piece_bytes, opt_.piece_bytes)});
    append(c, {"SET", manifest_key(t.id), manifest.dump()});
    size_t n_cmds = pieces + 1;
    if (previous) {
      std::vector<std::string> del{"DEL"};
      for (size_t i = 0; i < previous->pieces; ++i)
        if (previous->sum != sum || i >= pieces) del.push_back(piece_key(t.id, previous->sum, i));  // not ours just set
      if (del.size() > 1) {
        append(c, del);
        ++n_cmds;
      }
    }
    append(c, {"EXEC"});
    bool aborted = false;
    if (!read_transaction(c, n_cmds, aborted, error)) return false;
    committed = !aborted && error.empty();
    if (aborted) {
      std::lock_guard lock(mu_);
      ++stats_.commit_retries;
    }
  }
  if (!committed && error.empty()) error = "gave way to other writers " + std::to_string(kCommitAttempts) + " times";
  std::lock_guard lock(mu_);
  if (!error.empty()) {  // e.g. OOM under maxmemory with noeviction: nothing was applied
    ++stats_.write_errors;
    if (stats_.write_errors == 1 || stats_.write_errors % 100 == 0)
      opt_.report("remote tier: write of " + t.id + " refused: " + error + " (" +
                  std::to_string(stats_.write_errors) + " so far)");
    return true;  // the connection is fine
  }
  ++stats_.writes;
  stats_.bytes_written += zn;
  stats_.up = true;
  return true;
}

void RemoteTier::worker() {
  std::unique_lock lock(mu_);
  while (true) {
    queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    Task t = std::move(queue_.front());
    queue_.pop_front();
    queue_bytes_ -= t.image.size();
    busy_ = true;
    lock.unlock();
    bool ok = false;
    redisContext* c = acquire();
    if (c) {
      try {  // nothing may escape this thread (issue 29 item 9): an allocation failure is a failed write
        ok = t.image.empty() ? delete_entry(c, t.id, nullptr) : write_entry(c, t);
        if (!ok) note_error(std::string(t.image.empty() ? "delete" : "write") + " of " + t.id + ": " + c->errstr, true);
      } catch (const std::exception& e) {
        opt_.report("remote tier: " + std::string(t.image.empty() ? "delete" : "write") + " of " + t.id +
                    " failed: " + e.what());
        ok = false;  // the connection may hold half a pipeline: closed by release
      }
      release(c, ok);
    }
    lock.lock();
    if (!ok && !t.image.empty()) ++stats_.write_errors;
    busy_ = false;
    idle_cv_.notify_all();
  }
}

bool RemoteTier::flush(int timeout_ms) {
  std::unique_lock lock(mu_);
  return idle_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return queue_.empty() && !busy_; });
}

RemoteTierStats RemoteTier::stats() const {
  std::lock_guard lock(mu_);
  RemoteTierStats s = stats_;
  s.queue_entries = queue_.size();
  s.queue_bytes = queue_bytes_;
  return s;
}

}  // namespace cf
