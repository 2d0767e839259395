#include "serve/knowledge_base_file.h"

#include "base/bounded_json.h"

#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

namespace cf {

using nlohmann::json;

std::string knowledge_base_file_text(const SavedKnowledgeBase& kb) {
  json docs = json::array();
  for (const auto& d : kb.documents) {
    json chunks = json::array();
    for (const auto& c : d.chunks)
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
    docs.push_back({{"id", d.id},
                    {"name", d.name},
                    {"format", d.format},
                    {"bytes", d.bytes},
                    {"chunk_tokens", d.chunk_tokens},
                    {"created", d.created},
                    {"chunks", chunks}});
  }
  // Invalid UTF-8 in a text (a .txt upload is checked, but be safe) is replaced, not thrown.
  return json{{"version", kKnowledgeBaseFileVersion}, {"next_document", kb.next_document}, {"documents", docs}}.dump(
      -1, ' ', false, json::error_handler_t::replace);
}

SavedKnowledgeBase parse_knowledge_base_file(std::string_view text, const KnowledgeBaseLimits& limits) {
  SavedKnowledgeBase kb;
  try {
    const json j = parse_json_bounded(text);
    if (!j.is_object()) throw std::runtime_error("not a JSON object");
    if (j.at("version").get<int>() != kKnowledgeBaseFileVersion)
      throw std::runtime_error("version " + json_excerpt(j.at("version")) + " (this build reads " +
                               std::to_string(kKnowledgeBaseFileVersion) + ")");
    kb.next_document = j.at("next_document").get<uint64_t>();
    std::set<std::string> doc_ids, chunk_ids;
    size_t n_chunks = 0;
    for (const auto& dj : j.at("documents")) {
      SavedDocument d;
      d.id = dj.at("id").get<std::string>();
      d.name = dj.at("name").get<std::string>();
      d.format = dj.at("format").get<std::string>();
      d.bytes = dj.at("bytes").get<size_t>();
      d.chunk_tokens = dj.at("chunk_tokens").get<size_t>();
      d.created = dj.at("created").get<int64_t>();
      if (d.id.empty() || !doc_ids.insert(d.id).second) throw std::runtime_error("document id '" + d.id + "' empty or repeated");
      for (const auto& cj : dj.at("chunks")) {
        SavedChunk c;
        c.id = cj.at("id").get<std::string>();
        c.index = cj.at("index").get<size_t>();
        c.text = cj.at("text").get<std::string>();
        c.summary = cj.at("summary").get<std::string>();
        c.hash = cj.at("hash").get<std::string>();
        c.n_tokens = cj.at("n_tokens").get<size_t>();
        c.cache_id = cj.at("cache_id").get<std::string>();
        c.state = cj.at("state").get<std::string>();
        c.error = cj.at("error").get<std::string>();
        c.uses = cj.at("uses").get<uint64_t>();
        if (c.id.empty() || !chunk_ids.insert(c.id).second) throw std::runtime_error("chunk id '" + c.id + "' empty or repeated");
        if (++n_chunks > limits.max_chunks) throw std::runtime_error("more chunks than this server's limit");
        d.chunks.push_back(std::move(c));
      }
      if (d.chunks.empty()) throw std::runtime_error("document " + d.id + " has no chunks");
      kb.documents.push_back(std::move(d));
      if (kb.documents.size() > limits.max_documents) throw std::runtime_error("more documents than this server's limit");
    }
  } catch (const json::exception& e) {
    throw std::runtime_error(e.what());
  } catch (const JsonTooDeep& e) {  // found by knowledge_base_file_fuzz: the same runtime_error as any defect
    throw std::runtime_error(e.what());
  }
  return kb;
}

}  // namespace cf
