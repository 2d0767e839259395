// Chunk reuse for unmodified RAG clients (issue 27, `chunkfuse serve --match-chunks`).
//
// LangChain's "stuff" chain, LlamaIndex, Open WebUI and hand-written scripts put the
// retrieved passages inside a plain message, joined by blank lines, and never send
// `documents`. This room finds those passages and rewrites the request so that the engine
// serves them from chunk caches, BEFORE the engine sees it:
//
//   message content  = [before][P1]\n\n[P2]\n\n ... [Pm]\n\n[after]
//   laid-out prompt  = S:[template .. message start][before]  chunks: [P1\n\n] .. [Pm\n\n]
//                      U:[after][template .. assistant header]
//
// The chunks stay where the passages were (not moved into the slot between the last user
// message's header and its content, as `documents` are), and each chunk's text is the
// passage plus "\n\n", the separator that followed it, so the laid-out text is the plain
// prompt's own text whenever every separator between passages is exactly one blank line
// "\n\n" and some text follows the last passage (other separators, "\n\n\n" or
// "\r\n\r\n", are normalized to "\n\n"). Only token boundaries at chunk edges can differ
// from the plain prompt's tokenization (tests/serve/test_passage_matching.cpp checks they
// do not on the usual shapes).
//
// Rules (README "Chunk reuse for unmodified RAG clients"):
//  - Paragraphs are maximal runs of non-blank lines; a blank line holds only spaces, tabs
//    or '\r'. A passage is a paragraph of at least `min_chars` bytes, or a registered
//    chunk's text (POST /v1/chunks, the knowledge base) found verbatim at a paragraph start
//    and ending at a paragraph end (it may span several paragraphs).
//  - A run of shorter paragraphs between two passages is its own small chunk ("glue"), so a
//    passage's chunk never depends on its neighbours; shorter paragraphs before the first
//    passage stay in S, those after the last in U.
//  - The last paragraph of the last user message (and of a /v1/completions prompt) is never
//    a passage: that is where clients put the question, and U must hold the question (the
//    selectors probe with it; it is computed in full).
//  - One message is split: the last user message when it holds a passage, else the latest
//    earlier system or user message that does (LangChain's stuff chain puts the context in
//    the system message).
//  - At most `max_chunks` chunks (the server's --max-documents); the rest stays text in U.
//  - Matching work is linear in the message: one pass to find paragraphs, one 64-bit hash
//    per paragraph, one hash-map lookup per paragraph for registered texts (indexed by the
//    hash of their first paragraph), and byte-wise verification of candidates capped at
//    `work_factor` x the message's bytes (+ 64 KiB) in total; a candidate is accepted only
//    when every byte equals, so near-duplicates never match each other's chunk.
//
// Compared with LMCache's blend server (a peer; its design, not its code): it hashes fixed
// token blocks anywhere in the prompt, so a chunk whose edges fall inside a block loses the
// reuse of that block (about 11% at document boundaries, its authors report); here chunk
// edges are the passages' own edges, so a passage seen before always hits, whatever its
// position and neighbours, at the price of finding only blank-line-aligned passages.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "serve/request.h"

namespace cf {

class ChunkRegistry;

struct PassageMatchOptions {
  size_t min_chars = 128;      // a paragraph shorter than this (bytes) is not a passage
  size_t max_chunks = 64;      // chunks one request may get (passages + glue)
  size_t max_documents = 64;   // the engine's documents per request (EngineOptions), which caps max_chunks
  size_t work_factor = 4;      // verification bytes allowed per message byte (+ kWorkSlack)
  static constexpr size_t kWorkSlack = 64 * 1024;
  static constexpr size_t kCandidatesPerHash = 8;  // registered texts kept per first-paragraph hash
};

// Registered chunk texts by the hash of their first paragraph, longest first.
class RegisteredTextIndex {
 public:
  void build(const std::vector<std::string>& texts);
  const std::vector<std::shared_ptr<const std::string>>* candidates(uint64_t first_paragraph_hash) const;
  bool empty() const { return by_hash_.empty(); }

 private:
  std::unordered_map<uint64_t, std::vector<std::shared_ptr<const std::string>>> by_hash_;
};

// One passage or glue chunk found in a text: bytes [begin, end).
struct MatchedSpan {
  size_t begin = 0, end = 0;
  bool registered = false;  // a registered chunk's text
  bool glue = false;        // short paragraphs between two passages
};

struct TextMatch {
  std::vector<MatchedSpan> chunks;  // in text order
  size_t before_end = 0;            // text[0, before_end) stays before the chunks
  size_t after_begin = 0;           // text[after_begin, end) stays after them
  size_t paragraphs = 0;
  size_t work_bytes = 0;            // bytes hashed + bytes compared (the bound's subject)
  size_t passages() const;          // chunks that are not glue
};

// Finds the passages of `text`. keep_last: its last paragraph stays text (the question).
TextMatch match_text(std::string_view text, const RegisteredTextIndex& index, const PassageMatchOptions& opt,
                     bool keep_last);

// The server side: decides whether a request is matched and rewrites it (documents +
// inline_passages). Thread-safe; rebuilds its registered-text index when the engine's
// registry changes.
class KeyIsolation;

class PassageMatcher {
 public:
  PassageMatcher(const ChunkRegistry& registry, PassageMatchOptions opt);
  // Rewrites `req` when it has no documents, no conversation id, a fusion method other
  // than full, and a message (or prompt) with passages; returns whether it did. With
  // `isolation` (--isolate-keys), only the texts `tenant` registered count as registered
  // chunks (issue 59): one index per key, rebuilt when that key's claims change.
  bool apply(CompletionRequest& req, const KeyIsolation* isolation = nullptr, size_t tenant = 0);

  // Passages in a message before the last one (a system message, say) are matched the first
  // time that prompt prefix is seen only: when the same messages up to it come again, the
  // request is left plain, so the exact prefix cache serves them (the bench found --match-chunks
  // on a shared 2K-token system message 6x slower than the prefix cache: 1.2 s against 0.2 s
  // TTFT, fusing the same passages on every request). Bounded: the newest kSeenPrefixes.
  static constexpr size_t kSeenPrefixes = 4096;

 private:
  // Whether the prefix (tenant, messages[0..k]) was seen before; records it when not.
  bool seen_before(const CompletionRequest& req, size_t k, size_t tenant);
  std::shared_ptr<const RegisteredTextIndex> index();
  std::shared_ptr<const RegisteredTextIndex> index_of(const KeyIsolation& isolation, size_t tenant);
  struct TenantIndex {
    uint64_t version = ~uint64_t{0};
    std::shared_ptr<const RegisteredTextIndex> index;
  };
  std::unordered_map<size_t, TenantIndex> tenants_;  // by API key index (bounded by the keys)
  const ChunkRegistry& registry_;
  PassageMatchOptions opt_;
  std::mutex mu_;
  uint64_t version_ = ~uint64_t{0};
  std::shared_ptr<const RegisteredTextIndex> index_;
  std::unordered_set<uint64_t> seen_;  // hashes of prompt prefixes matched once
  std::deque<uint64_t> seen_order_;    // oldest first, for the bound
};

// The engine's layout of a request that passage matching rewrote: S = the prompt up to the
// first chunk, U = the rest after the last chunk (the chunks are the request's documents).
// Message contents are encoded with special-token parsing off, as encode_chat_prompt does.
void lay_out_inline_passages(const Tokenizer& tok, const ChatTemplate& tmpl, const CompletionRequest& req,
                             std::vector<TokenId>& system, std::vector<TokenId>& suffix);

// The response's chunkfuse.passages object.
nlohmann::json passages_report(const InlinePassages& p, const CompletionResult& r);

}  // namespace cf
