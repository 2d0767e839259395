#include "serve/chunk_registry.h"

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "base/bounded_json.h"

#include "kv/store_paths.h"
#include "serve/request.h"
#include "serve/prompt_layout.h"
#include "serve/store_write.h"

namespace cf {

namespace {

namespace fs = std::filesystem;

// The texts of the index at `path`; std::runtime_error saying why when it is not one (not a
// regular file, unreadable, not JSON, another shape).
std::vector<std::string> read_index_texts(const std::string& path) {
  if (!is_real_file(path)) throw std::runtime_error("not a regular file (a link or a folder)");
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) throw std::runtime_error("cannot read it");
  const nlohmann::json j = parse_json_bounded(text.str());
  if (!j.is_object() || !j.contains("chunks") || !j["chunks"].is_array())
    throw std::runtime_error("not a chunk index (no \"chunks\" list)");
  std::vector<std::string> texts;
  for (const auto& t : j["chunks"]) {
    if (!t.is_string()) throw std::runtime_error("a chunk that is not a string");
    texts.push_back(t.get<std::string>());
  }
  return texts;
}

// <path>.damaged-<UTC time>: each damaged index is kept for inspection, none replaces another.
std::string damaged_name(const std::string& path) {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &utc);
  return path + ".damaged-" + stamp;
}

// Moves a damaged index aside (the link itself, never its target) and says so on stderr.
void set_aside(const std::string& path, const std::string& why) {
  const std::string aside = damaged_name(path);
  std::error_code ec;
  fs::rename(path, aside, ec);
  const std::string where = ec ? "it stays (could not move it: " + ec.message() + ")" : "moved aside to " + aside;
  std::fprintf(stderr,
               "chunkfuse serve: warning: chunk index %s is damaged (%s); %s, starting with no registered chunks "
               "(their caches stay in the store: registering a text again finds its cache)\n",
               path.c_str(), why.c_str(), where.c_str());
}

}  // namespace

ChunkRegistry::ChunkRegistry(std::string index_path, ChunkOf chunk_of)
    : path_(std::move(index_path)), chunk_of_(std::move(chunk_of)) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path_, ec))) return;
  std::vector<std::string> texts;
  try {
    texts = read_index_texts(path_);
  } catch (const std::exception& e) {  // a damaged index never stops start-up (issue 59)
    set_aside(path_, e.what());
    return;
  }
  for (const auto& text : texts) {
    RegisteredChunk c = chunk_of_(text);  // id recomputed: another model gives other ids
    chunks_[c.id] = std::move(c);
  }
}

std::optional<RegisteredChunk> ChunkRegistry::find(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = chunks_.find(id);
  if (it == chunks_.end()) return std::nullopt;
  return it->second;
}

void ChunkRegistry::lay_out_documents(const std::vector<DocumentRef>& documents, PromptLayout& l) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < documents.size(); ++i) {
    const DocumentRef& d = documents[i];
    if (!d.id.empty() && !d.text.empty())
      throw invalid_request("documents[" + std::to_string(i) + "] gives both text and id; give one", "documents");
    if (!d.id.empty()) {
      auto it = chunks_.find(d.id);
      if (it == chunks_.end())
        throw RequestError(404, "not_found_error", "unknown chunk id \"" + d.id + "\" (register it with POST /v1/chunks)",
                           "documents");
      l.chunks.push_back(it->second.tokens);
      l.chunk_ids.push_back(d.id);
    } else {
      if (d.text.empty())
        throw invalid_request("documents[" + std::to_string(i) + "] is empty", "documents");
      RegisteredChunk c = chunk_of_(d.text);
      l.chunks.push_back(std::move(c.tokens));
      l.chunk_ids.push_back(std::move(c.id));
    }
  }
}

// Write, then commit (issue 59): the index is written as it will be after the change, and the
// change is made in memory only once the file is in place; a failed write (a full disk) is
// RequestError 507/503 with nothing changed.
void ChunkRegistry::add(std::vector<RegisteredChunk> chunks) {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, const std::string*> next;  // id -> text, the index after the change
  for (const auto& [id, c] : chunks_) next[id] = &c.text;
  for (const auto& c : chunks) next[c.id] = &c.text;
  save_locked(next);
  for (auto& c : chunks) chunks_[c.id] = std::move(c);
  ++version_;
}

bool ChunkRegistry::remove(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = chunks_.find(id);
  if (it == chunks_.end()) return false;
  std::map<std::string, const std::string*> next;
  for (const auto& [other, c] : chunks_)
    if (other != id) next[other] = &c.text;
  save_locked(next);
  chunks_.erase(it);
  ++version_;
  return true;
}

std::vector<std::string> ChunkRegistry::texts() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  out.reserve(chunks_.size());
  for (const auto& [id, c] : chunks_) out.push_back(c.text);
  return out;
}

void ChunkRegistry::save_locked(const std::map<std::string, const std::string*>& texts_by_id) const {
  nlohmann::json texts = nlohmann::json::array();
  for (const auto& [id, text] : texts_by_id) texts.push_back(*text);
  // Document texts: a fresh 0600 temp file (O_EXCL|O_NOFOLLOW, never a planted link), fsync,
  // rename; the store's one atomic writer (issue 29 item 11).
  try {
    write_private_file_atomic(path_, nlohmann::json{{"version", 1}, {"chunks", texts}}.dump());
  } catch (const std::exception& e) {
    throw store_write_error("the chunk index", e);
  }
}

}  // namespace cf
