#include "fusion/rag_prompt.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace cf {

std::vector<TokenId> RagRequest::flatten() const {
  std::vector<TokenId> all(system);
  for (const auto& c : chunks) all.insert(all.end(), c.begin(), c.end());
  all.insert(all.end(), suffix.begin(), suffix.end());
  return all;
}

size_t RagRequest::context_tokens() const {
  size_t n = 0;
  for (const auto& c : chunks) n += c.size();
  return n;
}

std::string passage_text(const Passage& p, const RagPromptOptions& opt) {
  std::string s;
  if (!p.title.empty()) s += "Title: " + p.title + "\n";
  s += p.text;
  s += opt.passage_separator;
  return s;
}

RagRequest build_rag_request(const Model& model, const std::vector<Passage>& passages, const std::string& question,
                             const RagPromptOptions& opt) {
  const Tokenizer& tok = model.tokenizer();
  std::string before, after;
  const std::string question_text = "Question: " + question;
  if (opt.use_chat_template) {
    static const std::string kMarker = "\x01\x02CHUNKFUSE_USER_CONTENT\x02\x01";
    std::vector<ChatMessage> msgs;
    if (!opt.system.empty()) msgs.push_back({"system", opt.system});
    msgs.push_back({"user", kMarker});
    const std::string rendered = model.chat_template().apply(msgs, true);
    const size_t at = rendered.find(kMarker);
    if (at == std::string::npos) throw std::logic_error("chat template dropped the user message");
    before = rendered.substr(0, at);
    after = rendered.substr(at + kMarker.size());
  } else {
    before = opt.system.empty() ? "" : opt.system + "\n\n";
    after = "\nAnswer:";
  }
  RagRequest r;
  r.system = tok.encode(before, /*add_special=*/true, /*parse_special=*/true);
  for (const auto& p : passages) r.chunks.push_back(tok.encode(passage_text(p, opt), false, false));
  r.suffix = tok.encode(question_text + after, false, true);
  return r;
}

std::vector<Passage> read_passages_jsonl(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open");
  std::vector<Passage> out;
  std::string line;
  size_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error(path + ":" + std::to_string(lineno) + ": not valid JSON (" + e.what() + ")");
    }
    if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
      throw std::runtime_error(path + ":" + std::to_string(lineno) + ": expected an object with a string \"text\"");
    Passage p;
    p.text = j["text"].get<std::string>();
    if (j.contains("title")) {
      if (!j["title"].is_string()) throw std::runtime_error(path + ":" + std::to_string(lineno) + ": \"title\" must be a string");
      p.title = j["title"].get<std::string>();
    }
    out.push_back(std::move(p));
  }
  if (out.empty()) throw std::runtime_error(path + ": no passages");
  return out;
}

}  // namespace cf
