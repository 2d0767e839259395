#include "fusion/fusionrag_enrich.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

#include "base/clock.h"
#include "fusion/bm25.h"

namespace cf {
namespace {

Passage passage_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
    throw std::runtime_error(where + ": expected an object with a string \"text\"");
  Passage p;
  p.text = j["text"].get<std::string>();
  if (j.contains("title") && j["title"].is_string()) p.title = j["title"].get<std::string>();
  return p;
}

}  // namespace

nlohmann::json FusionRagLink::to_json() const {
  return {{"enriched", enriched_id},
          {"variant", hash128_hex(context_hash)},
          {"system", system},
          {"neighbours", neighbours},
          {"enrich_ms", enrich_ms}};
}

std::optional<FusionRagLink> FusionRagLink::from_json(const nlohmann::json& j) {
  try {
    if (!j.is_object()) return std::nullopt;
    FusionRagLink l;
    l.enriched_id = j.at("enriched").get<std::string>();
    Hash128 id;
    if (!parse_hash128_hex(l.enriched_id, id)) return std::nullopt;
    if (!parse_hash128_hex(j.at("variant").get<std::string>(), l.context_hash)) return std::nullopt;
    l.system = j.at("system").get<std::vector<TokenId>>();
    l.neighbours = j.at("neighbours").get<std::vector<std::string>>();
    for (const auto& n : l.neighbours)
      if (!parse_hash128_hex(n, id)) return std::nullopt;
    l.enrich_ms = j.value("enrich_ms", 0.0);
    return l;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

std::optional<FusionRagLink> fusionrag_link(const ChunkCache& pic) {
  if (!pic.extra.is_object() || !pic.extra.contains(kFusionRagExtraKey)) return std::nullopt;
  return FusionRagLink::from_json(pic.extra[kFusionRagExtraKey]);
}

ChunkKey fusionrag_enriched_key(const ChunkKey& pic_key, std::span<const TokenId> system,
                                std::span<const ChunkKey> neighbours) {
  return ChunkKey(pic_key.model_fingerprint(), pic_key.tokens(), KeyContext::neighbours(system, neighbours));
}

ChunkCache compute_enriched_cache(Forward& fwd, const KvCache& system_kv, std::span<const TokenId> system,
                                  const ChunkCache& pic, std::span<const std::shared_ptr<const ChunkCache>> neighbours,
                                  KvCache& scratch) {
  if (system_kv.size() != system.size())
    throw std::invalid_argument("compute_enriched_cache: S cache holds " + std::to_string(system_kv.size()) +
                                " entries for " + std::to_string(system.size()) + " tokens");
  const double t0 = now_ms();
  std::vector<ChunkKey> keys;
  keys.reserve(neighbours.size());
  for (const auto& n : neighbours) keys.push_back(n->key);
  const ChunkKey key = fusionrag_enriched_key(pic.key, system, keys);
  scratch.clear();
  scratch.append_from(system_kv, 0, system_kv.size(), 0);
  for (const auto& n : neighbours) {  // TurboRAG-consecutive: N_1 right after S, then N_2, ...
    const int32_t delta = static_cast<int32_t>(scratch.size()) - (n->kv.size() ? n->kv.position(0) : 0);
    scratch.append_from(n->kv, 0, n->kv.size(), delta);
  }
  ChunkCache c = compute_chunk_cache_in_context(fwd, key, scratch, static_cast<int32_t>(scratch.size()));
  c.offline_ms = now_ms() - t0;
  return c;
}

std::string fusionrag_index_path(const ChunkStore& store) {
  return store.options().dir.empty() ? "" : store.options().dir + "/fusionrag_index.json";
}

std::map<std::string, FusionRagLink> read_fusionrag_index(const std::string& path) {
  std::map<std::string, FusionRagLink> out;
  std::ifstream in(path);
  if (!in) return out;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || j.value("version", 0) != 1 || !j.contains("links") || !j["links"].is_object()) return out;
  for (const auto& [id, link] : j["links"].items())
    if (auto l = FusionRagLink::from_json(link)) out.emplace(id, std::move(*l));
  return out;
}

void merge_fusionrag_index(const std::string& path, const std::map<std::string, FusionRagLink>& links) {
  const std::string lock_path = path + ".lock";
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error(lock_path + ": cannot open");
  ::flock(fd, LOCK_EX);  // released by close, also when this throws
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  auto all = read_fusionrag_index(path);
  for (const auto& [id, l] : links) all[id] = l;
  nlohmann::json j = {{"version", 1}, {"links", nlohmann::json::object()}};
  for (const auto& [id, l] : all) j["links"][id] = l.to_json();
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(std::random_device{}());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump();
    if (!out.flush()) throw std::runtime_error(tmp + ": write failed");
  }
  std::filesystem::rename(tmp, path);  // readers see the old file or the new one, never half
}

namespace {
// The index file as this process last read it, re-read when it changes on disk.
std::optional<FusionRagLink> indexed_link(const std::string& path, const std::string& pic_id) {
  static std::mutex mu;
  static std::map<std::string, std::pair<std::filesystem::file_time_type, std::map<std::string, FusionRagLink>>> memo;
  std::error_code ec;
  const auto mtime = std::filesystem::last_write_time(path, ec);
  if (ec) return std::nullopt;
  std::lock_guard lock(mu);
  auto it = memo.find(path);
  if (it == memo.end() || it->second.first != mtime)
    it = memo.insert_or_assign(path, std::make_pair(mtime, read_fusionrag_index(path))).first;
  auto l = it->second.second.find(pic_id);
  if (l == it->second.second.end()) return std::nullopt;
  return l->second;
}
}  // namespace

std::shared_ptr<const ChunkCache> find_enriched(ChunkStore& store, const ChunkKey& pic_key,
                                                std::span<const TokenId> system, std::string* why) {
  auto say = [&](const char* reason) {
    if (why) *why = reason;
    return nullptr;
  };
  // Fast path: the index file names the enriched entry without loading the PIC.
  const std::string index = fusionrag_index_path(store);
  if (!index.empty())
    if (const auto link = indexed_link(index, pic_key.id());
        link && std::equal(link->system.begin(), link->system.end(), system.begin(), system.end())) {
      const ChunkKey key(pic_key.model_fingerprint(), pic_key.tokens(), {ContextKind::neighbours, link->context_hash});
      if (key.id() == link->enriched_id)
        if (auto enriched = store.get(key)) return enriched;
    }
  auto pic = store.get(pic_key);
  if (!pic) return say("no PIC cache");
  const auto link = fusionrag_link(*pic);
  if (!link) return say("not enriched");
  if (!std::equal(link->system.begin(), link->system.end(), system.begin(), system.end()))
    return say("enriched after another system prefix");
  const ChunkKey key(pic_key.model_fingerprint(), pic_key.tokens(), {ContextKind::neighbours, link->context_hash});
  if (key.id() != link->enriched_id) return say("link does not match its key");
  auto enriched = store.get(key);
  if (!enriched) return say("enriched entry missing");
  return enriched;
}

std::vector<Passage> read_corpus_passages(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open");
  char first = 0;
  while (in.get(first) && std::isspace(static_cast<unsigned char>(first))) {
  }
  if (first != '[') return read_passages_jsonl(path);
  in.seekg(0);
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(path + ": not valid JSON (" + e.what() + ")");
  }
  std::vector<Passage> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string where = path + "[" + std::to_string(i) + "]";
    const auto& e = j[i];
    if (e.is_object() && e.contains("ctxs") && e["ctxs"].is_array()) {
      for (size_t c = 0; c < e["ctxs"].size(); ++c)
        out.push_back(passage_from_json(e["ctxs"][c], where + ".ctxs[" + std::to_string(c) + "]"));
    } else {
      out.push_back(passage_from_json(e, where));
    }
  }
  return out;
}

std::vector<CorpusChunk> corpus_chunks(const Model& model, const std::vector<Passage>& passages,
                                       const RagPromptOptions& opt) {
  std::vector<CorpusChunk> out;
  out.reserve(passages.size());
  for (const auto& p : passages) {
    CorpusChunk c;
    c.text = passage_text(p, opt);
    c.tokens = model.tokenizer().encode(c.text, false, false);  // as build_rag_request
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<TokenId> default_system_tokens(const Model& model, const RagPromptOptions& opt) {
  return build_rag_request(model, {}, "", opt).system;
}

EnrichReport enrich_corpus(Forward& fwd, ChunkStore& store, const std::vector<CorpusChunk>& corpus,
                           const EnrichOptions& opt) {
  EnrichReport rep;
  rep.chunks = corpus.size();
  const uint64_t fp = fwd.model().fingerprint();

  // Unique non-empty chunks: the corpus the similarity search runs over.
  std::vector<ChunkKey> keys;
  std::vector<std::vector<std::string>> terms;
  std::unordered_map<std::string, size_t> seen;
  for (const auto& c : corpus) {
    if (c.tokens.empty()) {
      ++rep.duplicates_or_empty;
      continue;
    }
    ChunkKey k = base_chunk_key(fp, c.tokens, opt.chunk_context, opt.system);
    if (!seen.emplace(k.id(), keys.size()).second) {
      ++rep.duplicates_or_empty;
      continue;
    }
    keys.push_back(std::move(k));
    terms.push_back(bm25_terms(c.text));
  }
  rep.unique = keys.size();
  const size_t targets = std::min(opt.limit, keys.size());

  const double t_sim = now_ms();
  const Bm25Index index(terms);
  std::vector<std::vector<size_t>> neigh(targets);
  for (size_t d = 0; d < targets; ++d)
    for (const auto& [doc, s] : index.top(terms[d], opt.neighbours, d)) neigh[d].push_back(doc);
  rep.similarity_ms = now_ms() - t_sim;

  auto compute_pic = [&](const ChunkKey& k) {
    ChunkCache c = compute_chunk_cache(fwd, k, base_chunk_prefix(opt.chunk_context, opt.system));
    rep.pic_ms += c.offline_ms;
    ++rep.pic_computed;
    return c;
  };

  // Pass 1: the PIC caches the targets and their neighbours need (eq. 10's KV^cached).
  std::vector<char> needed(keys.size(), 0);
  for (size_t d = 0; d < targets; ++d) {
    needed[d] = 1;
    for (size_t n : neigh[d]) needed[n] = 1;
  }
  const size_t n_needed = static_cast<size_t>(std::count(needed.begin(), needed.end(), 1));
  size_t done = 0;
  for (size_t d = 0; d < keys.size(); ++d) {
    if (!needed[d]) continue;
    if (store.contains(keys[d]))
      ++rep.pic_present;  // validated when pass 2 reads it; a bad file is recomputed there
    else
      store.put(compute_pic(keys[d]));
    if (opt.progress) opt.progress("pic", ++done, n_needed);
  }

  // S's own K/V at 0..|S|-1, shared by every enriched context.
  KvCache system_kv(fwd.model().hparams(), opt.system.size());
  if (!opt.system.empty()) {
    std::vector<int32_t> pos(opt.system.size());
    std::iota(pos.begin(), pos.end(), 0);
    fwd.run(system_kv, {opt.system, pos, {}, {}});
  }

  // Pass 2: the enriched caches.
  std::map<std::string, FusionRagLink> links;  // for the index file
  KvCache scratch(fwd.model().hparams());
  for (size_t d = 0; d < targets; ++d) {
    if (neigh[d].empty()) {
      ++rep.no_neighbours;
    } else {
      auto pic = store.get_or_compute(keys[d], [&] { return compute_pic(keys[d]); });
      std::vector<std::shared_ptr<const ChunkCache>> nb;
      std::vector<ChunkKey> nb_keys;
      for (size_t n : neigh[d]) {
        nb.push_back(store.get_or_compute(keys[n], [&] { return compute_pic(keys[n]); }));
        nb_keys.push_back(keys[n]);
      }
      const ChunkKey ekey = fusionrag_enriched_key(keys[d], opt.system, nb_keys);
      const auto old = fusionrag_link(*pic);
      if (old && old->enriched_id == ekey.id() && store.contains(ekey)) {
        ++rep.enriched_present;
        links.emplace(keys[d].id(), *old);
      } else {
        ChunkCache c = compute_enriched_cache(fwd, system_kv, opt.system, *pic, nb, scratch);
        FusionRagLink link;
        link.enriched_id = c.key.id();
        link.context_hash = c.key.context().context_hash;
        link.system = opt.system;
        for (const auto& k : nb_keys) link.neighbours.push_back(k.id());
        link.enrich_ms = c.offline_ms;
        rep.enrich_ms.push_back(c.offline_ms);
        rep.enriched_tokens += c.n_tokens();
        rep.context_tokens += scratch.size();
        c.extra[kFusionRagExtraKey] = {{"pic", keys[d].id()}, {"neighbours", link.neighbours}};
        store.put(std::move(c));
        links.emplace(keys[d].id(), link);
        ChunkCache linked = *pic;  // same K/V, the link added to its metadata
        linked.extra[kFusionRagExtraKey] = link.to_json();
        store.put(std::move(linked));
        ++rep.enriched;
      }
    }
    if (opt.progress) opt.progress("enrich", d + 1, targets);
  }
  if (const std::string index = fusionrag_index_path(store); !index.empty() && !links.empty())
    merge_fusionrag_index(index, links);
  return rep;
}

EnrichReport enrich_request_chunks(Forward& fwd, ChunkStore& store, const RagRequest& request,
                                   const std::vector<CorpusChunk>& knowledge_base, ChunkContext chunk_context) {
  std::vector<CorpusChunk> corpus;
  std::set<std::string> own_ids;
  for (const auto& c : request.chunks) {
    corpus.push_back({fwd.model().tokenizer().decode(c, false), c});
    if (!c.empty()) own_ids.insert(ChunkKey(fwd.model().fingerprint(), c).id());
  }
  corpus.insert(corpus.end(), knowledge_base.begin(), knowledge_base.end());
  EnrichOptions eo;
  eo.system = request.system;
  eo.chunk_context = chunk_context;
  eo.limit = own_ids.size();  // enrich_corpus keeps first occurrences: the request's chunks
  return enrich_corpus(fwd, store, corpus, eo);
}

}  // namespace cf
