#include "serve/chunk_registry.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "kv/store_paths.h"
#include "serve/engine.h"
#include "serve/prompt_layout.h"

namespace cf {

ChunkRegistry::ChunkRegistry(std::string index_path, ChunkOf chunk_of)
    : path_(std::move(index_path)), chunk_of_(std::move(chunk_of)) {
  std::ifstream in(path_);
  if (!in) return;
  try {
    const auto j = nlohmann::json::parse(in);
    for (const auto& text : j.at("chunks")) {
      RegisteredChunk c = chunk_of_(text.get<std::string>());  // id recomputed: another model gives other ids
      chunks_[c.id] = std::move(c);
    }
  } catch (const std::exception& e) {
    throw std::runtime_error(path_ + ": unreadable chunk index (" + e.what() + ")");
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
      throw RequestError(400, "invalid_request_error",
                         "documents[" + std::to_string(i) + "] gives both text and id; give one", "documents");
    if (!d.id.empty()) {
      auto it = chunks_.find(d.id);
      if (it == chunks_.end())
        throw RequestError(404, "not_found_error", "unknown chunk id \"" + d.id + "\" (register it with POST /v1/chunks)",
                           "documents");
      l.chunks.push_back(it->second.tokens);
      l.chunk_ids.push_back(d.id);
    } else {
      if (d.text.empty())
        throw RequestError(400, "invalid_request_error", "documents[" + std::to_string(i) + "] is empty", "documents");
      RegisteredChunk c = chunk_of_(d.text);
      l.chunks.push_back(std::move(c.tokens));
      l.chunk_ids.push_back(std::move(c.id));
    }
  }
}

void ChunkRegistry::add(std::vector<RegisteredChunk> chunks) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& c : chunks) chunks_[c.id] = std::move(c);
  ++version_;
  save_locked();
}

bool ChunkRegistry::remove(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (chunks_.erase(id) == 0) return false;
  ++version_;
  save_locked();
  return true;
}

std::vector<std::string> ChunkRegistry::texts() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  out.reserve(chunks_.size());
  for (const auto& [id, c] : chunks_) out.push_back(c.text);
  return out;
}

void ChunkRegistry::save_locked() const {
  nlohmann::json texts = nlohmann::json::array();
  for (const auto& [id, c] : chunks_) texts.push_back(c.text);
  // Document texts: a fresh 0600 temp file (O_EXCL|O_NOFOLLOW, never a planted link), fsync,
  // rename; the store's one atomic writer (issue 29 item 11).
  write_private_file_atomic(path_, nlohmann::json{{"version", 1}, {"chunks", texts}}.dump());
}

}  // namespace cf
