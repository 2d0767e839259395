// Prompt layout of a serve request (docs/ARCHITECTURE.md's S c1..cm U, issue 25 split it out of the
// engine): S = the chat template up to the last user message's content (system message and
// earlier turns included), then one chunk per document, then U = the last user message and the
// template's assistant header. Without documents the whole rendered prompt is S + U.
// Completions (`prompt`) use no template. Passages matched inside a message
// (serve/passage_matching.h) are laid out around that message instead; a continued
// conversation (serve/conversation_memory.h) starts S with its kept tokens.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "fusion/rag_prompt.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"

namespace cf {

struct CompletionRequest;

// A request laid out on the caller's thread: fusion's layout (S, one chunk per document in
// request order, U: fusion/rag_prompt.h), with what the server knows of it besides.
struct PromptLayout : RagRequest {
  std::vector<std::string> chunk_ids;  // content ids, as CRAFT and the trace know them
  size_t history_tokens = 0;           // a continued conversation's kept tokens at the start of S
  size_t tokens() const;               // |S| + sum |ci| + |U|
};

// The text a document becomes in its chunk: the same for inline and registered passages, so
// one passage has one id.
std::string document_chunk_text(const std::string& text);

// A chat with passages the server puts in (documents, retrieval) and no system message gets
// the RAG layout's own (RagPromptOptions::system, the words `ask` and `bench` use and
// docs/benchmarks-history.md measured): without one the template's default system turn asks for nothing
// about passages or answer length. A client's own system message always wins.
std::vector<ChatMessage> with_rag_system(const std::vector<ChatMessage>& messages, bool has_passages);

// Fills layout.system, suffix and history_tokens for `req`, whose documents are already in
// layout.chunks. `history`: the kept tokens of the conversation `req` continues, or null.
// RequestError 400 on a prompt without tokens.
void lay_out_prompt(const Tokenizer& tok, const ChatTemplate& tmpl, const CompletionRequest& req,
                    const std::vector<TokenId>* history, PromptLayout& layout);

}  // namespace cf
