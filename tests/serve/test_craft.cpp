// CRAFT's bookkeeping (src/serve/craft.h): ordering, ties, the window, the CP-Tree worked
// example of the paper (digest A2.4), dedup, the tree-guided order. Pure logic, no model.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "serve/craft.h"

namespace cf {
namespace {

using Ids = std::vector<std::string>;

// The plan's order as chunk ids.
Ids ordered(const Ids& ids, const CraftPlan& p) {
  Ids out;
  for (size_t i : p.order) out.push_back(ids[i]);
  return out;
}

// Appending rather than `"c" + std::to_string(n)`, which trips GCC 12's -Wrestrict false positive.
std::string id(const char* prefix, int n) {
  std::string s = prefix;
  s += std::to_string(n);
  return s;
}

CraftOptions frequency_only() {
  CraftOptions o;
  o.tree_guided_order = false;
  return o;
}

TEST(Craft, OrdersByDescendingFrequency) {
  Craft craft(frequency_only());
  craft.plan({"a", "b", "c"}, "", true);
  craft.plan({"a", "b"}, "", true);
  craft.plan({"a"}, "", true);
  // Counts after this request: a 4, b 3, c 2, d 1.
  const Ids req{"d", "c", "b", "a"};
  EXPECT_EQ(ordered(req, craft.plan(req, "", true)), (Ids{"a", "b", "c", "d"}));
}

TEST(Craft, WithoutReorderKeepsTheGivenOrder) {
  Craft craft(frequency_only());
  craft.plan({"a", "b"}, "", true);
  const Ids req{"c", "b", "a"};
  const CraftPlan p = craft.plan(req, "", false);
  EXPECT_EQ(p.order, (std::vector<size_t>{0, 1, 2}));
  EXPECT_TRUE(p.dropped.empty());
}

TEST(Craft, TiesBreakByChunkIdWhateverTheRetrieverOrder) {
  Craft craft(frequency_only());
  const Ids r1{"z", "x", "y"}, r2{"y", "z", "x"};
  EXPECT_EQ(ordered(r1, craft.plan(r1, "", true)), (Ids{"x", "y", "z"}));
  EXPECT_EQ(ordered(r2, craft.plan(r2, "", true)), (Ids{"x", "y", "z"}));
}

TEST(Craft, ChunkRepeatedInOneRequestCountsOnce) {
  Craft craft(frequency_only());
  craft.plan({"a", "a", "a"}, "", true);  // a: 1, not 3
  craft.plan({"b"}, "", true);
  craft.plan({"b"}, "", true);            // b: 2
  const Ids req{"a", "b"};
  EXPECT_EQ(ordered(req, craft.plan(req, "", true)), (Ids{"b", "a"}));
}

TEST(Craft, CountsExpireWithTheWindow) {
  CraftOptions o = frequency_only();
  o.window_requests = 2;
  Craft craft(o);
  craft.plan({"a"}, "", true);
  craft.plan({"a"}, "", true);
  craft.plan({"b"}, "", true);
  craft.plan({"b"}, "", true);  // window: [b] [b]; a has left the table
  EXPECT_EQ(craft.stats().table_entries, 1u);
  const Ids req{"a", "b"};  // window: [b] [a b] -> a 1, b 2
  EXPECT_EQ(ordered(req, craft.plan(req, "", true)), (Ids{"b", "a"}));

  // With a window holding everything, a 3 and b 3 tie and the id decides.
  Craft unbounded(frequency_only());
  for (const Ids& r : {Ids{"a"}, Ids{"a"}, Ids{"b"}, Ids{"b"}}) unbounded.plan(r, "", true);
  EXPECT_EQ(ordered(req, unbounded.plan(req, "", true)), (Ids{"a", "b"}));
}

// craft-paper.txt §4.3 "Example", threshold 2, followed step by step.
TEST(Craft, PaperWorkedExample) {
  Craft craft;  // defaults: threshold 2, tree-guided order
  // CA = {C1:1, C2:1}, tree empty.
  CraftPlan p = craft.plan({"C1", "C2"}, "", true);
  EXPECT_EQ(p.matched_chunks, 0u);
  EXPECT_EQ(p.keep_chunks, 0u);
  EXPECT_EQ(craft.stats().tree_nodes, 0u);

  // [C1,C2,C5]: no prefix found; C1, C2 reach 2 and lead the order -> insert [C1,C2].
  const Ids r1{"C1", "C2", "C5"};
  p = craft.plan(r1, "", true);
  EXPECT_EQ(ordered(r1, p), r1);
  EXPECT_EQ(p.matched_chunks, 0u);
  EXPECT_EQ(p.keep_chunks, 2u);
  EXPECT_EQ(craft.stats().tree_nodes, 2u);

  // [C1,C2,C6]: [C1,C2] reused; C6 is at 1, the tree is unchanged.
  const Ids r2{"C1", "C2", "C6"};
  p = craft.plan(r2, "", true);
  EXPECT_EQ(ordered(r2, p), r2);
  EXPECT_EQ(p.matched_chunks, 2u);
  EXPECT_EQ(p.keep_chunks, 2u);
  EXPECT_EQ(craft.stats().tree_nodes, 2u);

  // The same again: [C1,C2] reused, C6 reaches 2 -> extended to [C1,C2,C6].
  p = craft.plan(r2, "", true);
  EXPECT_EQ(p.matched_chunks, 2u);
  EXPECT_EQ(p.keep_chunks, 3u);
  EXPECT_EQ(craft.stats().tree_nodes, 3u);

  // And now the whole path matches.
  p = craft.plan(r2, "", true);
  EXPECT_EQ(p.matched_chunks, 3u);
  EXPECT_EQ(p.keep_chunks, 3u);

  // Prefix slicing: [C1,C10,C11] reuses C1 alone.
  const Ids r3{"C1", "C10", "C11"};
  p = craft.plan(r3, "", true);
  EXPECT_EQ(ordered(r3, p).front(), "C1");
  EXPECT_EQ(p.matched_chunks, 1u);

  const CraftStats s = craft.stats();
  EXPECT_EQ(s.requests, 6u);
  EXPECT_EQ(s.chunks_seen, 17u);
  EXPECT_EQ(s.tree_hits, 4u);
  EXPECT_EQ(s.tree_hit_chunks, 2u + 2u + 3u + 1u);
}

TEST(Craft, ExtensionAddsOneChildPerReuse) {
  Craft craft;
  craft.plan({"a"}, "", false);
  CraftPlan p = craft.plan({"a"}, "", false);  // a reaches 2: [a] promoted
  EXPECT_EQ(p.keep_chunks, 1u);
  craft.plan({"b", "c"}, "", false);  // b 1, c 1: below the threshold, nothing promoted
  EXPECT_EQ(craft.stats().tree_nodes, 1u);

  const Ids req{"a", "b", "c"};  // a 3, b 2, c 2: all hot, yet only b is added this time
  p = craft.plan(req, "", false);
  EXPECT_EQ(p.matched_chunks, 1u);
  EXPECT_EQ(p.keep_chunks, 2u);
  p = craft.plan(req, "", false);
  EXPECT_EQ(p.matched_chunks, 2u);
  EXPECT_EQ(p.keep_chunks, 3u);
  EXPECT_EQ(craft.stats().tree_nodes, 3u);
}

TEST(Craft, PromotionStopsAtTheFirstColdChunk) {
  Craft craft;
  craft.plan({"a", "b", "c"}, "", false);
  const CraftPlan p = craft.plan({"a", "b", "c"}, "", false);  // all at 2: the whole prefix
  EXPECT_EQ(p.keep_chunks, 3u);
  Craft cold;
  cold.plan({"a", "c"}, "", false);
  const CraftPlan q = cold.plan({"a", "b", "c"}, "", false);  // a 2, b 1, c 2
  EXPECT_EQ(q.keep_chunks, 1u);                                // c is hot but after cold b
}

// Digest A6.1: [a,b] is stored, then b becomes more popular than a. Frequency order turns
// the request into [b,a] and the sequential lookup finds only [b]; the tree-guided order
// keeps [a,b] and its full hit.
TEST(Craft, TreeGuidedOrderKeepsHitsWhenFrequenciesDrift) {
  auto run = [](bool tree_guided) {
    CraftOptions o;
    o.tree_guided_order = tree_guided;
    Craft craft(o);
    craft.plan({"x"}, "", true);
    craft.plan({"a", "x"}, "", true);
    craft.plan({"a", "b"}, "", true);  // a 2 -> [a] promoted
    CraftPlan p = craft.plan({"a", "b"}, "", true);  // a 3, b 2: [a] reused, b added
    EXPECT_EQ(p.keep_chunks, 2u);
    for (int i = 0; i < 4; ++i) craft.plan({"b", id("y", i)}, "", true);  // b 6 > a 3
    const Ids req{"a", "b"};
    p = craft.plan(req, "", true);
    return std::make_pair(ordered(req, p), p.matched_chunks);
  };
  const auto [guided_order, guided_hit] = run(true);
  EXPECT_EQ(guided_order, (Ids{"a", "b"}));
  EXPECT_EQ(guided_hit, 2u);
  const auto [freq_order, freq_hit] = run(false);
  EXPECT_EQ(freq_order, (Ids{"b", "a"}));
  EXPECT_EQ(freq_hit, 1u);  // only [b], promoted while b was rising
}

TEST(Craft, TreeGuidedOrderPutsTheRestByFrequency) {
  Craft craft;
  craft.plan({"a", "b"}, "", false);
  craft.plan({"a", "b"}, "", false);  // [a,b] promoted
  for (int i = 0; i < 3; ++i) craft.plan({"z"}, "", false);
  const Ids req{"q", "b", "z", "a"};  // z 4, a 3, b 3, q 1: the stored path first, then z, q
  const CraftPlan p = craft.plan(req, "", true);
  EXPECT_EQ(ordered(req, p), (Ids{"a", "b", "z", "q"}));
  EXPECT_EQ(p.matched_chunks, 2u);
}

TEST(Craft, ConversationDedupDropsChunksSeenEarlier) {
  Craft craft;
  const Ids t1{"C1", "C2", "C3"}, t2{"C2", "C3", "C4"};
  CraftPlan p = craft.plan(t1, "conv", true);
  EXPECT_TRUE(p.dropped.empty());
  EXPECT_EQ(p.order.size(), 3u);
  p = craft.plan(t2, "conv", true);
  EXPECT_EQ(p.dropped, (std::vector<size_t>{0, 1}));
  EXPECT_EQ(ordered(t2, p), (Ids{"C4"}));
  EXPECT_EQ(p.matched_chunks, 0u);  // a later turn follows its history: no CP-Tree
  EXPECT_EQ(p.keep_chunks, 0u);

  // Another conversation, and no conversation, are unaffected.
  EXPECT_TRUE(craft.plan(t2, "other", true).dropped.empty());
  EXPECT_TRUE(craft.plan(t2, "", true).dropped.empty());
  // A repeat inside one turn is a repeat within the conversation.
  p = craft.plan({"C9", "C9"}, "conv", false);
  EXPECT_EQ(p.dropped, (std::vector<size_t>{1}));

  craft.forget_conversation("conv");
  EXPECT_TRUE(craft.plan(t1, "conv", true).dropped.empty());

  const CraftStats s = craft.stats();
  EXPECT_EQ(s.chunks_deduped, 3u);
  EXPECT_EQ(s.conversations, 2u);
}

TEST(Craft, ConversationMapsAreLruBounded) {
  CraftOptions o;
  o.max_conversations = 2;
  Craft craft(o);
  craft.plan({"x"}, "a", false);
  craft.plan({"x"}, "b", false);
  craft.plan({"y"}, "a", false);  // a is now the most recent
  craft.plan({"x"}, "c", false);  // b is dropped
  EXPECT_EQ(craft.stats().conversations, 2u);
  EXPECT_EQ(craft.plan({"x"}, "a", false).dropped.size(), 1u);
  EXPECT_TRUE(craft.plan({"x"}, "b", false).dropped.empty());  // b forgotten, starts afresh
}

// Issue 59: the maps were bounded by count only, and each grows by its turns' documents (10,000
// conversations of many chunks each); they are bounded in bytes too, least recently used first.
TEST(Craft, ConversationMapsAreBoundedInBytes) {
  CraftOptions o;
  o.max_conversation_bytes = 64 << 10;
  Craft craft(o);
  for (int c = 0; c < 40; ++c) {
    Ids docs;
    for (int i = 0; i < 64; ++i) docs.push_back(id("chunk-of-some-32-hex-digits-", c * 64 + i));
    craft.plan(docs, id("conv", c), false);
    ASSERT_LE(craft.stats().conversation_bytes, o.max_conversation_bytes) << "after conversation " << c;
  }
  EXPECT_LT(craft.stats().conversations, 40u);
  EXPECT_GE(craft.stats().conversations, 2u);
  const Ids first{id("chunk-of-some-32-hex-digits-", 0)}, last{id("chunk-of-some-32-hex-digits-", 39 * 64)};
  EXPECT_EQ(craft.plan(last, id("conv", 39), false).dropped.size(), 1u);  // the newest still dedups
  EXPECT_TRUE(craft.plan(first, id("conv", 0), false).dropped.empty());   // the oldest was forgotten
  for (int c = 0; c < 40; ++c) craft.forget_conversation(id("conv", c));
  EXPECT_EQ(craft.stats().conversations, 0u);
  EXPECT_EQ(craft.stats().conversation_bytes, 0u) << "forgetting gives every byte back";
}

TEST(Craft, TreeIsBounded) {
  CraftOptions o;
  o.max_tree_nodes = 3;
  Craft craft(o);
  for (int i = 0; i < 10; ++i) {
    const Ids req{id("p", i), id("q", i)};
    craft.plan(req, "", false);
    const CraftPlan p = craft.plan(req, "", false);
    EXPECT_EQ(p.keep_chunks, 2u);  // the fresh path survives its own pruning
    EXPECT_LE(craft.stats().tree_nodes, 3u);
  }
}

TEST(Craft, ConcurrentPlansAreAllCounted) {
  Craft craft;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&craft, t] {
      for (int i = 0; i < 500; ++i) {
        const Ids req{id("c", i % 7), id("c", (i + t) % 11), id("d", t)};
        const CraftPlan p = craft.plan(req, i % 3 ? "" : id("conv", t), true);
        EXPECT_EQ(p.order.size() + p.dropped.size(), req.size());
        EXPECT_LE(p.keep_chunks, p.order.size());
      }
    });
  for (auto& th : threads) th.join();
  const CraftStats s = craft.stats();
  EXPECT_EQ(s.requests, 2000u);
  EXPECT_EQ(s.chunks_seen, 6000u);
  EXPECT_EQ(s.conversations, 4u);
}

}  // namespace
}  // namespace cf
