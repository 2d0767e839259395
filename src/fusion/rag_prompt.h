// The request layout of docs/ARCHITECTURE.md: [system prefix S] [chunk c1] ... [chunk cm] [question suffix U].
// The model's chat template is rendered once around a placeholder user message and split
// there: S is the template text before the user content (plus the system message), U is
// the question and the template text after it. Each passage is tokenized on its own, so
// a chunk's tokens never depend on its neighbours and its cache can be reused anywhere.
#pragma once
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "model/model.h"

namespace cf {

struct Passage {
  std::string title;
  std::string text;
};

struct RagPromptOptions {
  // Asking for the answer alone (issue 23 item 3, docs/benchmarks-history.md "The RAG prompt"): on Qwen 0.5B
  // full prefill's gold F1 on held-out HotpotQA 0.15 -> 0.33; the first layout ("... Answer
  // briefly.") got full sentences restating the question.
  std::string system =
      "You are a helpful assistant. Answer the question using the passages. "
      "Answer with the answer alone: a few words, not a sentence.";
  // Text after the question in U ("Question: <question><cue>"), the last words the model reads.
  std::string question_cue;
  std::string passage_separator = "\n\n";  // appended to every passage
  bool use_chat_template = true;  // when the model file has one (else plain text)
};

// A short name for the layout's words (16 hex digits of their hash): bench rows carry it, so
// a resumed run never mixes answers to differently worded prompts.
std::string prompt_layout_id(const RagPromptOptions& opt);

struct RagRequest {
  std::vector<TokenId> system;              // S
  std::vector<std::vector<TokenId>> chunks; // c1..cm
  std::vector<TokenId> suffix;              // U
  // Rows of U that spell the question itself (not "Question: ", not the template tail):
  // the probe rows of QCFuse's artifact (§3.3.2 [C]). question_end == 0: not known (a
  // suffix built elsewhere, e.g. a chat), then selectors probe with all of U.
  size_t question_begin = 0, question_end = 0;
  std::vector<TokenId> flatten() const;     // S c1 .. cm U, the full-prefill prompt
  size_t context_tokens() const;            // sum of |ci|
};

// Text of a passage as it goes into its chunk ("Title: ...\n<text>" + separator).
std::string passage_text(const Passage& p, const RagPromptOptions& opt);

// Token rows [begin, end) of `tokens` whose bytes overlap bytes [byte_begin, byte_end) of the
// text they spell; (0, 0) when the tokens do not spell text[0, byte_end) exactly.
std::pair<size_t, size_t> rows_spelling(const Tokenizer& tok, std::span<const TokenId> tokens, const std::string& text,
                                        size_t byte_begin, size_t byte_end);

// Renders `messages` with the generation prompt, leaving out the content of the messages at
// `split_at` (ascending indices), and returns the template text around them: pieces[0]
// before the first, pieces[i] between the i-th and the next, pieces.back() after the last.
// How S and U are cut out of a chat prompt (here and in the server).
std::vector<std::string> render_chat_around(const ChatTemplate& tmpl, std::vector<ChatMessage> messages,
                                            const std::vector<size_t>& split_at);

// The same for the server's chat requests, whatever the model file: its own template, or for
// a file without one (a base model such as Gemma 3 270M) the plain-text conversation of
// build_rag_request's fallback: "<system>\n\n", then per turn "<user>\nAnswer:" and
// " <assistant>\n\n" (the passages go before the last user text, as in every layout).
std::vector<std::string> render_prompt_around(const ChatTemplate& tmpl, std::vector<ChatMessage> messages,
                                              const std::vector<size_t>& split_at);

// A chat request's prompt, tokenized so that special tokens come from the template alone:
// every message's content is encoded with special-token parsing off, so the text
// "<|im_start|>system" in any turn, earlier ones and earlier answers included, stays text
// and cannot forge a turn (issue 29, item 5). The prompt comes in three parts around the
// content of message `open` (the last one unless given): `before` is everything up to it
// (BOS added when the vocabulary wants one), `content` that message's content, `after` the
// rest (later turns, the assistant header). Rendered by render_prompt_around.
struct ChatPromptTokens {
  std::vector<TokenId> before, content, after;
};
ChatPromptTokens encode_chat_prompt(const Tokenizer& tok, const ChatTemplate& tmpl,
                                    const std::vector<ChatMessage>& messages);
ChatPromptTokens encode_chat_prompt(const Tokenizer& tok, const ChatTemplate& tmpl,
                                    const std::vector<ChatMessage>& messages, size_t open);
// Where a chat answer ends when the request names no stop: nothing for a template with its
// own end-of-turn token; the blank line that ends a plain-text answer otherwise.
std::vector<std::string> default_chat_stops(const ChatTemplate& tmpl);

RagRequest build_rag_request(const Model& model, const std::vector<Passage>& passages, const std::string& question,
                             const RagPromptOptions& opt = {});

// Reads JSON Lines {"title": ..., "text": ...}; throws std::runtime_error with the line
// number on malformed input.
std::vector<Passage> read_passages_jsonl(const std::string& path);

}  // namespace cf
