#include "serve/prefix_cache.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>

#include "runtime/forward.h"

namespace cf {

namespace {

// One block's K/V for every layer, laid out [layer][token][kv_dim]. Immutable once built
// and shared: a lookup copies from it outside the lock, so evicting its node while a
// copy is under way only drops the tree's reference, never the bytes being read.
struct BlockKv {
  std::vector<uint16_t> k, v;  // f16 bits, as KvCache holds them
};

}  // namespace

struct PrefixCache::Impl {
  struct Node {
    Node* parent = nullptr;
    std::vector<TokenId> key;  // this block's token ids (empty at the root)
    std::shared_ptr<const BlockKv> kv;
    uint64_t last_used = 0;    // a path is touched as a whole, so a parent is never older than its children
    std::map<std::vector<TokenId>, std::unique_ptr<Node>> children;
  };

  ModelHparams h;
  PrefixCacheOptions opt;
  size_t block_bytes = 0;

  mutable std::mutex mu;
  Node root;
  uint64_t clock = 0;
  PrefixCacheStats st;

  Impl(const ModelHparams& hp, PrefixCacheOptions o) : h(hp), opt(o) {
    if (opt.block_tokens == 0) throw std::invalid_argument("PrefixCache: block_tokens must be positive");
    block_bytes = 2 * static_cast<size_t>(h.n_layers) * opt.block_tokens * h.kv_dim() * KvCache::kValueBytes;
  }

  std::span<const TokenId> block(std::span<const TokenId> tokens, size_t b) const {
    return tokens.subspan(b * opt.block_tokens, opt.block_tokens);
  }

  Node* child(Node* n, std::span<const TokenId> key) const {
    auto it = n->children.find(std::vector<TokenId>(key.begin(), key.end()));
    return it == n->children.end() ? nullptr : it->second.get();
  }

  // Matched path below the root (caller holds mu), touched as most recently used.
  std::vector<Node*> walk(std::span<const TokenId> tokens) {
    std::vector<Node*> path;
    const size_t n_blocks = tokens.size() / opt.block_tokens;
    Node* n = &root;
    for (size_t b = 0; b < n_blocks; ++b) {
      n = child(n, block(tokens, b));
      if (!n) break;
      path.push_back(n);
    }
    ++clock;
    for (Node* p : path) p->last_used = clock;
    return path;
  }

  std::shared_ptr<const BlockKv> copy_block(const KvCache& cache, size_t first_slot) const {
    auto kv = std::make_shared<BlockKv>();
    const size_t per_layer = opt.block_tokens * static_cast<size_t>(h.kv_dim());
    kv->k.resize(per_layer * h.n_layers);
    kv->v.resize(per_layer * h.n_layers);
    for (int l = 0; l < h.n_layers; ++l) {
      std::memcpy(&kv->k[l * per_layer], cache.k_f16(l, first_slot), per_layer * KvCache::kValueBytes);
      std::memcpy(&kv->v[l * per_layer], cache.v_f16(l, first_slot), per_layer * KvCache::kValueBytes);
    }
    return kv;
  }

  // Least recently used leaf, or null when the tree is empty (caller holds mu).
  Node* lru_leaf() {
    Node* best = nullptr;
    std::vector<Node*> stack{&root};
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      if (n != &root && n->children.empty() && (!best || n->last_used < best->last_used)) best = n;
      for (auto& [key, c] : n->children) stack.push_back(c.get());
    }
    return best;
  }

  void evict(Node* leaf) {  // caller holds mu; leaf has no children
    leaf->parent->children.erase(leaf->key);
    --st.blocks;
    st.bytes -= block_bytes;
    ++st.evicted_blocks;
    if (opt.account) opt.account->discharge(block_bytes);
  }

  void evict_to_budget() {  // caller holds mu
    while (st.bytes > opt.budget_bytes) {
      Node* leaf = lru_leaf();
      if (!leaf) break;
      evict(leaf);
    }
  }

  // One more block charged to the shared budget (caller holds mu), evicting least recently used
  // leaves older than this insert (`now`: its clock, which its path carries) until it fits.
  bool charge_block(uint64_t now) {
    while (opt.account && !opt.account->try_charge(block_bytes)) {
      Node* leaf = lru_leaf();
      if (!leaf || leaf->last_used >= now) return false;
      evict(leaf);
    }
    return true;
  }
};

PrefixCache::PrefixCache(const ModelHparams& h, PrefixCacheOptions opt) : impl_(std::make_unique<Impl>(h, opt)) {}
PrefixCache::~PrefixCache() = default;

size_t PrefixCache::lookup(std::span<const TokenId> tokens, KvCache& out) {
  Impl& m = *impl_;
  if (out.size() != 0) throw std::invalid_argument("PrefixCache::lookup: the output cache must be empty");
  if (out.n_layers() != m.h.n_layers || out.kv_dim() != m.h.kv_dim())
    throw std::invalid_argument("PrefixCache::lookup: cache of another model shape");

  std::vector<std::shared_ptr<const BlockKv>> blocks;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    for (auto* n : m.walk(tokens)) blocks.push_back(n->kv);
    ++m.st.lookups;
    m.st.lookup_tokens += tokens.size();
    m.st.hit_tokens += blocks.size() * m.opt.block_tokens;
    if (!blocks.empty()) ++m.st.hits;
  }

  // Copy outside the lock: the blocks are kept alive by our references.
  const size_t bt = m.opt.block_tokens;
  const size_t per_layer = bt * static_cast<size_t>(m.h.kv_dim());
  const size_t n = blocks.size() * bt;
  out.append(n);
  for (size_t b = 0; b < blocks.size(); ++b)
    for (int l = 0; l < m.h.n_layers; ++l) {
      std::memcpy(out.k_f16(l, b * bt), &blocks[b]->k[l * per_layer], per_layer * KvCache::kValueBytes);
      std::memcpy(out.v_f16(l, b * bt), &blocks[b]->v[l * per_layer], per_layer * KvCache::kValueBytes);
    }
  for (size_t i = 0; i < n; ++i) out.set_position(i, static_cast<int32_t>(i));
  return n;
}

void PrefixCache::insert(std::span<const TokenId> tokens, const KvCache& cache) {
  Impl& m = *impl_;
  if (cache.n_layers() != m.h.n_layers || cache.kv_dim() != m.h.kv_dim())
    throw std::invalid_argument("PrefixCache::insert: cache of another model shape");
  const size_t bt = m.opt.block_tokens;
  const size_t n_blocks = std::min(tokens.size(), cache.size()) / bt;
  if (n_blocks == 0 || m.block_bytes > m.opt.budget_bytes) return;
  for (size_t i = 0; i < n_blocks * bt; ++i)
    if (cache.position(i) != static_cast<int32_t>(i))
      throw std::invalid_argument("PrefixCache::insert: cache slot " + std::to_string(i) + " is not at position " +
                                  std::to_string(i));

  // Phase 1 (locked): how many blocks are already there. Phase 2 (unlocked): copy the
  // missing ones. Phase 3 (locked): link them in, sharing any a concurrent insert added.
  size_t present;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    present = m.walk(tokens.first(n_blocks * bt)).size();
  }
  if (present == n_blocks) return;
  std::vector<std::shared_ptr<const BlockKv>> fresh;
  for (size_t b = present; b < n_blocks; ++b) fresh.push_back(m.copy_block(cache, b * bt));

  std::lock_guard<std::mutex> lock(m.mu);
  ++m.clock;
  Impl::Node* n = &m.root;
  for (size_t b = 0; b < n_blocks; ++b) {
    auto key = m.block(tokens, b);
    Impl::Node* c = m.child(n, key);
    if (!c) {
      if (!m.charge_block(m.clock)) break;  // no room under the shared budget: the prefix so far stays
      // Evicted since phase 1 (b < present): its K/V is still in `cache`, copy it now.
      auto kv = b >= present ? fresh[b - present] : m.copy_block(cache, b * bt);
      auto node = std::make_unique<Impl::Node>();
      node->parent = n;
      node->key.assign(key.begin(), key.end());
      node->kv = std::move(kv);
      c = node.get();
      n->children.emplace(node->key, std::move(node));
      ++m.st.blocks;
      m.st.bytes += m.block_bytes;
      ++m.st.inserted_blocks;
    }
    c->last_used = m.clock;
    n = c;
  }
  m.evict_to_budget();
}

std::shared_ptr<const KvCache> PrefixCache::prefix(Forward& fwd, std::span<const TokenId> tokens, size_t& hit_tokens) {
  auto kv = std::make_shared<KvCache>(impl_->h, tokens.size());
  hit_tokens = lookup(tokens, *kv);
  if (hit_tokens < tokens.size()) {
    extend_prefix(fwd, *kv, tokens);
    insert(tokens, *kv);
  }
  return kv;
}

PrefixCacheStats PrefixCache::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  PrefixCacheStats s = impl_->st;
  s.budget_bytes = impl_->opt.budget_bytes;
  return s;
}

void PrefixCache::clear() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->root.children.clear();
  if (impl_->opt.account) impl_->opt.account->discharge(impl_->st.bytes);
  impl_->st.blocks = 0;
  impl_->st.bytes = 0;
}

size_t PrefixCache::release(size_t bytes) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  size_t freed = 0;
  while (freed < bytes) {
    Impl::Node* leaf = m.lru_leaf();
    if (!leaf) break;
    m.evict(leaf);
    freed += m.block_bytes;
  }
  return freed;
}

}  // namespace cf
