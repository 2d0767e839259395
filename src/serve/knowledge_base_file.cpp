// The knowledge base's file (knowledge_base.h, "Persistence"): one JSON document inside the
// chunk store's folder, so a restarted server lists the same documents, chunks and use counts.
//
//   {"version": 1, "next_document": 7,
//    "documents": [{"id", "name", "format", "bytes", "chunk_tokens", "created",
//                   "chunks": [{"id", "index", "text", "summary", "hash", "n_tokens",
//                               "cache_id", "state", "error", "uses"}]}]}
//
// Written with the chunk store's atomic writer (a private temp file created with O_EXCL, then
// rename, which replaces a link at the name instead of following it), read only when the name
// is a regular file itself (store_paths.h).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "fusion/bm25.h"
#include "kv/cache_file.h"
#include "kv/store_paths.h"
#include "serve/knowledge_base.h"

namespace cf {

using nlohmann::json;

namespace {
constexpr int kFileVersion = 1;
}

std::string KnowledgeBase::file_path() const { return engine_.options().cache_dir + "/knowledge-base.json"; }

void KnowledgeBase::save_locked() const {
  json docs = json::array();
  for (const auto& [id, d] : documents_) {
    json chunks = json::array();
    for (const auto& cid : d.chunk_ids) {
      const Chunk& c = chunks_.at(cid);
      chunks.push_back({{"id", c.id},
                        {"index", c.index},
                        {"text", c.text},
                        {"summary", c.summary},
                        {"hash", c.hash},
                        {"n_tokens", c.n_tokens},
                        {"cache_id", c.cache_id},
                        {"state", c.state},
                        {"error", c.error},
                        {"uses", c.uses}});
    }
    docs.push_back({{"id", d.id},
                    {"name", d.name},
                    {"format", d.format},
                    {"bytes", d.bytes},
                    {"chunk_tokens", d.chunk_tokens},
                    {"created", d.created},
                    {"chunks", chunks}});
  }
  const std::string text =
      json{{"version", kFileVersion}, {"next_document", next_document_}, {"documents", docs}}.dump();
  try {
    write_cache_bytes(file_path(), std::vector<uint8_t>(text.begin(), text.end()), /*durable=*/true);
  } catch (const std::exception& e) {
    // The knowledge base keeps working in memory; the next change tries again.
    std::fprintf(stderr, "chunkfuse serve: knowledge base not saved: %s\n", e.what());
  }
}

void KnowledgeBase::load() {
  const std::string path = file_path();
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec))) {
    std::fprintf(stderr, "chunkfuse serve: knowledge base: new, will be saved to %s\n", path.c_str());
    return;
  }
  std::map<std::string, Document> documents;
  std::map<std::string, Chunk> chunks;
  uint64_t next = 0;
  try {
    if (!is_real_file(path)) throw std::runtime_error("not a regular file (a link or a folder)");
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!in) throw std::runtime_error("cannot read it");
    const json j = json::parse(ss.str());
    if (j.at("version").get<int>() != kFileVersion)
      throw std::runtime_error("version " + j.at("version").dump() + " (this build reads " +
                               std::to_string(kFileVersion) + ")");
    next = j.at("next_document").get<uint64_t>();
    for (const auto& dj : j.at("documents")) {
      Document d;
      d.id = dj.at("id").get<std::string>();
      d.name = dj.at("name").get<std::string>();
      d.format = dj.at("format").get<std::string>();
      d.bytes = dj.at("bytes").get<size_t>();
      d.chunk_tokens = dj.at("chunk_tokens").get<size_t>();
      d.created = dj.at("created").get<int64_t>();
      for (const auto& cj : dj.at("chunks")) {
        Chunk c;
        c.id = cj.at("id").get<std::string>();
        c.document_id = d.id;
        c.index = cj.at("index").get<size_t>();
        c.text = cj.at("text").get<std::string>();
        c.summary = cj.at("summary").get<std::string>();
        c.hash = cj.at("hash").get<std::string>();
        c.n_tokens = cj.at("n_tokens").get<size_t>();
        c.cache_id = cj.at("cache_id").get<std::string>();
        c.state = cj.at("state").get<std::string>();
        c.error = cj.at("error").get<std::string>();
        c.uses = cj.at("uses").get<uint64_t>();
        c.terms = bm25_terms(c.text);
        if (!chunks.emplace(c.id, c).second) throw std::runtime_error("chunk " + c.id + " appears twice");
        d.chunk_ids.push_back(c.id);
      }
      if (d.chunk_ids.empty()) throw std::runtime_error("document " + d.id + " has no chunks");
      if (!documents.emplace(d.id, d).second) throw std::runtime_error("document " + d.id + " appears twice");
    }
    if (documents.size() > opt_.max_documents || chunks.size() > opt_.max_chunks)
      throw std::runtime_error("more documents or chunks than this server's limits");
  } catch (const std::exception& e) {
    const std::string aside = path + ".damaged";
    std::filesystem::rename(path, aside, ec);  // renames a link itself, never its target
    std::fprintf(stderr,
                 "chunkfuse serve: knowledge base %s is damaged (%s); moved aside to %s, starting with an empty "
                 "knowledge base\n",
                 path.c_str(), e.what(), ec ? (path + " (could not move it: " + ec.message() + ")").c_str() : aside.c_str());
    return;
  }
  // A chunk whose cache the engine does not hold (another model, a cleared store, a failed
  // precompute) is computed again.
  size_t requeued = 0;
  for (auto& [id, c] : chunks) {
    const auto info = c.cache_id.empty() ? std::nullopt : engine_.chunk(c.cache_id);
    if (c.state == "ready" && info && info->cached) continue;
    c.state = "queued";
    c.cache_id.clear();
    c.error.clear();
    queue_.push_back(id);
    ++requeued;
  }
  std::lock_guard lk(mu_);
  documents_ = std::move(documents);
  chunks_ = std::move(chunks);
  next_document_ = next;
  std::fprintf(stderr, "chunkfuse serve: knowledge base: loaded %zu documents, %zu chunks (%zu to precompute) from %s\n",
               documents_.size(), chunks_.size(), requeued, path.c_str());
}

}  // namespace cf
