// Chat templates: the file's `tokenizer.chat_template` (Jinja) is recognised by its
// markers and rendered by a built-in formatter for the families in common use: ChatML
// (SmolLM2, Qwen), Llama 3, Mistral/Llama 2 [INST]. Behaviour the template encodes, such as
// SmolLM2's default system message when none is given, is reproduced.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cf {

class GgufFile;

struct ChatMessage {
  std::string role;     // "system", "user", "assistant"
  std::string content;
};

enum class ChatFamily { ChatML, Llama3, Mistral };

class ChatTemplate {
 public:
  // Recognises the family from the template text; nullopt when unknown.
  static std::optional<ChatTemplate> from_template_text(std::string_view jinja);
  // From the file's metadata; ChatML when the file has no template. Throws
  // std::runtime_error naming the template when it is present but unrecognised.
  static ChatTemplate from_gguf(const GgufFile& file);
  explicit ChatTemplate(ChatFamily family, std::string default_system = {});

  ChatFamily family() const { return family_; }
  std::string_view name() const;
  // False for the ChatML stand-in of a file without a template (a base model such as
  // Gemma 3 270M): RAG prompts for it are plain text instead.
  bool from_file() const { return from_file_; }
  // The prompt text (special tokens as text; encode with parse_special = true).
  std::string apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
  // What apply() writes for a message's content (Llama 3's template strips it), for a caller
  // that renders around the content and tokenizes it apart (fusion/rag_prompt.h).
  std::string content_text(std::string_view content) const;

 private:
  ChatFamily family_;
  std::string default_system_;  // injected when the first message is not a system one
  bool from_file_ = true;
};

}  // namespace cf
