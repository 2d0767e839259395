// Conversation memory (fusion.conversation_id, chat only; issue 25 split it out of the engine).
// After a turn that ends cleanly (EOS or the token limit) the engine keeps its messages, its
// answer and its tokens (prompt, with that turn's documents, plus the answer). The next request
// of the conversation continues it when its messages are exactly the kept ones, then
// {assistant: the kept answer}, then one user message: S is then the kept tokens + the
// template's text between the answer and the new user content, so earlier documents stay in
// the prompt, CRAFT's dedup drops the ones repeated, and the history hits the prefix cache
// (with "full" + prefix cache the whole turn, answer included, is inserted; with a fusion
// method only S' is, since fused K/V is not exact). Anything else (edited history, a turn that
// stopped on a stop string, was cancelled or failed) starts the conversation afresh: the
// history is rendered by the template without earlier documents and CRAFT's dedup memory of
// the conversation is cleared. Thread-safe.
//
// Bounded by count and by bytes (issue 59: 10,000 ids x a 2 MiB system message was ~20 GB):
// each kept turn is accounted its texts, tokens and bookkeeping (turn_bytes), and past either
// bound the least recently used conversations go; a turn larger than the whole byte budget is
// not kept (its next turn starts afresh).
#pragma once
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/chat_template.h"
#include "model/tokenizer.h"

namespace cf {

class Craft;

struct KeptTurn {
  std::vector<ChatMessage> messages;  // the turn's request messages (last: its user message)
  std::string answer;
  std::vector<TokenId> tokens;        // prompt + answer tokens
  uint64_t last_used = 0;
  size_t bytes = 0;  // accounted by ConversationMemory (turn_bytes)
};

// Default byte budget of the kept turns (serve --conversation-budget).
inline constexpr size_t kDefaultConversationBytes = size_t{128} << 20;

// Whether `messages` continue `kept`: the kept messages, the kept answer, one new message.
bool continues_turn(const KeptTurn& kept, const std::vector<ChatMessage>& messages);

class ConversationMemory {
 public:
  explicit ConversationMemory(Craft& craft, size_t max_conversations = 10000,
                              size_t max_bytes = kDefaultConversationBytes);

  // The kept tokens when `messages` continue conversation `id`; else nullopt, the kept turn is
  // dropped and CRAFT forgets the conversation (its earlier documents are not in this prompt).
  std::optional<std::vector<TokenId>> continued(const std::string& id, const std::vector<ChatMessage>& messages);
  // A turn ended: clean (EOS, length) keeps it for the next turn (the least recently used
  // conversation goes beyond the limit); otherwise CRAFT forgets the conversation.
  void end_turn(const std::string& id, bool clean, KeptTurn turn);
  // A turn failed: nothing of the conversation is kept.
  void forget(const std::string& id);
  size_t size() const;
  size_t bytes() const;  // accounted bytes of every kept turn, at most max_bytes
  // What keeping `turn` under `id` costs: its texts, tokens and per-entry bookkeeping.
  static size_t turn_bytes(const std::string& id, const KeptTurn& turn);

 private:
  using Kept = std::unordered_map<std::string, KeptTurn>;
  void erase_locked(Kept::iterator it);

  Craft& craft_;
  const size_t max_, max_bytes_;
  mutable std::mutex mu_;
  Kept kept_;
  size_t bytes_ = 0;
  uint64_t clock_ = 0;
};

}  // namespace cf
