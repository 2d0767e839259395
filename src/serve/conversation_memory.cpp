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

ConversationMemory::ConversationMemory(Craft& craft, size_t max_conversations)
    : craft_(craft), max_(max_conversations) {}

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
        kept_.erase(it);
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
  std::lock_guard<std::mutex> lock(mu_);
  turn.last_used = ++clock_;
  kept_[id] = std::move(turn);
  if (kept_.size() > max_) {
    auto oldest = std::min_element(kept_.begin(), kept_.end(),
                                   [](const auto& a, const auto& b) { return a.second.last_used < b.second.last_used; });
    kept_.erase(oldest);
  }
}

void ConversationMemory::forget(const std::string& id) {
  craft_.forget_conversation(id);
  std::lock_guard<std::mutex> lock(mu_);
  kept_.erase(id);
}

size_t ConversationMemory::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kept_.size();
}

}  // namespace cf
