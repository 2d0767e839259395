#include "kv/chunk_cache.h"

#include <chrono>
#include <numeric>
#include <stdexcept>

#include "base/clock.h"

namespace cf {
namespace {

void check_model(const Forward& fwd, const ChunkKey& key) {
  if (key.model_fingerprint() != fwd.model().fingerprint())
    throw std::invalid_argument("compute_chunk_cache: key " + key.id() + " belongs to another model");
  if (key.tokens().empty()) throw std::invalid_argument("compute_chunk_cache: empty chunk");
}

// Runs tokens at start.. appending to `cache`; no logits are needed, only the K/V.
void run_rows(Forward& fwd, KvCache& cache, std::span<const TokenId> tokens, int32_t start) {
  std::vector<int32_t> pos(tokens.size());
  std::iota(pos.begin(), pos.end(), start);
  ForwardInput in;
  in.tokens = tokens;
  in.positions = pos;
  fwd.run(cache, in);
}

}  // namespace

size_t ChunkCache::memory_bytes() const {
  return kv.bytes() + kv.size() * (sizeof(int32_t) + sizeof(TokenId)) + sizeof(*this) + 256;
}

int64_t unix_time_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

ChunkCache compute_chunk_cache(Forward& fwd, const ChunkKey& key, std::span<const TokenId> prefix) {
  check_model(fwd, key);
  switch (key.context().kind) {
    case ContextKind::pic:
      if (!prefix.empty()) throw std::invalid_argument("compute_chunk_cache: a PIC cache takes no prefix");
      break;
    case ContextKind::after_prefix:
      if (KeyContext::after_prefix(prefix) != key.context())
        throw std::invalid_argument("compute_chunk_cache: the prefix does not match key " + key.id());
      break;
    case ContextKind::neighbours:
      throw std::invalid_argument("compute_chunk_cache: a neighbours variant needs compute_chunk_cache_in_context");
  }
  const double t0 = now_ms();
  const size_t n = key.tokens().size();
  KvCache work(fwd.model().hparams(), prefix.size() + n);
  if (!prefix.empty()) run_rows(fwd, work, prefix, 0);
  run_rows(fwd, work, key.tokens(), static_cast<int32_t>(prefix.size()));
  // Copy out exactly the chunk's entries (delta 0: positions as computed).
  KvCache kv(fwd.model().hparams(), n);
  kv.append_from(work, prefix.size(), prefix.size() + n, 0);
  ChunkCache c(key, std::move(kv));
  c.offline_ms = now_ms() - t0;
  c.created_unix_ms = unix_time_ms();
  return c;
}

ChunkCache compute_chunk_cache_in_context(Forward& fwd, const ChunkKey& key, KvCache& context, int32_t start_pos) {
  check_model(fwd, key);
  const double t0 = now_ms();
  const size_t before = context.size(), n = key.tokens().size();
  KvCache kv(fwd.model().hparams(), n);
  try {
    run_rows(fwd, context, key.tokens(), start_pos);
    kv.append_from(context, before, before + n, 0);
  } catch (...) {
    context.truncate(before);
    throw;
  }
  context.truncate(before);
  ChunkCache c(key, std::move(kv));
  c.offline_ms = now_ms() - t0;
  c.created_unix_ms = unix_time_ms();
  return c;
}

}  // namespace cf
