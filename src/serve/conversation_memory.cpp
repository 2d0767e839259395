#include "serve/conversation_memory.h"

#include <algorithm>

#include "serve/craft.h"

namespace cf {

bool continues_turn(const KeptTurn& kept, const std::vector<ChatMessage>& m) {
  const size_t k = kept.messages.size();
  bool continues = m.size() == k + 2 && m[k].role == "assistant" && m[k].content == kept.answer;
  for (size_t i = 0; continues && i < k; ++i)
    continues = m[i].role == kept.messages[i].role && m[i].content == kept.messages[i].content;
  return continues;
}

ConversationMemory::ConversationMemory(Craft& craft, size_t max_conversations, size_t max_bytes)
    : craft_(craft), max_(max_conversations), max_bytes_(max_bytes) {}

size_t ConversationMemory::turn_bytes(const std::string& id, const KeptTurn& turn) {
  constexpr size_t kEntry = 64;  // the map's node and bucket, roughly
  size_t n = kEntry + sizeof(KeptTurn) + 2 * id.size() + turn.answer.size() + turn.tokens.size() * sizeof(TokenId);
  for (const auto& m : turn.messages) n += sizeof(ChatMessage) + m.role.size() + m.content.size();
  return n;
}

void ConversationMemory::erase_locked(Kept::iterator it) {
  bytes_ -= it->second.bytes;
  kept_.erase(it);
}

std::optional<std::vector<TokenId>> ConversationMemory::continued(const std::string& id,
                                                                  const std::vector<ChatMessage>& messages) {
  std::optional<std::vector<TokenId>> tokens;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = kept_.find(id); it != kept_.end()) {
      if (continues_turn(it->second, messages)) {
        it->second.last_used = ++clock_;
        tokens = it->second.tokens;
      } else {
        erase_locked(it);
      }
    }
  }
  if (!tokens) craft_.forget_conversation(id);
  return tokens;
}

void ConversationMemory::end_turn(const std::string& id, bool clean, KeptTurn turn) {
  if (!clean) {
    craft_.forget_conversation(id);  // the turn is not kept
    return;
  }
  turn.bytes = turn_bytes(id, turn);
  if (turn.bytes > max_bytes_) {  // past the whole budget: not kept, nothing pushed out for it
    forget(id);
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  turn.last_used = ++clock_;
  if (auto it = kept_.find(id); it != kept_.end()) erase_locked(it);
  bytes_ += turn.bytes;
  kept_.emplace(id, std::move(turn));
  while (kept_.size() > max_ || bytes_ > max_bytes_) {  // the least recently used go
    erase_locked(std::min_element(kept_.begin(), kept_.end(), [](const auto& a, const auto& b) {
      return a.second.last_used < b.second.last_used;
    }));
  }
}

void ConversationMemory::forget(const std::string& id) {
  craft_.forget_conversation(id);
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = kept_.find(id); it != kept_.end()) erase_locked(it);
}

size_t ConversationMemory::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kept_.size();
}

size_t ConversationMemory::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

}  // namespace cf
