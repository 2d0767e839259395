// CRAFT, after craft-paper.txt §4 (digest part A):
//  - CA-Table (§4.1, digest A2.2): chunk id -> number of requests, among the last
//    `window_requests`, that retrieved it. A ring of the window's chunk-id sets plus a count
//    map; a request's chunks are counted after it arrives, before ordering (the +1 is the
//    same for all of them, so only window expiry can change the order).
//  - Reordering (§4.2, digest A2.3): descending frequency.
//  - CP-Tree (§4.1-4.3, digest A2.4): a radix tree over chunk ids; lookup walks the ordered
//    chunks from the root; promotion inserts the longest prefix whose chunks all reached
//    `promotion_threshold` when nothing matched; extension adds ONE child (the next chunk,
//    if it reached the threshold) each time a stored prefix is reused.
//  - Conversation-scoped dedup (§4.4, digest A2.6): ChunkMap[conversation] = chunks it has
//    seen; a chunk already there is dropped from later turns.
//  - Turns after the first of a conversation follow the history, not the common prefix the
//    CP-Tree describes, so they take no part in its lookup or promotion (digest A2.7).
//
// Deviations and choices the paper leaves open, each labelled:
//  - Tie-break (digest A6.2): equal frequencies order by chunk id, ascending, so that the
//    order depends only on the table, never on the retriever's rank.
//  - Counting (digest A6.10): a chunk repeated inside one request counts once.
//  - Tree-guided order (digest A6.1, option tree_guided_order): first take the deepest
//    CP-Tree path made of the request's chunks (ties: the more used child, then chunk id),
//    then frequency-sort the rest. Without it a drift in frequencies (C2 overtaking C1)
//    reorders a stored [C1, C2] as [C2, C1] and the sequential lookup misses.
//  - What the tree is for here (digest A6.5, option (a)): K/V lives in the token-level
//    PrefixCache, not in tree nodes. The tree is the retention policy: keep_chunks tells the
//    engine how many leading chunks' exact K/V to insert there. A prefix the PrefixCache
//    has evicted may still be in the tree; the engine's actual hit is what the PrefixCache
//    reports. The tree is bounded by max_tree_nodes (least recently used leaves go first).
//  - Dedup within a conversation also drops a chunk repeated inside the same request.
#include "serve/craft.h"

#include <algorithm>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace cf {

struct Craft::Impl {
  struct TreeNode {
    TreeNode* parent = nullptr;
    std::string chunk;
    uint64_t uses = 0;       // requests that reused the prefix ending here
    uint64_t last_used = 0;
    std::map<std::string, std::unique_ptr<TreeNode>> children;
  };
  struct Conversation {
    std::unordered_set<std::string> seen;
    std::list<std::string>::iterator lru_pos;
    size_t bytes = 0;  // accounted in conversation_bytes
  };
  // What a ChunkMap costs: its id (map key and LRU list), and each seen id with its hash node.
  static constexpr size_t kConversationEntry = 128, kSeenEntry = 64;

  CraftOptions opt;
  mutable std::mutex mu;
  std::deque<std::vector<std::string>> window;  // oldest first
  std::unordered_map<std::string, uint32_t> counts;
  TreeNode root;
  size_t tree_nodes = 0;
  uint64_t clock = 0;
  std::unordered_map<std::string, Conversation> conversations;
  std::list<std::string> conversation_lru;  // most recent first
  size_t conversation_bytes = 0;
  CraftStats st;

  explicit Impl(CraftOptions o) : opt(o) {}

  uint32_t count(const std::string& id) const {
    auto it = counts.find(id);
    return it == counts.end() ? 0 : it->second;
  }

  void push_window(const std::vector<std::string>& ids) {
    std::vector<std::string> unique(ids);
    std::sort(unique.begin(), unique.end());
    unique.erase(std::unique(unique.begin(), unique.end()), unique.end());
    for (const auto& id : unique) ++counts[id];
    window.push_back(std::move(unique));
    while (window.size() > std::max<size_t>(opt.window_requests, 1)) {
      for (const auto& id : window.front()) {
        auto it = counts.find(id);
        if (--it->second == 0) counts.erase(it);
      }
      window.pop_front();
    }
  }

  // Returns the conversation's ChunkMap (created if new) and whether it existed before.
  std::pair<Conversation*, bool> conversation(const std::string& id) {
    auto it = conversations.find(id);
    if (it != conversations.end()) {
      conversation_lru.splice(conversation_lru.begin(), conversation_lru, it->second.lru_pos);
      return {&it->second, true};
    }
    conversation_lru.push_front(id);
    Conversation& c = conversations[id];
    c.lru_pos = conversation_lru.begin();
    c.bytes = kConversationEntry + 2 * id.size();
    conversation_bytes += c.bytes;
    while (conversations.size() > std::max<size_t>(opt.max_conversations, 1)) drop_oldest_conversation();
    return {&c, false};
  }

  void drop_conversation(std::unordered_map<std::string, Conversation>::iterator it) {
    conversation_bytes -= it->second.bytes;
    conversation_lru.erase(it->second.lru_pos);
    conversations.erase(it);
  }
  void drop_oldest_conversation() { drop_conversation(conversations.find(conversation_lru.back())); }

  // After a conversation's map grew: the least recently used others go past the byte budget
  // (the one in use stays: one conversation's map holds at most a context's worth of chunks).
  void bound_conversation_bytes() {
    while (conversation_bytes > opt.max_conversation_bytes && conversations.size() > 1) drop_oldest_conversation();
  }

  bool more_frequent(const std::string& a, const std::string& b) const {
    const uint32_t ca = count(a), cb = count(b);
    return ca != cb ? ca > cb : a < b;
  }

  // Deepest tree path whose chunks are all among `available` (each used once).
  void deepest_path(const TreeNode* n, std::unordered_map<std::string, int>& available,
                    std::vector<const TreeNode*>& path, std::vector<const TreeNode*>& best) const {
    if (path.size() > best.size()) best = path;
    std::vector<const TreeNode*> kids;
    for (const auto& [id, c] : n->children) {
      auto it = available.find(id);
      if (it != available.end() && it->second > 0) kids.push_back(c.get());
    }
    // More used first; std::map already gives chunk-id order among equals (stable sort).
    std::stable_sort(kids.begin(), kids.end(), [](const TreeNode* a, const TreeNode* b) { return a->uses > b->uses; });
    for (const TreeNode* c : kids) {
      --available[c->chunk];
      path.push_back(c);
      deepest_path(c, available, path, best);
      path.pop_back();
      ++available[c->chunk];
    }
  }

  TreeNode* tree_child(TreeNode* n, const std::string& id) const {
    auto it = n->children.find(id);
    return it == n->children.end() ? nullptr : it->second.get();
  }

  TreeNode* add_child(TreeNode* n, const std::string& id) {
    auto node = std::make_unique<TreeNode>();
    node->parent = n;
    node->chunk = id;
    node->last_used = clock;
    TreeNode* raw = node.get();
    n->children.emplace(id, std::move(node));
    ++tree_nodes;
    return raw;
  }

  // Dedup against what the conversation has seen (its earlier turns and this one): the
  // indices kept, in request order; the others go to `dropped`. `later_turn` says whether
  // the conversation existed before this request.
  std::vector<size_t> dedup(const std::vector<std::string>& chunk_ids, const std::string& conversation_id,
                            std::vector<size_t>& dropped, bool& later_turn) {
    std::vector<size_t> kept;
    if (conversation_id.empty()) {
      for (size_t i = 0; i < chunk_ids.size(); ++i) kept.push_back(i);
      return kept;
    }
    auto [conv, existed] = conversation(conversation_id);
    later_turn = existed;
    for (size_t i = 0; i < chunk_ids.size(); ++i) {
      if (conv->seen.insert(chunk_ids[i]).second) {
        kept.push_back(i);
        conv->bytes += kSeenEntry + chunk_ids[i].size();
        conversation_bytes += kSeenEntry + chunk_ids[i].size();
      } else {
        dropped.push_back(i);
      }
    }
    bound_conversation_bytes();
    st.chunks_deduped += chunk_ids.size() - kept.size();  // this request's, whatever `dropped` held
    return kept;
  }

  void prune_tree(const TreeNode* keep_leaf) {
    while (tree_nodes > std::max<size_t>(opt.max_tree_nodes, 1)) {
      TreeNode* victim = nullptr;
      std::vector<TreeNode*> stack{&root};
      while (!stack.empty()) {
        TreeNode* n = stack.back();
        stack.pop_back();
        if (n != &root && n != keep_leaf && n->children.empty() && (!victim || n->last_used < victim->last_used))
          victim = n;
        for (auto& [id, c] : n->children) stack.push_back(c.get());
      }
      if (!victim) return;
      victim->parent->children.erase(victim->chunk);
      --tree_nodes;
    }
  }
};

Craft::Craft(CraftOptions opt) : impl_(std::make_unique<Impl>(opt)) {}
Craft::~Craft() = default;

CraftPlan Craft::plan(const std::vector<std::string>& chunk_ids, const std::string& conversation_id, bool reorder) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  CraftPlan plan;
  ++m.st.requests;
  m.st.chunks_seen += chunk_ids.size();
  ++m.clock;
  m.push_window(chunk_ids);

  bool later_turn = false;
  const std::vector<size_t> kept = m.dedup(chunk_ids, conversation_id, plan.dropped, later_turn);

  auto id = [&](size_t i) -> const std::string& { return chunk_ids[i]; };
  const bool use_tree = !later_turn;
  if (reorder) {
    std::vector<size_t> rest = kept;
    if (use_tree && m.opt.tree_guided_order) {
      std::unordered_map<std::string, int> available;
      for (size_t i : kept) ++available[id(i)];
      std::vector<const Impl::TreeNode*> path, best;
      m.deepest_path(&m.root, available, path, best);
      for (const auto* n : best) {  // the first unused request chunk with this id
        auto it = std::find_if(rest.begin(), rest.end(), [&](size_t i) { return id(i) == n->chunk; });
        plan.order.push_back(*it);
        rest.erase(it);
      }
    }
    std::stable_sort(rest.begin(), rest.end(), [&](size_t a, size_t b) { return m.more_frequent(id(a), id(b)); });
    plan.order.insert(plan.order.end(), rest.begin(), rest.end());
  } else {
    plan.order = kept;
  }

  if (use_tree) {
    // Lookup: longest stored chunk prefix of the order.
    Impl::TreeNode* n = &m.root;
    while (plan.matched_chunks < plan.order.size()) {
      Impl::TreeNode* c = m.tree_child(n, id(plan.order[plan.matched_chunks]));
      if (!c) break;
      c->last_used = m.clock;
      ++c->uses;
      n = c;
      ++plan.matched_chunks;
    }
    if (plan.matched_chunks > 0) {
      ++m.st.tree_hits;
      m.st.tree_hit_chunks += plan.matched_chunks;
    }

    const auto hot = [&](size_t pos) { return m.count(id(plan.order[pos])) >= static_cast<uint32_t>(m.opt.promotion_threshold); };
    plan.keep_chunks = plan.matched_chunks;
    if (plan.matched_chunks == 0) {
      // Promotion: the leading chunks that all reached the threshold become a stored prefix.
      while (plan.keep_chunks < plan.order.size() && hot(plan.keep_chunks)) {
        n = m.add_child(n, id(plan.order[plan.keep_chunks]));
        ++plan.keep_chunks;
      }
    } else if (plan.matched_chunks < plan.order.size() && hot(plan.matched_chunks)) {
      // Extension: one child per reuse.
      n = m.add_child(n, id(plan.order[plan.matched_chunks]));
      ++plan.keep_chunks;
    }
    m.prune_tree(n);
  }
  return plan;
}

void Craft::forget_conversation(const std::string& conversation_id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->conversations.find(conversation_id);
  if (it == impl_->conversations.end()) return;
  impl_->drop_conversation(it);
}

CraftStats Craft::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  CraftStats s = impl_->st;
  s.table_entries = impl_->counts.size();
  s.tree_nodes = impl_->tree_nodes;
  s.conversations = impl_->conversations.size();
  s.conversation_bytes = impl_->conversation_bytes;
  return s;
}

}  // namespace cf
