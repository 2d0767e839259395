// A cheap size bound for completion and chunk-registration requests (issue 17, item 1):
// refuses a prompt that cannot fit before any of it is tokenized.
//
// Why it is exact and cheap: a token stands for at most `longest_token_bytes` bytes of text
// (the longest decoded piece in the vocabulary, specials rendered; not the vocabulary's own
// strings, which a byte-level BPE writes 2 bytes a byte), so a text of B bytes has at least
// ceil(B / longest_token_bytes) tokens. Text past max_prompt_tokens * longest_token_bytes
// bytes can never fit and gets 413 after a byte count, where tokenizing 8 MB took ~8 s and
// 2.25 GB (issue 17, hole 3). The bound never refuses a prompt that would fit.
//
// Per-request memory then has a stated bound: the body (--max-body) plus, for a prompt that
// passes, the tokens of at most max_prompt_tokens * longest_token_bytes bytes per request
// (for a conversation, whose repeated documents CRAFT may drop, per message list and per
// document, times --max-documents).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "serve/request.h"

namespace cf {

class Tokenizer;

struct InputBound {
  size_t max_prompt_tokens = 0;
  size_t longest_token_bytes = 1;
  size_t max_text_bytes() const { return max_prompt_tokens * longest_token_bytes; }
};

// longest_token_bytes from the tokenizer's vocabulary (one pass at startup).
InputBound input_bound(const Tokenizer& tok, size_t max_prompt_tokens);

// Throw RequestError 413 naming the field when the text certainly exceeds the bound.
void check_input_size(const CompletionRequest& req, const InputBound& b);
void check_chunk_texts_size(const std::vector<std::string>& texts, const InputBound& b);

}  // namespace cf
