#include "model/chat_template.h"

#include <stdexcept>

#include "model/gguf.h"
#include "model/unicode.h"

namespace cf {

namespace {

constexpr std::string_view kSystemOpen = "<|im_start|>system";
constexpr std::string_view kImEnd = "<|im_end|>";

// Undoes the escapes a Jinja string literal may contain.
std::string unescape_jinja_literal(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out.push_back(s[i]);
      continue;
    }
    const char c = s[++i];
    switch (c) {
      case 'n': out.push_back('\n'); break;
      case 't': out.push_back('\t'); break;
      case 'r': out.push_back('\r'); break;
      default: out.push_back(c); break;  // \' \" \\ and anything else: the character
    }
  }
  return out;
}

// A ChatML template that writes a fixed system turn when the conversation has none
// (SmolLM2, Qwen2.5) carries it as a literal: '<|im_start|>system\n...<|im_end|>'. A
// system turn built from message content is an expression and has no literal text here.
std::string extract_default_system(std::string_view jinja) {
  for (size_t at = jinja.find(kSystemOpen); at != std::string_view::npos;
       at = jinja.find(kSystemOpen, at + 1)) {
    size_t pos = at + kSystemOpen.size();
    if (jinja.compare(pos, 1, "\n") == 0) {
      pos += 1;
    } else if (jinja.compare(pos, 2, "\\n") == 0) {
      pos += 2;
    } else {
      continue;
    }
    const size_t end = jinja.find(kImEnd, pos);
    if (end == std::string_view::npos) continue;
    const std::string_view body = jinja.substr(pos, end - pos);
    // The literal must not be interrupted: no closing quote or Jinja delimiter inside.
    if (body.empty() || body.find_first_of("'\"{}") != std::string_view::npos) continue;
    return unescape_jinja_literal(body);
  }
  return {};
}

// Jinja's `trim` filter (Python str.strip()): Unicode whitespace, plus the separators
// U+001C..U+001F that Python also counts.
std::string python_strip(std::string_view s) {
  auto is_space = [](uint32_t cp) { return unicode::is_whitespace(cp) || (cp >= 0x1C && cp <= 0x1F); };
  size_t begin = 0;
  size_t end = 0;  // end of the last non-space code point
  bool seen_content = false;
  for (size_t pos = 0, len = 0; pos < s.size(); pos += len) {
    const uint32_t cp = unicode::decode_one(s, pos, &len);
    if (is_space(cp)) continue;
    if (!seen_content) begin = pos;
    seen_content = true;
    end = pos + len;
  }
  return seen_content ? std::string(s.substr(begin, end - begin)) : std::string();
}

}  // namespace

ChatTemplate::ChatTemplate(ChatFamily family, std::string default_system)
    : family_(family), default_system_(std::move(default_system)) {}

std::optional<ChatTemplate> ChatTemplate::from_template_text(std::string_view jinja) {
  if (jinja.find("<|im_start|>") != std::string_view::npos) {
    return ChatTemplate(ChatFamily::ChatML, extract_default_system(jinja));
  }
  if (jinja.find("<|start_header_id|>") != std::string_view::npos) return ChatTemplate(ChatFamily::Llama3);
  if (jinja.find("[INST]") != std::string_view::npos) return ChatTemplate(ChatFamily::Mistral);
  return std::nullopt;
}

ChatTemplate ChatTemplate::from_gguf(const GgufFile& file) {
  const auto text = file.get_string("tokenizer.chat_template");
  if (!text) {
    ChatTemplate stand_in(ChatFamily::ChatML);
    stand_in.from_file_ = false;
    return stand_in;
  }
  if (auto t = from_template_text(*text)) return *t;
  std::string shown(text->substr(0, 120));
  throw std::runtime_error("chat template of " + file.path() +
                           " is not a recognised family (ChatML, Llama 3, Mistral): " + shown +
                           (text->size() > shown.size() ? "..." : ""));
}

std::string_view ChatTemplate::name() const {
  switch (family_) {
    case ChatFamily::ChatML: return "chatml";
    case ChatFamily::Llama3: return "llama3";
    case ChatFamily::Mistral: return "mistral";
  }
  return "unknown";
}

std::string ChatTemplate::content_text(std::string_view content) const {
  return family_ == ChatFamily::Llama3 ? python_strip(content) : std::string(content);
}

std::string ChatTemplate::apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  std::string out;
  switch (family_) {
    case ChatFamily::ChatML: {
      if (!messages.empty() && messages.front().role != "system" && !default_system_.empty()) {
        out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
      }
      for (const ChatMessage& m : messages) {
        out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      }
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      break;
    }
    case ChatFamily::Llama3: {
      // BOS is left to the tokenizer (Llama 3 vocabularies add it), as llama.cpp does.
      for (const ChatMessage& m : messages) {
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + content_text(m.content) + "<|eot_id|>";
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    }
    case ChatFamily::Mistral: {
      // Mistral v0.1: "[INST] user [/INST]assistant</s>". Its template rejects system
      // messages; we fold a system message into the next user turn ("system\n\nuser"),
      // as later Mistral templates do. BOS is left to the tokenizer.
      std::string pending_system;
      for (const ChatMessage& m : messages) {
        if (m.role == "system") {
          pending_system += (pending_system.empty() ? "" : "\n\n") + m.content;
        } else if (m.role == "user") {
          const std::string content = pending_system.empty() ? m.content : pending_system + "\n\n" + m.content;
          pending_system.clear();
          out += "[INST] " + content + " [/INST]";
        } else {
          out += m.content + "</s>";
        }
      }
      // The assistant turn follows [/INST] directly: there is no generation prompt to add.
      break;
    }
  }
  return out;
}

}  // namespace cf
