#include "serve/prompt_layout.h"

#include <algorithm>
#include <numeric>

#include "fusion/rag_prompt.h"
#include "serve/request.h"
#include "serve/passage_matching.h"

namespace cf {
namespace {

RequestError no_tokens() { return invalid_request("prompt has no tokens", "prompt"); }

// Completions: the prompt is U; with documents they go ahead of it, after BOS when the model
// has one.
void lay_out_completion(const Tokenizer& tok, const std::string& text, PromptLayout& l) {
  std::vector<TokenId> prompt = tok.encode(text, true, false);
  if (prompt.empty()) throw no_tokens();
  if (l.chunks.empty()) {  // S = all but the last token, so the prefix cache can serve it
    l.suffix.assign(prompt.end() - 1, prompt.end());
    prompt.pop_back();
    l.system = std::move(prompt);
    return;
  }
  const bool bos = !prompt.empty() && prompt.front() == tok.bos() && tok.bos() >= 0;
  if (bos) l.system.push_back(prompt.front());
  l.suffix.assign(prompt.begin() + (bos ? 1 : 0), prompt.end());
  if (l.suffix.empty()) throw no_tokens();
}

// A continued conversation: the kept tokens, then the template's text between the answer and
// the new user content. Every content is cut out of the rendering, so no message text (not
// even one that spells a cut marker) can reach the pieces parsed for special tokens. The kept
// tokens were laid out the same way, and the answer in them is the model's own tokens.
void lay_out_continued(const Tokenizer& tok, const ChatTemplate& tmpl, const std::vector<ChatMessage>& messages,
                       const std::vector<TokenId>& history, PromptLayout& l) {
  const size_t last = messages.size() - 1;
  const std::string& question = messages[last].content;
  std::vector<size_t> every(messages.size());
  std::iota(every.begin(), every.end(), size_t{0});
  const auto pieces = render_prompt_around(tmpl, messages, every);
  l.system = history;
  l.history_tokens = l.system.size();
  const auto between = tok.encode(pieces[last], false, true);
  l.system.insert(l.system.end(), between.begin(), between.end());
  l.suffix = tok.encode(tmpl.from_file() ? tmpl.content_text(question) : question, false, false);
  const auto after = tok.encode(pieces[last + 1], false, true);
  l.suffix.insert(l.suffix.end(), after.begin(), after.end());
}

}  // namespace

std::vector<ChatMessage> with_rag_system(const std::vector<ChatMessage>& messages, bool has_passages) {
  const bool has_system = std::any_of(messages.begin(), messages.end(), [](const ChatMessage& m) { return m.role == "system"; });
  if (!has_passages || has_system) return messages;
  std::vector<ChatMessage> out{{"system", RagPromptOptions{}.system}};
  out.insert(out.end(), messages.begin(), messages.end());
  return out;
}

size_t PromptLayout::tokens() const { return system.size() + context_tokens() + suffix.size(); }

std::string document_chunk_text(const std::string& text) { return passage_text({"", text}, RagPromptOptions{}); }

void lay_out_prompt(const Tokenizer& tok, const ChatTemplate& tmpl, const CompletionRequest& req,
                    const std::vector<TokenId>* history, PromptLayout& l) {
  if (req.inline_passages) {  // passages found in a plain message (serve/passage_matching.h)
    lay_out_inline_passages(tok, tmpl, req, l.system, l.suffix);
  } else if (!req.chat) {
    lay_out_completion(tok, req.prompt, l);
  } else if (history) {
    lay_out_continued(tok, tmpl, req.messages, *history, l);
  } else {
    // Every message's content is text, never special tokens (issue 29, item 5).
    ChatPromptTokens t = encode_chat_prompt(tok, tmpl, with_rag_system(req.messages, !l.chunks.empty()));
    l.system = std::move(t.before);
    l.suffix = std::move(t.content);
    l.suffix.insert(l.suffix.end(), t.after.begin(), t.after.end());
  }
}

}  // namespace cf
