// The byte bound before tokenizing (see request_limits.h).
#include "serve/request_limits.h"

#include <algorithm>

#include "model/tokenizer.h"

namespace cf {

namespace {

RequestError too_long(size_t bytes, const InputBound& b, const std::string& param) {
  return invalid_request(std::to_string(bytes) + " bytes of text cannot fit the prompt limit of " +
                          std::to_string(b.max_prompt_tokens) + " tokens (at most " +
                          std::to_string(b.max_text_bytes()) + " bytes)", param, 413);
}

}  // namespace

InputBound input_bound(const Tokenizer& tok, size_t max_prompt_tokens) {
  InputBound b;
  b.max_prompt_tokens = max_prompt_tokens;
  // The bytes of input text a token stands for are its decoded piece (specials rendered as
  // their text), not its vocabulary entry: a byte-level BPE stores each byte as a 2-byte
  // character, so the entries doubled the bound (Qwen: 256 bytes a token, the whole body
  // limit at 32K tokens, issue 59).
  for (size_t i = 0; i < tok.vocab_size(); ++i)
    b.longest_token_bytes = std::max(b.longest_token_bytes, tok.token_to_piece(static_cast<TokenId>(i), true).size());
  return b;
}

void check_input_size(const CompletionRequest& req, const InputBound& b) {
  const size_t limit = b.max_text_bytes();
  size_t text = req.prompt.size();
  for (const auto& m : req.messages) text += m.content.size();
  if (text > limit) throw too_long(text, b, req.chat ? "messages" : "prompt");
  // A conversation's documents may be dropped as repeats (CRAFT), so there each document is
  // bounded on its own; otherwise all of them share the prompt with the messages.
  const bool conversation = req.chat && !req.fusion.conversation_id.empty();
  for (const auto& d : req.documents) {
    if (conversation) {
      if (d.text.size() > limit) throw too_long(d.text.size(), b, "documents");
    } else {
      text += d.text.size();
      if (text > limit) throw too_long(text, b, "documents");
    }
  }
}

void check_chunk_texts_size(const std::vector<std::string>& texts, const InputBound& b) {
  for (const auto& t : texts)
    if (t.size() > b.max_text_bytes()) throw too_long(t.size(), b, "input");
}

}  // namespace cf
