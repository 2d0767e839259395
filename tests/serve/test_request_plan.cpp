// The request plan, token accounting and conversation memory without a model (issue 25 item 1):
// which chunks join the exact prefix S', which are fused or prefilled after it, what CRAFT
// promotes, what is fetched, the options and limits, and what each request is counted as.
#include "serve/request_plan.h"

#include <gtest/gtest.h>

#include "kv/kv_test_util.h"
#include "serve/conversation_memory.h"
#include "serve/craft.h"
#include "serve/token_accounting.h"

namespace cf {
namespace {

// S = {1, 2}, chunks a = {10, 11}, b = {20, 21, 22}, c = {30}, U = {9}.
PromptLayout layout3() {
  PromptLayout l;
  l.system = {1, 2};
  l.chunks = {{10, 11}, {20, 21, 22}, {30}};
  l.chunk_ids = {"a", "b", "c"};
  l.suffix = {9};
  return l;
}

PlanLimits limits(size_t max_prompt = 100) {
  PlanLimits lim;
  lim.context_length = 100;
  lim.max_prompt_tokens = max_prompt;
  lim.max_documents = 8;
  lim.chat_stops = {"<end>"};
  return lim;
}

CompletionRequest request(const std::string& method, bool prefix_cache = true, bool reorder = false) {
  CompletionRequest r;
  r.messages = {{"user", "q"}};
  r.fusion.options.method = method;
  r.fusion.prefix_cache = prefix_cache;
  r.fusion.reorder = reorder;
  r.fusion.options.ratio = 0.3;
  r.max_tokens = 16;
  return r;
}

CraftPlan craft_plan(std::vector<size_t> order, size_t keep, size_t matched, std::vector<size_t> dropped = {}) {
  CraftPlan p;
  p.order = std::move(order);
  p.keep_chunks = keep;
  p.matched_chunks = matched;
  p.dropped = std::move(dropped);
  return p;
}

using Spans = std::vector<std::pair<size_t, size_t>>;
using Chunks = std::vector<std::vector<TokenId>>;

TEST(RequestPlan, FullWithoutPrefixCacheIsOnePlainPrefill) {
  const RequestPlan p = plan_request(request("full", false), layout3(), request_order(3), limits(), 7);
  EXPECT_FALSE(p.fused);
  EXPECT_EQ(p.rag.system, (std::vector<TokenId>{1, 2}));
  EXPECT_EQ(p.rag.chunks, (Chunks{{10, 11}, {20, 21, 22}, {30}}));
  EXPECT_TRUE(p.exact_spans.empty());
  EXPECT_FALSE(p.fetches_chunks());
  EXPECT_EQ(p.prompt_tokens, 9u);
  EXPECT_EQ(p.chunk_order, (std::vector<std::string>{"a", "b", "c"}));
}

TEST(RequestPlan, FullWithPrefixCachePutsEveryChunkInTheExactPrefix) {
  const RequestPlan p = plan_request(request("full"), layout3(), request_order(3), limits(), 7);
  EXPECT_EQ(p.rag.system, (std::vector<TokenId>{1, 2, 10, 11, 20, 21, 22, 30}));
  EXPECT_TRUE(p.rag.chunks.empty());
  EXPECT_EQ(p.exact_spans, (Spans{{2, 4}, {4, 7}, {7, 8}}));
  EXPECT_TRUE(p.promote.empty());
}

TEST(RequestPlan, FusedRequestFetchesEveryChunkWithItsOptions) {
  CompletionRequest r = request("epic");
  r.seed = 5;
  r.fusion.options.method_options = {{"k", 1}};
  const RequestPlan p = plan_request(r, layout3(), request_order(3), limits(), 7);
  EXPECT_TRUE(p.fused);
  EXPECT_TRUE(p.fetches_chunks());
  EXPECT_EQ(p.rag.system, (std::vector<TokenId>{1, 2}));
  EXPECT_EQ(p.rag.chunks.size(), 3u);
  EXPECT_EQ(p.fusion.method, "epic");
  EXPECT_DOUBLE_EQ(p.fusion.ratio, 0.3);
  EXPECT_EQ(p.fusion.seed, 5u);
  EXPECT_EQ(p.fusion.method_options, r.fusion.options.method_options);
  EXPECT_EQ(p.fusion.chunk_context, ChunkContext::alone);
  EXPECT_EQ(p.generate.sampling.seed, 5u);  // the request's seed, not seed_if_none
  r.fusion.options.chunk_context = ChunkContext::prefixed;
  EXPECT_EQ(plan_request(r, layout3(), request_order(3), limits(), 7).fusion.chunk_context, ChunkContext::prefixed);
}

// serve --schedule shortest orders by this: a fused request costs its recomputed rows and U,
// a plain one every token, with or without the prefix cache.
TEST(RequestPlan, ExpectedPrefillRowsPriceFusedBelowFull) {
  EXPECT_EQ(expected_prefill_rows(plan_request(request("full", false), layout3(), request_order(3), limits(), 7)), 9u);
  EXPECT_EQ(expected_prefill_rows(plan_request(request("full"), layout3(), request_order(3), limits(), 7)), 9u);
  // 6 chunk tokens at ratio 0.3: 2 recomputed, plus U (1); S too without the prefix cache.
  EXPECT_EQ(expected_prefill_rows(plan_request(request("epic"), layout3(), request_order(3), limits(), 7)), 3u);
  EXPECT_EQ(expected_prefill_rows(plan_request(request("epic", false), layout3(), request_order(3), limits(), 7)), 5u);
  EXPECT_EQ(expected_prefill_rows(plan_request(request("auto"), layout3(), request_order(3), limits(), 7)), 7u);
}

TEST(RequestPlan, CraftWithFusionKeepsTheHeldPrefixAndPromotesTheRest) {
  // CRAFT order c, a, b; it keeps two chunks of which the CP-Tree held one before.
  const RequestPlan p = plan_request(request("epic", true, true), layout3(), craft_plan({2, 0, 1}, 2, 1), limits(), 7);
  EXPECT_EQ(p.chunk_order, (std::vector<std::string>{"c", "a", "b"}));
  EXPECT_EQ(p.exact_spans, (Spans{{2, 3}}));
  EXPECT_EQ(p.rag.system, (std::vector<TokenId>{1, 2, 30}));
  EXPECT_EQ(p.rag.chunks, (Chunks{{10, 11}, {20, 21, 22}}));
  EXPECT_EQ(p.promote, (std::vector<TokenId>{1, 2, 30, 10, 11}));
  // Nothing newly promoted: nothing to compute when idle.
  EXPECT_TRUE(plan_request(request("epic", true, true), layout3(), craft_plan({2, 0, 1}, 1, 1), limits(), 7)
                  .promote.empty());
}

TEST(RequestPlan, CraftWithFullPrefillKeepsTheWholeKeepPrefixExact) {
  const RequestPlan p = plan_request(request("full", true, true), layout3(), craft_plan({1, 0, 2}, 2, 0), limits(), 7);
  EXPECT_EQ(p.exact_spans, (Spans{{2, 5}, {5, 7}}));
  EXPECT_EQ(p.rag.chunks, (Chunks{{30}}));
  EXPECT_TRUE(p.promote.empty());
}

TEST(RequestPlan, ConversationDedupDropsChunks) {
  CompletionRequest r = request("full");
  r.fusion.conversation_id = "c1";
  const RequestPlan p = plan_request(r, layout3(), craft_plan({0, 2}, 0, 0, {1}), limits(), 7);
  EXPECT_TRUE(p.conversation);
  EXPECT_EQ(p.conversation_id, "c1");
  EXPECT_EQ(p.deduped_chunks, 1u);
  EXPECT_EQ(p.chunk_order, (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(p.prompt_tokens, 6u);
}

TEST(RequestPlan, LimitsAndGeneration) {
  try {
    plan_request(request("full"), layout3(), request_order(3), limits(9), 7);  // 9 + 1 > 9
    FAIL() << "expected 413";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.status, 413);
    EXPECT_EQ(e.param, "messages");
  }
  EXPECT_NO_THROW(plan_request(request("full"), layout3(), request_order(3), limits(10), 7));
  CompletionRequest r = request("full");
  r.max_tokens = 95;
  const RequestPlan p = plan_request(r, layout3(), request_order(3), limits(), 7);
  EXPECT_EQ(p.generate.max_tokens, 91);  // context 100 - 9 prompt tokens
  EXPECT_EQ(p.generate.stop, (std::vector<std::string>{"<end>"}));
  EXPECT_EQ(p.generate.sampling.seed, 7u);
  EXPECT_EQ(p.generate.sampling.top_k, 0);
  r.stop = {"x"};
  EXPECT_EQ(plan_request(r, layout3(), request_order(3), limits(), 7).generate.stop, r.stop);
  r.chat = false;
  r.stop.clear();
  EXPECT_TRUE(plan_request(r, layout3(), request_order(3), limits(), 7).generate.stop.empty());
}

// Issue 59: Cache-Craft's max_variants (one cache file per variant and chunk) has a server
// ceiling, serve --max-variants (16 by default): a request over it is 400 naming it, and a
// request that names none gets the method's default (5) lowered to the ceiling.
TEST(RequestPlan, CacheCraftVariantsAreBoundedByTheServersCeiling) {
  PlanLimits lim = limits();
  lim.max_variants = 3;
  CompletionRequest r = request("cachecraft");
  r.fusion.options.method_options = {{"max_variants", 4}};
  try {
    validate_request(r, lim);
    ADD_FAILURE() << "max_variants 4 over a ceiling of 3 was accepted";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "fusion.options");
    EXPECT_NE(std::string(e.what()).find("--max-variants"), std::string::npos) << e.what();
  }
  r.fusion.options.method_options = {{"max_variants", 3}};
  EXPECT_NO_THROW(validate_request(r, lim));
  EXPECT_EQ(plan_request(r, layout3(), request_order(3), lim, 7).fusion.method_options["max_variants"], 3);
  r.fusion.options.method_options = nullptr;  // none asked: the default 5, lowered to 3
  EXPECT_EQ(plan_request(r, layout3(), request_order(3), lim, 7).fusion.method_options["max_variants"], 3);
  r.fusion.options.method_options = {{"alpha", 1.0}};
  const RequestPlan p = plan_request(r, layout3(), request_order(3), lim, 7);
  EXPECT_EQ(p.fusion.method_options["max_variants"], 3);
  EXPECT_EQ(p.fusion.method_options["alpha"], 1.0);
  lim.max_variants = 16;  // the default ceiling leaves the method's default alone
  r.fusion.options.method_options = nullptr;
  EXPECT_TRUE(plan_request(r, layout3(), request_order(3), lim, 7).fusion.method_options.is_null());
  r.fusion.options.method_options = {{"max_variants", 16}};
  EXPECT_NO_THROW(validate_request(r, lim));
}

TEST(RequestPlan, ValidationNamesTheParameter) {
  auto param_of = [](const CompletionRequest& r) {
    try {
      validate_request(r, limits());
    } catch (const RequestError& e) {
      EXPECT_EQ(e.status, 400);
      return e.param;
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(param_of(request("full")), "(accepted)");
  EXPECT_EQ(param_of(request("epic")), "(accepted)");
  EXPECT_EQ(param_of(request("nonsense")), "fusion.method");
  CompletionRequest r = request("full");
  r.fusion.options.ratio = 1.5;
  EXPECT_EQ(param_of(r), "fusion.ratio");
  r = request("full");
  r.max_tokens = 101;
  EXPECT_EQ(param_of(r), "max_tokens");
  r = request("full");
  r.top_p = 0;
  EXPECT_EQ(param_of(r), "top_p");
  r = request("full");
  r.documents.resize(9);
  EXPECT_EQ(param_of(r), "documents");
  r = request("full");
  r.messages.push_back({"assistant", "a"});
  EXPECT_EQ(param_of(r), "messages");
}

TEST(RequestPlan, CraftIsAskedForReorderOrConversationWithDocuments) {
  CompletionRequest r = request("full");
  EXPECT_FALSE(wants_craft(r, layout3()));
  r.fusion.conversation_id = "c";
  EXPECT_TRUE(wants_craft(r, layout3()));
  EXPECT_FALSE(wants_craft(r, PromptLayout{}));
  r = request("full", true, true);
  EXPECT_TRUE(wants_craft(r, layout3()));
  EXPECT_EQ(request_order(3).order, (std::vector<size_t>{0, 1, 2}));
}

// Every field but the cache at its default (the executor's own initialiser names them all).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
FusionResult empty_result() { return FusionResult{.cache = KvCache(test::tiny_hparams())}; }
#pragma GCC diagnostic pop

TEST(TokenAccounting, ExactChunksHitAsFarAsThePrefixCacheCovered) {
  // S' = S(2) a(2) b(3) c(1); the prefix cache held 5 tokens: a hit, b partly computed, c missed.
  const RequestPlan p = plan_request(request("full"), layout3(), request_order(3), limits(), 7);
  FusionResult fr = empty_result();
  fr.prefix_hit_tokens = 5;
  const TokenCounts n = count_tokens(p, fr);
  EXPECT_EQ(n.prefix_hit_tokens, 5u);
  EXPECT_EQ(n.chunk_hits, 1u);
  EXPECT_EQ(n.chunk_misses, 2u);
  EXPECT_EQ(n.recomputed_tokens, 2u + 1u);
  EXPECT_EQ(n.prefilled_tokens, 9u - 5u);
  EXPECT_EQ(n.cached_tokens, 5u);  // a plain prefill reuses the prefix hit alone
  fr.prefix_hit_tokens = 0;        // cold: everything computed, nothing cached
  EXPECT_EQ(count_tokens(p, fr).cached_tokens, 0u);
}

TEST(TokenAccounting, FusedRequestsAddTheExecutorsCounts) {
  const RequestPlan p = plan_request(request("epic"), layout3(), request_order(3), limits(), 7);
  FusionResult fr = empty_result();
  fr.prefix_hit_tokens = 2;
  fr.chunk_hits = 2;
  fr.chunk_misses = 1;
  fr.chunk_hit = {true, false, true};  // b (slots 4..6) was computed for this request
  fr.recomputed = {3, 5};
  const TokenCounts n = count_tokens(p, fr);
  EXPECT_EQ(n.chunk_hits, 2u);
  EXPECT_EQ(n.chunk_misses, 1u);
  EXPECT_EQ(n.recomputed_tokens, 2u);
  EXPECT_EQ(n.prefilled_tokens, 0u + 2u + 1u);  // S past the hit, P, U
  // Cached: S's 2 hit tokens, a (slots 2-3) less its recomputed slot 3, and c (slot 7); not b,
  // computed now, though the prompt's forward pass skipped 2 of its 3 tokens.
  EXPECT_EQ(n.cached_tokens, 2u + 1u + 1u);
  fr.chunk_hit = {false, false, false};  // cold: S and every chunk computed by this request
  fr.prefix_hit_tokens = 0;
  EXPECT_EQ(count_tokens(p, fr).cached_tokens, 0u);
  // A plain prefill after S' misses every chunk it prefills.
  const RequestPlan full = plan_request(request("full", false), layout3(), request_order(3), limits(), 7);
  fr = empty_result();
  const TokenCounts f = count_tokens(full, fr);
  EXPECT_EQ(f.chunk_misses, 3u);
  EXPECT_EQ(f.recomputed_tokens, 6u);
  EXPECT_EQ(f.prefilled_tokens, 9u);
}

TEST(ConversationMemory, KeepsCleanTurnsAndContinuesOnlyTheExactHistory) {
  Craft craft;
  ConversationMemory memory(craft, 2);
  const std::vector<ChatMessage> turn1 = {{"system", "s"}, {"user", "q1"}};
  craft.plan({"a"}, "c1", false);
  EXPECT_EQ(craft.stats().conversations, 1u);
  EXPECT_FALSE(memory.continued("c1", turn1));  // nothing kept: CRAFT forgets the conversation
  EXPECT_EQ(craft.stats().conversations, 0u);

  memory.end_turn("c1", true, KeptTurn{turn1, "A1", {1, 2, 3}});
  std::vector<ChatMessage> turn2 = turn1;
  turn2.push_back({"assistant", "A1"});
  turn2.push_back({"user", "q2"});
  EXPECT_TRUE(continues_turn(KeptTurn{turn1, "A1", {}}, turn2));
  auto kept = memory.continued("c1", turn2);
  ASSERT_TRUE(kept);
  EXPECT_EQ(*kept, (std::vector<TokenId>{1, 2, 3}));

  turn2[2].content = "edited";  // another answer: afresh, and the kept turn is dropped
  EXPECT_FALSE(memory.continued("c1", turn2));
  EXPECT_EQ(memory.size(), 0u);

  memory.end_turn("c1", false, {});  // a turn that is not clean is not kept
  EXPECT_EQ(memory.size(), 0u);
  for (const char* id : {"x", "y", "z"}) memory.end_turn(id, true, KeptTurn{turn1, "A", {}});
  EXPECT_EQ(memory.size(), 2u);  // the least recently used went
  memory.forget("y");
  EXPECT_EQ(memory.size(), 1u);
}

// Issue 59: the memory was bounded by count only (10,000 ids x a 2 MiB system message, ~20 GB
// kept); now also by bytes, least recently used first.
TEST(ConversationMemory, AFloodOfBigConversationsStaysWithinTheByteBudget) {
  Craft craft;
  constexpr size_t kBudget = size_t{8} << 20;
  ConversationMemory memory(craft, 10000, kBudget);
  const std::string big(size_t{2} << 20, 's');  // a 2 MiB system message per conversation
  for (int i = 0; i < 40; ++i) {
    std::string system = big;  // append, not operator+: GCC 12 warns falsely (-Wrestrict) on that
    system.append(std::to_string(i));
    const std::vector<ChatMessage> turn = {{"system", system}, {"user", "q"}};
    std::string id = "c";
    id.append(std::to_string(i));
    memory.end_turn(id, true, KeptTurn{turn, "A", std::vector<TokenId>(4096, 7)});
    ASSERT_LE(memory.bytes(), kBudget) << "after conversation " << i;
  }
  EXPECT_LE(memory.size(), kBudget / big.size());
  EXPECT_GE(memory.size(), 2u);  // the most recent ones are kept
  std::vector<ChatMessage> next = {{"system", big}, {"user", "q"}, {"assistant", "A"}, {"user", "q2"}};
  next[0].content.append("39");
  EXPECT_TRUE(memory.continued("c39", next));  // the newest survived
  next[0].content.replace(big.size(), 2, "0");
  EXPECT_FALSE(memory.continued("c0", next));  // the oldest went
  // One turn past the whole budget is not kept, and nothing else is pushed out for it.
  const size_t before = memory.size();
  memory.end_turn("huge", true, KeptTurn{{{"system", std::string(kBudget, 'h')}}, "A", {}});
  EXPECT_EQ(memory.size(), before);
  EXPECT_LE(memory.bytes(), kBudget);
}

}  // namespace
}  // namespace cf
