// Passage matching (issue 27): see passage_matching.h for the rules and the layout.
#include "serve/passage_matching.h"

#include "serve/key_isolation.h"

#include <xxhash.h>

#include <algorithm>

#include "fusion/rag_prompt.h"
#include "model/tokenizer.h"
#include "serve/chunk_registry.h"

namespace cf {
namespace {

struct Paragraph {
  size_t begin, end;  // bytes; end excludes the '\n' that ends its last line
};

bool blank_line(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

// Maximal runs of non-blank lines, in one pass over the text.
std::vector<Paragraph> paragraphs_of(std::string_view t) {
  std::vector<Paragraph> out;
  bool in = false;
  size_t pb = 0, pe = 0, line = 0;
  for (;;) {
    const size_t nl = t.find('\n', line);
    const size_t line_end = nl == std::string_view::npos ? t.size() : nl;
    if (!blank_line(t.substr(line, line_end - line))) {
      if (!in) pb = line;
      in = true;
      pe = line_end;
    } else if (in) {
      out.push_back({pb, pe});
      in = false;
    }
    if (nl == std::string_view::npos) break;
    line = nl + 1;
  }
  if (in) out.push_back({pb, pe});
  return out;
}

uint64_t hash_of(std::string_view s) { return XXH3_64bits(s.data(), s.size()); }

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

RequestError bad_layout(const std::string& message) {
  return invalid_request(message, "messages");
}

}  // namespace

void RegisteredTextIndex::build(const std::vector<std::string>& texts) {
  by_hash_.clear();
  for (const auto& t : texts) {
    // Only texts that start and end with a non-space byte can equal a paragraph-aligned span.
    if (t.empty() || is_space(t.front()) || is_space(t.back())) continue;
    const auto paras = paragraphs_of(t);
    if (paras.empty() || paras.front().begin != 0) continue;
    auto& bucket = by_hash_[hash_of(std::string_view(t).substr(0, paras.front().end))];
    bucket.push_back(std::make_shared<const std::string>(t));
  }
  for (auto& [h, bucket] : by_hash_) {
    std::sort(bucket.begin(), bucket.end(), [](const auto& a, const auto& b) { return a->size() > b->size(); });
    bucket.erase(std::unique(bucket.begin(), bucket.end(), [](const auto& a, const auto& b) { return *a == *b; }),
                 bucket.end());
    if (bucket.size() > PassageMatchOptions::kCandidatesPerHash) bucket.resize(PassageMatchOptions::kCandidatesPerHash);
  }
}

const std::vector<std::shared_ptr<const std::string>>* RegisteredTextIndex::candidates(uint64_t h) const {
  auto it = by_hash_.find(h);
  return it == by_hash_.end() ? nullptr : &it->second;
}

size_t TextMatch::passages() const {
  return static_cast<size_t>(std::count_if(chunks.begin(), chunks.end(), [](const MatchedSpan& s) { return !s.glue; }));
}

TextMatch match_text(std::string_view t, const RegisteredTextIndex& index, const PassageMatchOptions& opt,
                     bool keep_last) {
  TextMatch m;
  const std::vector<Paragraph> paras = paragraphs_of(t);
  m.paragraphs = paras.size();
  m.before_end = m.after_begin = t.size();
  const size_t usable = keep_last && !paras.empty() ? paras.size() - 1 : paras.size();
  const size_t budget = opt.work_factor * t.size() + PassageMatchOptions::kWorkSlack;
  size_t compared = t.size();  // the paragraph scan; then bytes hashed and compared
  // Registered text starting at paragraph j: the index of its last paragraph, or npos.
  auto registered_at = [&](size_t j) -> size_t {
    const Paragraph& p = paras[j];
    if (index.empty() || compared + (p.end - p.begin) > budget) return std::string::npos;
    compared += p.end - p.begin;  // hashing it
    const auto* cands = index.candidates(hash_of(t.substr(p.begin, p.end - p.begin)));
    if (!cands) return std::string::npos;
    for (const auto& c : *cands) {
      if (p.begin + c->size() > t.size()) continue;
      const size_t end = p.begin + c->size();
      // Must end at a paragraph end within the usable ones: binary search, no byte work.
      auto it = std::lower_bound(paras.begin() + static_cast<std::ptrdiff_t>(j), paras.begin() + static_cast<std::ptrdiff_t>(usable),
                                 end, [](const Paragraph& q, size_t e) { return q.end < e; });
      if (it == paras.begin() + static_cast<std::ptrdiff_t>(usable) || it->end != end) continue;
      if (compared + c->size() > budget) return std::string::npos;
      compared += c->size();
      if (t.compare(p.begin, c->size(), *c) == 0) return static_cast<size_t>(it - paras.begin());
    }
    return std::string::npos;
  };

  size_t glue_from = std::string::npos;  // first short paragraph after the last passage
  size_t next_after = std::string::npos;  // paragraph index after the last chunk
  for (size_t j = 0; j < usable && m.chunks.size() < opt.max_chunks; ++j) {
    const Paragraph& p = paras[j];
    size_t last = registered_at(j);
    const bool registered = last != std::string::npos;
    if (!registered && p.end - p.begin >= opt.min_chars) last = j;
    if (last == std::string::npos) {  // a short paragraph: S, glue, or U
      if (!m.chunks.empty() && glue_from == std::string::npos) glue_from = j;
      continue;
    }
    if (glue_from != std::string::npos) {
      if (m.chunks.size() + 2 > opt.max_chunks) break;  // no room for the glue and the passage
      m.chunks.push_back({paras[glue_from].begin, paras[j - 1].end, false, true});
      glue_from = std::string::npos;
    }
    if (m.chunks.empty()) m.before_end = p.begin;
    m.chunks.push_back({p.begin, paras[last].end, registered, false});
    next_after = last + 1;
    j = last;
  }
  m.work_bytes = compared;
  if (m.chunks.empty()) {
    m.before_end = m.after_begin = t.size();
    return m;
  }
  m.after_begin = next_after < paras.size() ? paras[next_after].begin : t.size();
  return m;
}

PassageMatcher::PassageMatcher(const ChunkRegistry& registry, PassageMatchOptions opt) : registry_(registry), opt_(opt) {}

std::shared_ptr<const RegisteredTextIndex> PassageMatcher::index() {
  std::lock_guard lk(mu_);
  const uint64_t v = registry_.version();
  if (!index_ || v != version_) {
    auto idx = std::make_shared<RegisteredTextIndex>();
    idx->build(registry_.texts());
    index_ = std::move(idx);
    version_ = v;
  }
  return index_;
}

std::shared_ptr<const RegisteredTextIndex> PassageMatcher::index_of(const KeyIsolation& isolation, size_t tenant) {
  std::lock_guard lk(mu_);
  TenantIndex& t = tenants_[tenant];
  const uint64_t v = isolation.version();
  if (!t.index || v != t.version) {
    auto idx = std::make_shared<RegisteredTextIndex>();
    idx->build(isolation.texts_of(tenant));
    t.index = std::move(idx);
    t.version = v;
  }
  return t.index;
}

bool PassageMatcher::apply(CompletionRequest& req, const KeyIsolation* isolation, size_t tenant) {
  if (!req.documents.empty() || !req.fusion.conversation_id.empty() || req.fusion.options.full()) return false;
  if (req.chat && (req.messages.empty() || req.messages.back().role != "user")) return false;  // the engine's 400
  const auto idx = isolation ? index_of(*isolation, tenant) : index();
  PassageMatchOptions opt = opt_;
  opt.max_chunks = std::min(opt.max_chunks, opt.max_documents);
  if (opt.max_chunks == 0) return false;

  auto rewrite = [&](const std::string& text, size_t message, const TextMatch& m) {
    InlinePassages ip;
    ip.message = message;
    ip.before = text.substr(0, m.before_end);
    ip.after = text.substr(m.after_begin);
    for (const MatchedSpan& s : m.chunks) {
      req.documents.push_back({text.substr(s.begin, s.end - s.begin), ""});
      ip.registered += s.registered ? 1 : 0;
      ip.glue += s.glue ? 1 : 0;
    }
    ip.passages = m.chunks.size() - ip.glue;
    req.inline_passages = std::move(ip);
    return true;
  };

  if (!req.chat) {
    const TextMatch m = match_text(req.prompt, *idx, opt, /*keep_last=*/true);
    return !m.chunks.empty() && rewrite(req.prompt, 0, m);
  }
  const size_t last = req.messages.size() - 1;
  for (size_t k = last + 1; k-- > 0;) {
    const ChatMessage& msg = req.messages[k];
    if (msg.role != "user" && msg.role != "system") continue;
    const TextMatch m = match_text(msg.content, *idx, opt, /*keep_last=*/k == last);
    if (m.chunks.empty()) continue;
    if (k != last && seen_before(req, k, isolation ? tenant : 0)) return false;  // the prefix cache's
    return rewrite(msg.content, k, m);
  }
  return false;
}

bool PassageMatcher::seen_before(const CompletionRequest& req, size_t k, size_t tenant) {
  XXH3_state_t* st = XXH3_createState();
  if (!st) return false;
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, &tenant, sizeof tenant);
  for (size_t i = 0; i <= k; ++i) {  // role and content, each with its length (no ambiguity)
    for (const std::string* part : {&req.messages[i].role, &req.messages[i].content}) {
      const uint64_t n = part->size();
      XXH3_64bits_update(st, &n, sizeof n);
      XXH3_64bits_update(st, part->data(), part->size());
    }
  }
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  std::lock_guard lk(mu_);
  if (seen_.count(h)) return true;
  seen_.insert(h);
  seen_order_.push_back(h);
  if (seen_order_.size() > kSeenPrefixes) {
    seen_.erase(seen_order_.front());
    seen_order_.pop_front();
  }
  return false;
}

void lay_out_inline_passages(const Tokenizer& tok, const ChatTemplate& tmpl, const CompletionRequest& req,
                             std::vector<TokenId>& system, std::vector<TokenId>& suffix) {
  const InlinePassages& ip = *req.inline_passages;
  auto append = [](std::vector<TokenId>& to, const std::vector<TokenId>& more) {
    to.insert(to.end(), more.begin(), more.end());
  };
  if (!req.chat) {  // a raw prompt: BOS (when the vocabulary wants one), before | chunks | after
    system = tok.encode(ip.before, /*add_special=*/true, /*parse_special=*/false);
    suffix = tok.encode(ip.after, false, false);
    if (suffix.empty()) throw invalid_request("prompt has no tokens after its passages", "prompt");
    return;
  }
  if (ip.message >= req.messages.size()) throw bad_layout("passage matching named a message the request does not have");
  // The prompt around the split message, as a plain request's (contents never special tokens,
  // issue 29 item 5); that message's own text is laid out here, around its passages.
  std::vector<ChatMessage> msgs = req.messages;
  msgs[ip.message].content.clear();
  ChatPromptTokens around = encode_chat_prompt(tok, tmpl, msgs, ip.message);
  // The template's treatment of the whole content (Llama 3 strips it) applied to its ends:
  // "x" stands in for the passages between them.
  std::string before = ip.before, after = ip.after;
  if (tmpl.from_file()) {
    before = tmpl.content_text(before + "x");
    before.pop_back();
    after = tmpl.content_text("x" + after);
    after.erase(0, 1);
  }
  system = std::move(around.before);
  append(system, tok.encode(before, false, false));
  suffix = tok.encode(after, false, false);
  append(suffix, around.after);
  if (suffix.empty()) throw bad_layout("the prompt has no tokens after its passages");
}

nlohmann::json passages_report(const InlinePassages& p, const CompletionResult& r) {
  // hit/computed count every chunk the request got (glue included): the executor's store
  // lookups, a chunk computed in this request counts as computed.
  return nlohmann::json{{"matched", p.passages},
                        {"registered", p.registered},
                        {"glue", p.glue},
                        {"hit", r.chunk_hits},
                        {"computed", r.chunk_misses},
                        {"message", p.message}};
}

}  // namespace cf
