// The bench's reference (full prefill's answer and first-token logits) kept on disk between
// runs. Every method row is scored against it, so a run that adds a method to a folder, a
// resumed run or another shard of the same examples would otherwise prefill the whole prompt
// again: on the 1.5B's ~6K-token musique_s prompts that is ~130 s of the ~200 s of fixed work
// per example at one thread (docs/benchmarks-history.md).
//
// A record is only valid for the very computation that made it, so its key hashes the running
// binary (/proc/self/exe: any rebuild, e.g. a kernel change, misses), the kernel ISA, the
// thread count, the model fingerprint, max_tokens and the prompt's token ids. The full row
// itself is never taken from here (its TTFT is measured).
//
// Records live in <dir>/<binary hash>/; folders of other binaries unused for 7 days are
// removed when a cache is opened. File (<dir>/<binary hash>/<key>.ref): "CFREF1\0\0", u64 header length, the JSON header {answer_bytes,
// tokens, stop_reason, decode_tok_s, n_logits}, the answer's raw bytes, n_logits f32, then
// XXH3-64 of everything before. A file that does not check out is ignored with a warning and
// rewritten; writes are atomic (temp file + rename).
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "eval/bench_request.h"
#include "model/tokenizer.h"

namespace cf::eval {

struct ReferenceRecord {
  std::vector<float> logits;  // the first output token's
  DecodedAnswer answer;
};

class ReferenceCache {
 public:
  // Empty `dir`, or a binary that cannot be read: disabled (load misses, save does nothing).
  explicit ReferenceCache(std::string dir);
  bool enabled() const { return !dir_.empty(); }
  std::string key(uint64_t model_fingerprint, std::span<const TokenId> prompt, int max_tokens, int threads) const;
  std::optional<ReferenceRecord> load(const std::string& key) const;
  void save(const std::string& key, const ReferenceRecord& r) const;  // a failed write only warns
  std::string path(const std::string& key) const;

 private:
  std::string dir_;
  uint64_t binary_hash_ = 0;
};

}  // namespace cf::eval
