#include "serve/knowledge_base.h"

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "fusion/bm25.h"
#include "kv/cache_file.h"
#include "kv/store_paths.h"
#include "model/tokenizer.h"
#include "serve/chunk_cache_state.h"
#include "serve/chunking.h"
#include "serve/engine.h"
#include "serve/knowledge_base_file.h"
#include "serve/store_write.h"

namespace cf {

using nlohmann::json;

namespace {

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

json RetrievedChunk::to_json() const {
  return {{"chunk_id", chunk_id}, {"document_id", document_id}, {"source", source},  {"cache_id", cache_id},
          {"score", score},       {"n_tokens", n_tokens},       {"text", text}};
}

const Tokenizer& KnowledgeBase::tokenizer() const { return engine_.tokenizer(); }
size_t KnowledgeBase::max_documents() const { return engine_.options().max_documents; }

KnowledgeBase::KnowledgeBase(Engine& engine, KnowledgeBaseOptions opt)
    : engine_(engine),
      opt_(std::move(opt)),
      pdf_gate_(std::max<size_t>(1, opt_.max_pdf_jobs), std::chrono::milliseconds(opt_.pdf_wait_ms), "reading PDFs") {
  load();
  thread_ = std::thread([this] { worker(); });
}

KnowledgeBase::~KnowledgeBase() {
  {
    std::lock_guard lk(mu_);
    if (dirty_) save_locked();  // the use counts not saved yet
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

json KnowledgeBase::add_document(const std::string& name, const std::string& format, std::string_view bytes,
                                 size_t chunk_tokens) {
  if (chunk_tokens == 0) chunk_tokens = opt_.default_chunk_tokens;
  if (chunk_tokens < 16 || chunk_tokens > opt_.max_chunk_tokens)
    throw invalid_request("chunk_tokens must be between 16 and " + std::to_string(opt_.max_chunk_tokens), "chunk_tokens");
  const std::string text = extract_text(format, bytes);
  const Tokenizer& tok = engine_.tokenizer();
  auto count = [&](std::string_view s) { return tok.encode(s, false, false).size(); };
  std::vector<std::string> pieces;
  std::vector<size_t> n_tokens;
  {
    const BusyGate::Slot slot = engine_.tokenize_gate().enter();  // 503 server_busy when none frees
    pieces = split_into_chunks(text, chunk_tokens, count);
    for (const auto& p : pieces) n_tokens.push_back(count(p));
  }
  if (pieces.empty()) throw invalid_request("the document holds no text", "file");

  size_t piece_bytes = 0;
  for (const auto& p : pieces) piece_bytes += p.size();
  std::lock_guard lk(mu_);
  check_room_locked(pieces.size(), piece_bytes);
  Document d;
  char id[32];
  std::snprintf(id, sizeof id, "doc-%06llu", static_cast<unsigned long long>(next_document_ + 1));
  d.id = id;
  d.name = name;
  d.format = format;
  d.bytes = bytes.size();
  d.chunk_tokens = chunk_tokens;
  d.created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::map<std::string, Chunk> fresh;
  for (size_t i = 0; i < pieces.size(); ++i) {
    Chunk c;
    c.id = d.id + "-" + std::to_string(i);
    c.document_id = d.id;
    c.index = i;
    c.n_tokens = n_tokens[i];
    c.summary = first_sentence(pieces[i]);
    c.hash = hex64(XXH3_64bits(pieces[i].data(), pieces[i].size()));
    c.terms = bm25_terms(pieces[i]);
    c.text = std::move(pieces[i]);
    d.chunk_ids.push_back(c.id);
    fresh.emplace(c.id, std::move(c));
  }
  // Write, then commit (issue 59): the file with the new document first; a full disk refuses
  // the upload (507) with nothing changed in memory.
  SavedKnowledgeBase next = saved_locked({});
  next.next_document = next_document_ + 1;
  next.documents.push_back(saved_document(d, [&](const std::string& cid) { return &fresh.at(cid); }));
  write_file(next);
  ++next_document_;
  for (auto& [cid, c] : fresh) add_chunk_locked(std::move(c));
  queue_.insert(queue_.end(), d.chunk_ids.begin(), d.chunk_ids.end());
  auto [it, _] = documents_.emplace(d.id, std::move(d));
  cv_.notify_all();
  return document_json_locked(it->second);
}

// No exception ends this thread (and with it the process): a chunk whose registration a full
// disk refused is queued again and retried kRetryAfter later; anything else is logged, counted
// (background_failures) and the next chunk goes on.
std::string KnowledgeBase::extract_text(const std::string& format, std::string_view bytes) {
  if (format != "pdf") return extract_document_text(format, bytes, opt_.extract);
  const BusyGate::Slot slot = pdf_gate_.enter();  // one pdftotext process per slot (issue 59)
  return extract_document_text(format, bytes, opt_.extract);
}

void KnowledgeBase::worker() {
  std::unique_lock lk(mu_);
  for (;;) {
    rethink_ = false;
    const auto ready = [&] { return stop_ || !queue_.empty() || rethink_; };
    std::optional<std::chrono::steady_clock::time_point> deadline;
    if (!retry_.empty()) deadline = retry_at_;
    if (dirty_) deadline = deadline ? std::min(*deadline, save_at_) : save_at_;
    if (deadline) cv_.wait_until(lk, *deadline, ready);
    else cv_.wait(lk, ready);
    if (stop_) return;
    const auto now = std::chrono::steady_clock::now();
    if (!retry_.empty() && now >= retry_at_) {
      queue_.insert(queue_.end(), retry_.begin(), retry_.end());
      retry_.clear();
    }
    if (dirty_ && now >= save_at_) save_locked();
    if (queue_.empty()) continue;
    const std::string id = queue_.front();
    queue_.pop_front();
    try {
      precompute_locked(lk, id);
    } catch (const std::exception& e) {
      if (!lk.owns_lock()) lk.lock();
      busy_ = false;
      note_failure("precomputing " + id, e);
    }
    cv_.notify_all();
  }
}

void KnowledgeBase::precompute_locked(std::unique_lock<std::mutex>& lk, const std::string& id) {
  auto it = chunks_.find(id);
  if (it == chunks_.end()) return;  // deleted while queued
  it->second.state = "computing";
  const std::string text = it->second.text;
  busy_ = true;
  lk.unlock();
  std::string cache_id, error;
  bool refused_write = false;
  try {
    cache_id = engine_.register_chunks({text}).at(0).id;  // the engine's own chunk registration
  } catch (const RequestError& e) {
    error = e.what();
    refused_write = e.status == 507 || e.status == 503;  // the disk is full (or shutting down)
  } catch (const std::exception& e) {
    error = e.what();
  }
  lk.lock();
  busy_ = false;
  it = chunks_.find(id);
  if (it == chunks_.end()) {  // deleted while computing: drop the cache unless shared
    if (!cache_id.empty()) drop_cache_locked(cache_id);
    return;
  }
  it->second.error = error;
  if (refused_write) {
    it->second.state = "queued";
    retry_.push_back(id);
    retry_at_ = std::chrono::steady_clock::now() + kRetryAfter;
    note_failure("registering " + id + " (retried in " + std::to_string(kRetryAfter.count()) + " s)",
                 std::runtime_error(error));
    return;
  }
  it->second.cache_id = cache_id;
  it->second.state = error.empty() ? "ready" : "failed";
  if (!error.empty()) unindex_locked(it->second);  // failed chunks are not retrieved
  if (queue_.empty()) save_locked();  // once per batch of uploads, not per chunk
}

void KnowledgeBase::note_failure(const std::string& what, const std::exception& e) const {
  ++background_failures_;
  std::fprintf(stderr, "chunkfuse serve: knowledge base: %s failed: %s\n", what.c_str(), e.what());
}

void KnowledgeBase::wait_idle() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return stop_ || (queue_.empty() && !busy_); });
}

json KnowledgeBase::chunk_json_locked(const Chunk& c, bool with_text) const {
  const auto d = documents_.find(c.document_id);
  json j{{"id", c.id},       {"document_id", c.document_id}, {"source", d != documents_.end() ? d->second.name : ""},
         {"index", c.index}, {"n_tokens", c.n_tokens},       {"summary", c.summary},
         {"hash", c.hash},   {"cache_id", c.cache_id},       {"state", c.state},
         {"cache", "none"},  {"cache_state", nullptr},       {"uses", c.uses}};
  if (!c.error.empty()) j["error"] = c.error;
  if (with_text) j["text"] = c.text;
  return j;
}

json KnowledgeBase::document_json_locked(const Document& d) const {
  size_t done = 0, failed = 0, tokens = 0;
  for (const auto& id : d.chunk_ids) {
    const Chunk& c = chunks_.at(id);
    done += c.state == "ready" || c.state == "failed";
    failed += c.state == "failed";
    tokens += c.n_tokens;
  }
  const std::string status = done < d.chunk_ids.size() ? "precomputing" : failed ? "failed" : "ready";
  return {{"id", d.id},
          {"object", "document"},
          {"name", d.name},
          {"format", d.format},
          {"bytes", d.bytes},
          {"chunk_tokens", d.chunk_tokens},
          {"created", d.created},
          {"n_chunks", d.chunk_ids.size()},
          {"n_tokens", tokens},
          {"status", status},
          {"progress", {{"done", done}, {"total", d.chunk_ids.size()}, {"failed", failed}}}};
}

json KnowledgeBase::list_documents() const {
  std::lock_guard lk(mu_);
  json data = json::array();
  for (const auto& [id, d] : documents_) data.push_back(document_json_locked(d));
  return {{"object", "list"}, {"data", data}};
}

// The cache state asks the chunk store (and Redis, with a remote tier): done after the
// knowledge base's lock is released, so a slow answer never holds up uploads or retrieval.
void KnowledgeBase::fill_cache_states(json& chunks) const {
  for (auto& c : chunks) {
    const std::string cache_id = c["cache_id"];
    if (cache_id.empty() || c["state"] != "ready") continue;
    json state = chunk_cache_state(engine_.chunk_store(), cache_id);
    c["cache"] = state["disk"] ? "disk" : state["memory"] ? "memory" : "none";
    c["cache_state"] = std::move(state);
  }
}

std::optional<json> KnowledgeBase::document(const std::string& id) const {
  json j;
  {
    std::lock_guard lk(mu_);
    auto it = documents_.find(id);
    if (it == documents_.end()) return std::nullopt;
    j = document_json_locked(it->second);
    j["chunks"] = json::array();
    for (const auto& cid : it->second.chunk_ids) j["chunks"].push_back(chunk_json_locked(chunks_.at(cid), true));
  }
  fill_cache_states(j["chunks"]);
  return j;
}

json KnowledgeBase::list_chunks() const {
  json data = json::array();
  {
    std::lock_guard lk(mu_);
    for (const auto& [did, d] : documents_)
      for (const auto& cid : d.chunk_ids) data.push_back(chunk_json_locked(chunks_.at(cid), false));
  }
  fill_cache_states(data);
  return {{"object", "list"}, {"data", data}};
}

void KnowledgeBase::drop_cache_locked(const std::string& cache_id) {
  // Another chunk with the same text shares the cache: keep it for that one.
  if (std::any_of(chunks_.begin(), chunks_.end(), [&](const auto& kv) { return kv.second.cache_id == cache_id; }))
    return;
  try {
    engine_.remove_chunk(cache_id);  // its cache file goes first (engine.h): room on a full disk
  } catch (const std::exception& e) {
    note_failure("dropping cache " + cache_id, e);
  }
}

void KnowledgeBase::remove_chunks_locked(const std::vector<std::string>& ids) {
  const SavedKnowledgeBase next = saved_locked({ids.begin(), ids.end()});
  try {
    write_file(next);
  } catch (const RequestError& e) {
    if (e.status != 507) throw;
    // A full disk: the chunks' caches (recomputable) make the room the smaller file needs.
    std::vector<std::string> caches;
    for (const auto& cid : ids) caches.push_back(std::exchange(chunks_.at(cid).cache_id, ""));
    for (const auto& cache_id : caches)
      if (!cache_id.empty()) drop_cache_locked(cache_id);
    write_file(next);
  }
  for (const auto& cid : ids) {
    auto it = chunks_.find(cid);
    const std::string cache_id = it->second.cache_id;
    auto d = documents_.find(it->second.document_id);
    unindex_locked(it->second);
    text_bytes_ -= it->second.text.size();
    chunks_.erase(it);
    if (d != documents_.end()) {
      auto& left = d->second.chunk_ids;
      left.erase(std::remove(left.begin(), left.end(), cid), left.end());
      if (left.empty()) documents_.erase(d);  // its last chunk: the document goes too
    }
    if (!cache_id.empty()) drop_cache_locked(cache_id);
  }
}

// Both write the file without the chunks first (write, then commit): a refused write answers
// 507 with the document and its chunks as they were.
bool KnowledgeBase::remove_document(const std::string& id) {
  std::lock_guard lk(mu_);
  auto it = documents_.find(id);
  if (it == documents_.end()) return false;
  remove_chunks_locked(std::vector<std::string>(it->second.chunk_ids));
  return true;
}

bool KnowledgeBase::remove_chunk(const std::string& chunk_id) {
  std::lock_guard lk(mu_);
  if (!chunks_.count(chunk_id)) return false;
  remove_chunks_locked({chunk_id});
  return true;
}

void KnowledgeBase::check_room_locked(size_t n_chunks, size_t n_bytes) const {
  const KnowledgeBaseLimits& l = opt_.limits;
  auto full = [](const std::string& what, const char* flag) {
    throw invalid_request("the knowledge base is full: " + what + " (serve " + flag + "; delete documents first)", "", 409);
  };
  if (documents_.size() >= l.max_documents) full(std::to_string(l.max_documents) + " documents", "--kb-max-documents");
  if (chunks_.size() + n_chunks > l.max_chunks)
    full(std::to_string(chunks_.size()) + " of " + std::to_string(l.max_chunks) + " chunks, this document adds " +
             std::to_string(n_chunks),
         "--kb-max-chunks");
  if (text_bytes_ + n_bytes > l.max_text_bytes)
    full(std::to_string(text_bytes_) + " of " + std::to_string(l.max_text_bytes) + " bytes of text, this document adds " +
             std::to_string(n_bytes),
         "--kb-max-text");
}

void KnowledgeBase::add_chunk_locked(Chunk c) {
  text_bytes_ += c.text.size();
  const std::string id = c.id;
  index_locked(chunks_.emplace(id, std::move(c)).first->second);
}

void KnowledgeBase::index_locked(Chunk& c) {
  if (c.slot != kNotIndexed || c.state == "failed") return;
  c.slot = index_.add(c.terms);
  if (by_slot_.size() <= c.slot) by_slot_.resize(c.slot + 1, nullptr);
  by_slot_[c.slot] = &c;
}

void KnowledgeBase::unindex_locked(Chunk& c) {
  if (c.slot == kNotIndexed) return;
  index_.remove(c.slot, c.terms);
  by_slot_[c.slot] = nullptr;
  c.slot = kNotIndexed;
}

// Scores only the chunks sharing a term with the query (the index's postings); ties go to the
// lower chunk id, as when the index was rebuilt in id order per query.
std::vector<RetrievedChunk> KnowledgeBase::retrieve(const std::string& query, size_t k) const {
  std::lock_guard lk(mu_);
  std::vector<RetrievedChunk> out;
  if (k == 0) return out;
  std::vector<std::pair<const Chunk*, double>> hits;
  for (const auto& [slot, score] : index_.positive_scores(bm25_terms(query))) hits.emplace_back(by_slot_.at(slot), score);
  const size_t n = std::min(k, hits.size());
  std::partial_sort(hits.begin(), hits.begin() + static_cast<std::ptrdiff_t>(n), hits.end(), [](const auto& a, const auto& b) {
    return a.second > b.second || (a.second == b.second && a.first->id < b.first->id);
  });
  for (size_t i = 0; i < n; ++i) {
    const Chunk& c = *hits[i].first;
    const auto d = documents_.find(c.document_id);
    out.push_back({c.id, c.document_id, d != documents_.end() ? d->second.name : "", c.text, c.cache_id, hits[i].second,
                   c.n_tokens});
  }
  return out;
}

void KnowledgeBase::note_used(const std::vector<RetrievedChunk>& used) {
  std::lock_guard lk(mu_);
  bool changed = false;
  for (const auto& r : used) {
    auto it = chunks_.find(r.chunk_id);
    if (it != chunks_.end()) ++it->second.uses, changed = true;
  }
  if (!changed || dirty_) return;  // a save is already due
  dirty_ = true;
  save_at_ = std::chrono::steady_clock::now() + kSaveAfter;
  rethink_ = true;
  cv_.notify_all();
}

}  // namespace cf

// ---- persistence (knowledge_base_file.h): written with the chunk store's atomic writer (a
// private temp file created with O_EXCL, then rename, which replaces a link at the name
// instead of following it); read only when the name is a regular file itself (store_paths.h).
namespace cf {

std::string KnowledgeBase::file_path() const { return engine_.options().cache_dir + "/knowledge-base.json"; }

SavedDocument KnowledgeBase::saved_document(const Document& d,
                                            const std::function<const Chunk*(const std::string&)>& chunk_of) {
  SavedDocument sd{d.id, d.name, d.format, d.bytes, d.chunk_tokens, d.created, {}};
  for (const auto& cid : d.chunk_ids)
    if (const Chunk* c = chunk_of(cid))
      sd.chunks.push_back({c->id, c->text, c->summary, c->hash, c->cache_id, c->state, c->error, c->index, c->n_tokens,
                           c->uses});
  return sd;
}

SavedKnowledgeBase KnowledgeBase::saved_locked(const std::set<std::string>& leave_out) const {
  SavedKnowledgeBase kb;
  kb.next_document = next_document_;
  for (const auto& [id, d] : documents_) {
    SavedDocument sd =
        saved_document(d, [&](const std::string& cid) { return leave_out.count(cid) ? nullptr : &chunks_.at(cid); });
    if (!sd.chunks.empty()) kb.documents.push_back(std::move(sd));  // a document with none goes too
  }
  return kb;
}

void KnowledgeBase::write_file(const SavedKnowledgeBase& kb) const {
  try {
    write_private_file_atomic(file_path(), knowledge_base_file_text(kb), /*durable=*/true);
    ++file_writes_;
    dirty_ = false;  // every write is of the state as it is (or is about to be): counts included
  } catch (const std::exception& e) {
    throw store_write_error("the knowledge base", e);
  }
}

void KnowledgeBase::save_locked() const {
  try {
    write_file(saved_locked({}));
  } catch (const std::exception& e) {
    // Use counts and precompute states only: kept in memory, saved again later.
    note_failure("saving " + file_path(), e);
    dirty_ = true;
    save_at_ = std::chrono::steady_clock::now() + kRetryAfter;
  }
}

void KnowledgeBase::load() {
  const std::string path = file_path();
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec))) {
    std::fprintf(stderr, "chunkfuse serve: knowledge base: new, will be saved to %s\n", path.c_str());
    return;
  }
  SavedKnowledgeBase saved;
  try {
    if (!is_real_file(path)) throw std::runtime_error("not a regular file (a link or a folder)");
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!in) throw std::runtime_error("cannot read it");
    saved = parse_knowledge_base_file(ss.str(), opt_.limits);
  } catch (const std::exception& e) {
    const std::string aside = path + ".damaged";
    std::filesystem::rename(path, aside, ec);  // renames a link itself, never its target
    const std::string where = ec ? path + " stays (could not move it: " + ec.message() + ")" : "moved aside to " + aside;
    std::fprintf(stderr, "chunkfuse serve: knowledge base %s is damaged (%s); %s, starting with an empty knowledge base\n",
                 path.c_str(), e.what(), where.c_str());
    return;
  }
  std::lock_guard lk(mu_);
  next_document_ = saved.next_document;
  size_t requeued = 0;
  for (auto& sd : saved.documents) {
    unsigned long long number = 0;  // ids never handed out twice, whatever next_document says
    if (std::sscanf(sd.id.c_str(), "doc-%llu", &number) == 1) next_document_ = std::max<uint64_t>(next_document_, number);
    Document d{sd.id, sd.name, sd.format, sd.bytes, sd.chunk_tokens, sd.created, {}};
    for (auto& sc : sd.chunks) {
      Chunk c;
      c.id = sc.id;
      c.document_id = d.id;
      c.text = std::move(sc.text);
      c.summary = std::move(sc.summary);
      c.hash = std::move(sc.hash);
      c.cache_id = std::move(sc.cache_id);
      c.error = std::move(sc.error);
      c.state = std::move(sc.state);
      c.index = sc.index;
      c.n_tokens = sc.n_tokens;
      c.uses = sc.uses;
      c.terms = bm25_terms(c.text);
      // A chunk whose cache the engine does not hold (another model, a cleared store, a
      // failed or unfinished precompute) is computed again.
      const auto info = c.cache_id.empty() ? std::nullopt : engine_.chunk(c.cache_id);
      if (c.state != "ready" || !info || !info->cached) {
        c.state = "queued";
        c.cache_id.clear();
        c.error.clear();
        queue_.push_back(c.id);
        ++requeued;
      }
      d.chunk_ids.push_back(c.id);
      add_chunk_locked(std::move(c));
    }
    documents_.emplace(d.id, std::move(d));
  }
  std::fprintf(stderr, "chunkfuse serve: knowledge base: loaded %zu documents, %zu chunks (%zu to precompute) from %s\n",
               documents_.size(), chunks_.size(), requeued, path.c_str());
}

}  // namespace cf
