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
};

// Whether `messages` continue `kept`: the kept messages, the kept answer, one new message.
bool continues_turn(const KeptTurn& kept, const std::vector<ChatMessage>& messages);

class ConversationMemory {
 public:
  explicit ConversationMemory(Craft& craft, size_t max_conversations = 10000);

  // The kept tokens when `messages` continue conversation `id`; else nullopt, the kept turn is
  // dropped and CRAFT forgets the conversation (its earlier documents are not in this prompt).
  std::optional<std::vector<TokenId>> continued(const std::string& id, const std::vector<ChatMessage>& messages);
  // A turn ended: clean (EOS, length) keeps it for the next turn (the least recently used
  // conversation goes beyond the limit); otherwise CRAFT forgets the conversation.
  void end_turn(const std::string& id, bool clean, KeptTurn turn);
  // A turn failed: nothing of the conversation is kept.
  void forget(const std::string& id);
  size_t size() const;

 private:
  Craft& craft_;
  const size_t max_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, KeptTurn> kept_;
  uint64_t clock_ = 0;
};

}  // namespace cf
