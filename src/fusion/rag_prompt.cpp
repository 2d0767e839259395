#include "fusion/rag_prompt.h"

#include <xxhash.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <tuple>

namespace cf {

std::string prompt_layout_id(const RagPromptOptions& opt) {
  const std::string words = opt.system + '\x1f' + opt.question_cue + '\x1f' + opt.passage_separator + '\x1f' +
                            (opt.use_chat_template ? "chat" : "plain");
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH3_64bits(words.data(), words.size())));
  return hex;
}

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

std::pair<size_t, size_t> rows_spelling(const Tokenizer& tok, std::span<const TokenId> tokens, const std::string& text,
                                        size_t byte_begin, size_t byte_end) {
  if (byte_begin >= byte_end || byte_end > text.size()) return {0, 0};
  size_t at = 0, first = tokens.size(), last = 0;
  for (size_t t = 0; t < tokens.size() && at < byte_end; ++t) {
    const std::string piece = tok.token_to_piece(tokens[t], false);
    const size_t n = std::min(piece.size(), byte_end - at);
    if (text.compare(at, n, piece, 0, n) != 0) return {0, 0};
    if (at < byte_end && at + piece.size() > byte_begin) {
      first = std::min(first, t);
      last = t + 1;
    }
    at += piece.size();
  }
  if (at < byte_end || first >= last) return {0, 0};
  return {first, last};
}

std::vector<std::string> render_chat_around(const ChatTemplate& tmpl, std::vector<ChatMessage> messages,
                                            const std::vector<size_t>& split_at) {
  // Markers no template adds or trims: control bytes around a name.
  auto marker = [](size_t i) { return "\x01\x02CHUNKFUSE_CONTENT_" + std::to_string(i) + "\x02\x01"; };
  for (size_t k = 0; k < split_at.size(); ++k) {
    if (split_at[k] >= messages.size() || (k > 0 && split_at[k] <= split_at[k - 1]))
      throw std::invalid_argument("render_chat_around: split indices out of range or not ascending");
    messages[split_at[k]].content = marker(k);
  }
  const std::string rendered = tmpl.apply(messages, true);
  std::vector<std::string> pieces;
  size_t from = 0;
  for (size_t k = 0; k < split_at.size(); ++k) {
    const std::string m = marker(k);
    const size_t at = rendered.find(m, from);
    if (at == std::string::npos) throw std::logic_error("chat template dropped a message's content");
    pieces.push_back(rendered.substr(from, at - from));
    from = at + m.size();
  }
  pieces.push_back(rendered.substr(from));
  return pieces;
}

namespace {
// The plain-text conversation, with the generation prompt ("\nAnswer:" after the last user
// turn, already there when it is the last message).
std::string render_plain(const std::vector<ChatMessage>& messages) {
  std::string s;
  for (const auto& m : messages) {
    if (m.role == "system") s += m.content + "\n\n";
    else if (m.role == "assistant") s += " " + m.content + "\n\n";
    else s += m.content + "\nAnswer:";
  }
  return s;
}

// render_chat_around for the plain-text layout.
std::vector<std::string> render_plain_around(const std::vector<ChatMessage>& messages,
                                             const std::vector<size_t>& split_at) {
  std::vector<std::string> pieces(1);
  size_t k = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    const bool split = k < split_at.size() && split_at[k] == i;
    if (!split) {
      pieces.back() += render_plain({messages[i]});
      continue;
    }
    // The text around the content: render with an empty content, cut where it would be.
    const std::string empty = render_plain({{messages[i].role, ""}});
    const size_t at = messages[i].role == "assistant" ? 1 : 0;  // render_plain's " " before an answer
    pieces.back() += empty.substr(0, at);
    pieces.push_back(empty.substr(at));
    ++k;
  }
  if (k != split_at.size()) throw std::invalid_argument("render_prompt_around: split indices out of range or not ascending");
  return pieces;
}
}  // namespace

std::vector<std::string> render_prompt_around(const ChatTemplate& tmpl, std::vector<ChatMessage> messages,
                                              const std::vector<size_t>& split_at) {
  if (tmpl.from_file()) return render_chat_around(tmpl, std::move(messages), split_at);
  return render_plain_around(messages, split_at);
}

ChatPromptTokens encode_chat_prompt(const Tokenizer& tok, const ChatTemplate& tmpl,
                                    const std::vector<ChatMessage>& messages) {
  if (messages.empty()) throw std::invalid_argument("encode_chat_prompt: no messages");
  return encode_chat_prompt(tok, tmpl, messages, messages.size() - 1);
}

ChatPromptTokens encode_chat_prompt(const Tokenizer& tok, const ChatTemplate& tmpl,
                                    const std::vector<ChatMessage>& messages, size_t open) {
  if (open >= messages.size()) throw std::invalid_argument("encode_chat_prompt: no message " + std::to_string(open));
  std::vector<size_t> every(messages.size());
  for (size_t i = 0; i < every.size(); ++i) every[i] = i;
  const std::vector<std::string> pieces = render_prompt_around(tmpl, messages, every);
  auto content = [&](size_t i) {
    const std::string text = tmpl.from_file() ? tmpl.content_text(messages[i].content) : messages[i].content;
    return tok.encode(text, /*add_special=*/false, /*parse_special=*/false);
  };
  auto append = [](std::vector<TokenId>& to, const std::vector<TokenId>& more) {
    to.insert(to.end(), more.begin(), more.end());
  };
  ChatPromptTokens out;
  out.before = tok.encode(pieces[0], /*add_special=*/true, /*parse_special=*/true);
  for (size_t i = 0; i < open; ++i) {
    append(out.before, content(i));
    append(out.before, tok.encode(pieces[i + 1], false, true));
  }
  out.content = content(open);
  out.after = tok.encode(pieces[open + 1], false, true);
  for (size_t i = open + 1; i < messages.size(); ++i) {
    append(out.after, content(i));
    append(out.after, tok.encode(pieces[i + 1], false, true));
  }
  return out;
}

std::vector<std::string> default_chat_stops(const ChatTemplate& tmpl) {
  if (tmpl.from_file()) return {};
  return {"\n\n"};
}

RagRequest build_rag_request(const Model& model, const std::vector<Passage>& passages, const std::string& question,
                             const RagPromptOptions& opt) {
  const Tokenizer& tok = model.tokenizer();
  const std::string question_label = "Question: ";
  const std::string question_text = question_label + question + opt.question_cue;
  // S and the text after U: the model's own chat template around an empty user turn, or the
  // plain-text layout (a file without a template, e.g. a base model, or when asked).
  std::vector<ChatMessage> msgs;
  if (!opt.system.empty()) msgs.push_back({"system", opt.system});
  msgs.push_back({"user", ""});
  const std::vector<size_t> user{msgs.size() - 1};
  const std::vector<std::string> pieces = opt.use_chat_template
                                              ? render_prompt_around(model.chat_template(), std::move(msgs), user)
                                              : render_plain_around(msgs, user);
  const std::string& before = pieces[0];
  const std::string& after = pieces[1];
  RagRequest r;
  r.system = tok.encode(before, /*add_special=*/true, /*parse_special=*/true);
  for (const auto& p : passages) r.chunks.push_back(tok.encode(passage_text(p, opt), false, false));
  r.suffix = tok.encode(question_text + after, false, true);
  const size_t q_at = question_label.size();
  std::tie(r.question_begin, r.question_end) =
      rows_spelling(tok, r.suffix, question_text + after, q_at, q_at + question.size());
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
