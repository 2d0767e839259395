// The serving engine against the real model: its answers equal the in-process building
// blocks (Generator, FusionExecutor) on the same prompt, caches hit where they should,
// batching and cancellation do not disturb other requests, bad requests get clear errors.
#include "serve/chunk_registry.h"
#include "serve/engine.h"
#include "serve/fusion_trace.h"
#include "serve/prompt_layout.h"
#include "serve/scheduler.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <set>
#include <thread>

#include "../runtime/model_fixture.h"
#include "fusion/executor.h"
#include "fusion/rag_prompt.h"
#include "runtime/generate.h"

namespace cf {
namespace {

namespace fs = std::filesystem;

const std::string kSystem =
    "You are a helpful assistant. Answer the question using the passages. Answer briefly, in one sentence.";
const std::vector<std::string> kDocs = {
    "The Eiffel Tower is a wrought-iron lattice tower in Paris, France. It was completed in 1889.",
    "Mount Everest is Earth's highest mountain above sea level, located in the Himalayas.",
    "The Great Wall of China is a series of fortifications built across northern China.",
    "The Amazon River in South America is the largest river by discharge volume of water.",
};

std::string test_dir() {
  static const std::string dir = [] {
    auto d = fs::temp_directory_path() / ("cf_engine_test_" + std::to_string(::getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    return d.string();
  }();
  return dir;
}

EngineOptions engine_options() {
  EngineOptions o;
  o.model_path = test::default_model_path();
  o.threads = 2;
  o.cache_dir = test_dir() + "/store";
  return o;
}

// An engine of its own whose prefills run in pieces of 16 rows (chunked prefill, issue 58).
EngineOptions chunked_prefill_options(const std::string& store) {
  EngineOptions o = engine_options();
  o.cache_dir = test_dir() + "/" + store;
  o.prefill_chunk = 16;
  return o;
}

Engine& shared_engine() {
  static Engine e(engine_options());
  return e;
}

CompletionRequest chat(const std::string& question, std::vector<std::string> docs = {}, std::string method = "full",
                       int max_tokens = 16) {
  CompletionRequest r;
  r.messages = {{"system", kSystem}, {"user", question}};
  for (auto& d : docs) r.documents.push_back({d, ""});
  r.fusion.options.method = std::move(method);
  r.fusion.prefix_cache = false;
  r.max_tokens = max_tokens;
  return r;
}

// The engine's chat layout built by hand: S = template before the user content, each
// document alone (+ "\n\n"), U = user content + template after it.
RagRequest reference_layout(const Model& m, const CompletionRequest& r) {
  const Tokenizer& tok = m.tokenizer();
  const size_t last = r.messages.size() - 1;
  auto pieces = render_chat_around(m.chat_template(), r.messages, {last});
  RagRequest rr;
  rr.system = tok.encode(pieces[0], true, true);
  for (const auto& d : r.documents) rr.chunks.push_back(tok.encode(d.text + "\n\n", false, false));
  rr.suffix = tok.encode(r.messages[last].content, false, false);
  auto after = tok.encode(pieces[1], false, true);
  rr.suffix.insert(rr.suffix.end(), after.begin(), after.end());
  return rr;
}

GenerateOptions greedy(int max_tokens) {
  GenerateOptions g;
  g.max_tokens = max_tokens;
  g.sampling.temperature = 0;
  return g;
}

TEST(Engine, GreedyChatEqualsGenerator) {
  CF_REQUIRE_MODEL();
  Engine& e = shared_engine();
  CompletionRequest req = chat("What is the capital of France?", {}, "full", 20);
  std::string streamed;
  CompletionResult r = e.complete(req, [&](std::string_view s) {
    streamed += s;
    return true;
  });

  const Model& m = test::shared_model();
  // Without documents S + U is the whole rendered template.
  const auto prompt = m.tokenizer().encode(m.chat_template().apply(req.messages, true), true, true);
  EXPECT_EQ(reference_layout(m, req).flatten(), prompt);
  Forward fwd(m, test::shared_pool());
  KvCache cache(m.hparams());
  GenerateResult g = Generator(fwd).generate(cache, prompt, greedy(20));
  EXPECT_FALSE(r.text.empty());
  EXPECT_EQ(r.text, g.text);
  EXPECT_EQ(streamed, r.text);
  EXPECT_EQ(r.completion_tokens, g.tokens.size());
  EXPECT_EQ(r.prompt_tokens, prompt.size());
  EXPECT_EQ(r.prefilled_tokens, prompt.size());
  EXPECT_EQ(r.finish_reason, g.stop_reason == "length" ? "length" : "stop");
  EXPECT_GT(r.timings.ttft_ms, 0);
}

TEST(Engine, FusedRequestEqualsExecutorInProcess) {
  CF_REQUIRE_MODEL();
  Engine& e = shared_engine();
  CompletionRequest req = chat("Where is the Eiffel Tower?", {kDocs[0], kDocs[1], kDocs[2]}, "epic", 16);
  req.fusion.options.ratio = 0.15;
  CompletionResult r = e.complete(req);

  const Model& m = test::shared_model();
  Forward fwd(m, test::shared_pool());
  ChunkStoreOptions so;  // memory only
  so.model = StoreModel{m.fingerprint(), m.hparams()};
  ChunkStore store(so);
  FusionExecutor ex(fwd, store);
  RagRequest rr = reference_layout(m, req);
  FusionOptions fo;
  fo.method = "epic";
  fo.ratio = 0.15;
  FusionResult fr = ex.prefill(rr, fo);
  GenerateResult g = Generator(fwd).continue_from(fr.cache, fr.logits, fr.next_position, rr.flatten(), greedy(16));
  EXPECT_EQ(r.text, g.text);
  EXPECT_EQ(r.recomputed_tokens, fr.recomputed.size());
  EXPECT_EQ(r.prompt_tokens, rr.flatten().size());
  EXPECT_EQ(r.chunk_order.size(), 3u);
  EXPECT_EQ(r.chunk_hits + r.chunk_misses, 3u);
  EXPECT_EQ(r.prefilled_tokens, rr.system.size() + fr.recomputed.size() + rr.suffix.size());

  // The same request through the prefix cache (S exact either way): the same answer, and
  // the chunk caches the first run stored are hits now.
  req.fusion.prefix_cache = true;
  CompletionResult again = e.complete(req);
  EXPECT_EQ(again.text, r.text);
  EXPECT_EQ(again.chunk_hits, 3u);

  // fusion.chunk_context "prefixed": the chunks' caches computed after S (stored apart from
  // the alone ones the runs above stored: misses first), as the executor serves them.
  req.fusion.options.chunk_context = ChunkContext::prefixed;
  CompletionResult pre = e.complete(req);
  EXPECT_EQ(pre.chunk_misses, 3u);
  fo.chunk_context = ChunkContext::prefixed;
  FusionResult fp = ex.prefill(rr, fo);
  GenerateResult gp = Generator(fwd).continue_from(fp.cache, fp.logits, fp.next_position, rr.flatten(), greedy(16));
  EXPECT_EQ(pre.text, gp.text);
  EXPECT_EQ(pre.recomputed_tokens, fp.recomputed.size());
}

// A chat with documents and no system message is laid out with the RAG layout's system
// message (the one ask and bench use); a chat without documents keeps the template's default,
// and a client's own system message is never replaced.
TEST(Engine, DocumentsWithoutSystemMessageGetTheRagSystemMessage) {
  CF_REQUIRE_MODEL();
  Engine& e = shared_engine();
  const Model& m = test::shared_model();
  CompletionRequest bare = chat("Where is the Eiffel Tower?", {kDocs[0], kDocs[1]}, "full", 8);
  bare.messages.erase(bare.messages.begin());  // the user message alone
  CompletionRequest given = bare;
  given.messages.insert(given.messages.begin(), ChatMessage{"system", RagPromptOptions{}.system});
  ASSERT_NE(reference_layout(m, given).system, reference_layout(m, bare).system) << "the template's default system turn";
  // The explicit request puts its S in the prefix cache; the bare one hits all of it, so
  // its S is token for token the same.
  given.fusion.prefix_cache = bare.fusion.prefix_cache = true;
  const CompletionResult expected = e.complete(given);
  const CompletionResult r = e.complete(bare);
  EXPECT_GE(r.prefix_hit_tokens, reference_layout(m, given).system.size());
  EXPECT_EQ(r.prompt_tokens, reference_layout(m, given).flatten().size());
  EXPECT_EQ(r.text, expected.text);

  const auto with = with_rag_system(bare.messages, true);
  ASSERT_EQ(with.size(), 2u);
  EXPECT_EQ(with[0].role, "system");
  EXPECT_EQ(with[0].content, RagPromptOptions{}.system);
  EXPECT_EQ(with_rag_system(bare.messages, false).size(), 1u) << "no passages: the client's messages as they are";
  const auto own = with_rag_system(chat("q", {kDocs[0]}).messages, true);
  ASSERT_EQ(own.size(), 2u);
  EXPECT_EQ(own[0].content, kSystem) << "the client's own system message wins";
}

TEST(Engine, PrefixCacheServesTheSecondIdenticalRequest) {
  CF_REQUIRE_MODEL();
  Engine& e = shared_engine();
  CompletionRequest req = chat("Which river carries the most water?", {kDocs[3], kDocs[1]}, "full", 12);
  req.fusion.prefix_cache = true;
  CompletionResult first = e.complete(req);
  CompletionResult second = e.complete(req);
  EXPECT_EQ(second.text, first.text);
  EXPECT_GT(second.prefix_hit_tokens, first.prefix_hit_tokens);
  EXPECT_EQ(second.prefix_hit_tokens % 16, 0u);
  EXPECT_EQ(second.prefilled_tokens, second.prompt_tokens - second.prefix_hit_tokens);
  // The first chunk lies in whole cached blocks; the last block of S' is partial (not kept).
  EXPECT_GE(second.chunk_hits, 1u);
  // The same prompt prefilled from scratch gives the same answer (the cache is exact).
  req.fusion.prefix_cache = false;
  EXPECT_EQ(e.complete(req).text, first.text);

  // Completions: S = all but the last token, so a repeat is served from the cache.
  CompletionRequest comp;
  comp.chat = false;
  comp.prompt =
      "The history of the printing press begins in the fifteenth century in the city of Mainz, when a goldsmith "
      "named Johannes Gutenberg";
  comp.max_tokens = 8;
  CompletionResult c1 = e.complete(comp);
  CompletionResult c2 = e.complete(comp);
  EXPECT_EQ(c1.text, c2.text);
  EXPECT_GT(c2.prefix_hit_tokens, 0u);
}

TEST(Engine, CraftPutsFrequentChunksFirstAndHits) {
  CF_REQUIRE_MODEL();
  Engine& e = shared_engine();
  const std::string a = "Alpha station records the weather of the northern valley every hour.";
  const std::string b = "Bravo station measures river levels on the eastern plain twice a day.";
  auto req = [&](std::vector<std::string> docs) {
    CompletionRequest r = chat("What does Alpha station record?", std::move(docs), "full", 4);
    r.fusion.prefix_cache = true;
    r.fusion.reorder = true;
    return r;
  };
  e.complete(req({"An unrelated passage about tea.", a, b}));
  e.complete(req({b, "An unrelated passage about coffee.", a}));
  CompletionResult third = e.complete(req({"An unrelated passage about cocoa.", b, a}));
  ASSERT_EQ(third.chunk_order.size(), 3u);
  const Model& m = test::shared_model();
  auto id_of = [&](const std::string& t) {
    return ChunkKey(m.fingerprint(), m.tokenizer().encode(t + "\n\n", false, false)).id();
  };
  const std::set<std::string> frequent{id_of(a), id_of(b)};
  EXPECT_TRUE(frequent.count(third.chunk_order[0]));
  EXPECT_TRUE(frequent.count(third.chunk_order[1]));
  EXPECT_EQ(third.chunk_order[2], id_of("An unrelated passage about cocoa."));
  EXPECT_GE(third.chunk_hits, 1u);
  EXPECT_GT(third.prefix_hit_tokens, 0u);

  // CRAFT + fusion: the kept prefix of frequent chunks comes exact from the prefix cache,
  // the rest is fused; without reorder only S does.
  CompletionRequest fused = req({"An unrelated passage about milk.", a, b});
  fused.fusion.options.method = "epic";
  const CompletionResult with_craft = e.complete(fused);
  EXPECT_TRUE(frequent.count(with_craft.chunk_order[0]));
  fused.fusion.reorder = false;
  const CompletionResult without = e.complete(fused);
  EXPECT_GT(with_craft.prefix_hit_tokens, without.prefix_hit_tokens);
  EXPECT_LT(with_craft.prefilled_tokens, third.prompt_tokens);
}

// Under fusion, CRAFT's newly promoted prefix is not prefilled on the request's critical
// path: the scheduler computes it exactly when idle, and the next request hits it.
TEST(Engine, CraftWithFusionPromotesPrefixesWhenIdle) {
  CF_REQUIRE_MODEL();
  Engine& e = shared_engine();
  const std::string c = "Charlie harbour loads grain ships from the southern farms each autumn.";
  const std::string d = "Delta airfield trains glider pilots over the western hills in summer.";
  auto req = [&](std::vector<std::string> docs) {
    CompletionRequest r = chat("What does Charlie harbour load?", std::move(docs), "epic", 4);
    r.fusion.options.ratio = 0.15;
    r.fusion.reorder = true;
    r.fusion.prefix_cache = true;
    return r;
  };
  e.complete(req({c, "A passage about pears.", d}));
  const uint64_t idle_before = e.metrics().background_tasks;
  // c and d now reach the promotion threshold: the prefix S c d is promoted...
  const CompletionResult second = e.complete(req({d, "A passage about plums.", c}));
  // ...but fused now (nothing of it prefilled beyond what fusion recomputes)...
  EXPECT_LT(second.prefilled_tokens, second.prompt_tokens / 2);
  for (int i = 0; i < 200 && e.metrics().background_tasks == idle_before; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_GT(e.metrics().background_tasks, idle_before);
  // ...and served exact from the prefix cache afterwards.
  const CompletionResult third = e.complete(req({"A passage about figs.", c, d}));
  ASSERT_EQ(third.chunk_order.size(), 3u);
  EXPECT_GT(third.prefix_hit_tokens, second.prefix_hit_tokens);
  EXPECT_LT(third.prefilled_tokens, second.prefilled_tokens);
}

TEST(Engine, ConcurrentRequestsAnswerAsAlone) {
  CF_REQUIRE_MODEL();
  Engine& e = shared_engine();
  const std::vector<std::string> questions = {"Name a color.", "What is two plus two?", "Say hello in French.",
                                              "What is the largest ocean?"};
  std::vector<std::string> alone;
  for (const auto& q : questions) alone.push_back(e.complete(chat(q, {}, "full", 16)).text);
  const EngineMetrics before = e.metrics();
  std::vector<std::future<std::string>> futures;
  for (const auto& q : questions)
    futures.push_back(std::async(std::launch::async, [&e, q] { return e.complete(chat(q, {}, "full", 16)).text; }));
  for (size_t i = 0; i < questions.size(); ++i) EXPECT_EQ(futures[i].get(), alone[i]) << questions[i];
  const EngineMetrics after = e.metrics();
  EXPECT_EQ(after.running, 0u);
  EXPECT_EQ(after.queue_length, 0u);
  // Some decode passes carried several sequences (continuous batching happened).
  EXPECT_GT(after.decode_rows - before.decode_rows, after.decode_steps - before.decode_steps);
}

// Issue 58: quality under load is quality unloaded. The same requests, full and fused, give
// the same greedy answers alone one by one and all at once in the reverse order, with prefills
// cut into pieces of 16 rows and decode steps between them (chunked prefill, batched decode).
TEST(Engine, AnswersDoNotDependOnLoadOrArrivalOrder) {
  CF_REQUIRE_MODEL();
  Engine e(chunked_prefill_options("store-arrival"));
  std::vector<CompletionRequest> reqs = {
      chat("Where is the Eiffel Tower?", {kDocs[0], kDocs[1]}, "epic", 12),
      chat("What is the highest mountain?", {kDocs[1], kDocs[3], kDocs[0]}, "cacheblend", 12),
      chat("Name a color.", {}, "full", 12),
      chat("Which river is the largest?", {kDocs[3], kDocs[2]}, "full", 12),
      chat("What was built across China?", {kDocs[2], kDocs[0]}, "qcfuse", 12),
      chat("Say hello in French.", {}, "full", 12)};
  for (size_t i = 0; i < reqs.size(); ++i)
    if (reqs[i].fusion.options.method != "full") reqs[i].fusion.options.ratio = 0.15;
  std::vector<std::string> alone;
  for (const auto& r : reqs) alone.push_back(e.complete(r).text);
  const EngineMetrics before = e.metrics();
  std::vector<std::future<std::string>> futures(reqs.size());
  for (size_t i = reqs.size(); i-- > 0;)
    futures[i] = std::async(std::launch::async, [&e, r = reqs[i]] { return e.complete(r).text; });
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(futures[i].get(), alone[i]) << reqs[i].fusion.options.method << ": " << reqs[i].messages.back().content;
  const EngineMetrics after = e.metrics();
  EXPECT_GT(after.decode_rows - before.decode_rows, after.decode_steps - before.decode_steps) << "no batched decode";
  EXPECT_GT(after.prefill_pieces - before.prefill_pieces, 0u) << "no prefill was cut into pieces";
}

// Issue 58: a selector's pass over the whole context no longer runs in one piece. CacheBlend's
// fresh pass up to its check layer (hooks that only stop it) is cut into rows like any prefill;
// with warm chunk caches it and EPIC recompute the same number of rows, so CacheBlend's extra
// pauses are that pass's pieces (before: none; every stream waited for the whole pass).
TEST(Engine, ASelectorsPassOverTheWholeContextIsCutIntoPieces) {
  CF_REQUIRE_MODEL();
  Engine e(chunked_prefill_options("store-selector-pieces"));
  auto pieces_of = [&](const std::string& method, CompletionResult* result) {
    CompletionRequest r = chat("What is the highest mountain?", kDocs, method, 4);
    r.fusion.options.ratio = 0.15;
    e.complete(r);  // the chunk caches, warm for the measured run
    const uint64_t before = e.metrics().prefill_pieces;
    *result = e.complete(r);
    return e.metrics().prefill_pieces - before;
  };
  CompletionResult epic, cacheblend;
  const uint64_t epic_pieces = pieces_of("epic", &epic);
  const uint64_t cacheblend_pieces = pieces_of("cacheblend", &cacheblend);
  ASSERT_EQ(epic.recomputed_tokens, cacheblend.recomputed_tokens);
  const size_t context = cacheblend.cached_tokens + cacheblend.recomputed_tokens;
  ASSERT_GT(context, 48u);
  EXPECT_GE(cacheblend_pieces, epic_pieces + context / 16 - 1) << "context " << context;
}

TEST(Engine, CompletionsWithDocumentsInEveryMode) {
  CF_REQUIRE_MODEL();
  Engine& e = shared_engine();
  CompletionRequest r;
  r.chat = false;
  r.prompt = "Question: Where is the Eiffel Tower?\nAnswer:";
  r.documents = {{kDocs[0], ""}, {kDocs[2], ""}};
  r.max_tokens = 8;
  r.fusion.prefix_cache = false;
  const CompletionResult plain = e.complete(r);
  r.fusion.prefix_cache = true;
  const CompletionResult cached = e.complete(r);
  EXPECT_EQ(cached.text, plain.text);  // exact either way
  EXPECT_EQ(cached.prompt_tokens, plain.prompt_tokens);
  // ctest runs every test in its own process: register the passages here, so their caches
  // are in the store whatever ran before (an inline passage and a registered one share ids).
  e.register_chunks({kDocs[0], kDocs[2]});
  r.fusion.options.method = "reuse";
  const CompletionResult reused = e.complete(r);
  EXPECT_EQ(reused.prompt_tokens, plain.prompt_tokens);
  EXPECT_EQ(reused.recomputed_tokens, 0u);
  EXPECT_EQ(reused.chunk_hits, 2u);
}

TEST(Engine, CancellationFreesTheSlot) {
  CF_REQUIRE_MODEL();
  Engine& e = shared_engine();
  const uint64_t cancelled_before = e.metrics().cancelled;
  int pieces = 0;
  CompletionResult r = e.complete(chat("Tell me a long story about a dragon.", {}, "full", 64),
                                  [&](std::string_view) { return ++pieces < 2; });
  EXPECT_TRUE(r.cancelled);
  EXPECT_EQ(pieces, 2);
  EXPECT_LT(r.completion_tokens, 10u);
  EXPECT_EQ(e.metrics().running, 0u);
  EXPECT_EQ(e.metrics().cancelled, cancelled_before + 1);
  EXPECT_FALSE(e.complete(chat("Name a color.", {}, "full", 4)).text.empty());
}

TEST(Engine, ConversationKeepsHistoryDedupsAndHits) {
  CF_REQUIRE_MODEL();
  Engine& e = shared_engine();
  CompletionRequest t1 = chat("Where is the Eiffel Tower?", {kDocs[0], kDocs[1]}, "full", 12);
  t1.fusion.prefix_cache = true;
  t1.fusion.conversation_id = "conv-1";
  CompletionResult r1 = e.complete(t1);
  EXPECT_EQ(r1.history_tokens, 0u);

  CompletionRequest t2 = t1;
  t2.messages.push_back({"assistant", r1.text});
  t2.messages.push_back({"user", "And how high is Everest?"});
  t2.documents = {{kDocs[1], ""}, {kDocs[2], ""}};
  CompletionResult r2 = e.complete(t2);
  EXPECT_EQ(r2.history_tokens, r1.prompt_tokens + r1.completion_tokens);
  EXPECT_EQ(r2.deduped_chunks, 1u);  // kDocs[1] is already in the history
  EXPECT_EQ(r2.chunk_order.size(), 1u);
  EXPECT_GE(r2.prefix_hit_tokens, (r2.history_tokens - 16) / 16 * 16);

  // Edited history: no continuation, nothing dropped.
  CompletionRequest t3 = t2;
  t3.messages[2].content = "Something else.";
  CompletionResult r3 = e.complete(t3);
  EXPECT_EQ(r3.history_tokens, 0u);
  EXPECT_EQ(r3.deduped_chunks, 0u);
}

void expect_error(Engine& e, const CompletionRequest& r, int status, const std::string& param) {
  try {
    e.complete(r);
    ADD_FAILURE() << "no error, expected " << status << " on " << param;
  } catch (const RequestError& err) {
    EXPECT_EQ(err.status, status) << err.what();
    EXPECT_EQ(err.param, param) << err.what();
    EXPECT_FALSE(std::string(err.what()).empty());
  }
}

// Issue 16: a request's fusion.options reach the selector (here QCFuse's layer view).
TEST(Engine, FusionOptionsReachTheSelector) {
  CF_REQUIRE_MODEL();
  Engine& e = shared_engine();
  CompletionRequest r = chat("Where does the ferry go?", {"The ferry from Ardmore crosses to Islay twice a day."},
                             "qcfuse", 2);
  r.fusion.options.ratio = 0.3;
  r.fusion.options.method_options = {{"layers", {2, 5}}};
  const CompletionResult res = e.complete(r);
  ASSERT_TRUE(res.trace);
  EXPECT_EQ(res.trace->selection.at("critical_layers"), nlohmann::json({2, 5}));
}

TEST(Engine, BadRequestsGetClearErrors) {
  CF_REQUIRE_MODEL();
  Engine& e = shared_engine();
  const uint64_t errors_before = e.metrics().errors;
  auto base = [] { return chat("Hi", {}, "full", 4); };
  CompletionRequest r = base();
  r.fusion.options.method = "magic";
  expect_error(e, r, 400, "fusion.method");
  r = base();
  r.fusion.options.method = "qcfuse";
  r.fusion.options.method_options = {{"anchor_ratio", 7}};
  expect_error(e, r, 400, "fusion.options");
  r = base();
  r.fusion.options.ratio = 1.5;
  expect_error(e, r, 400, "fusion.ratio");
  r.fusion.options.ratio = std::nan("");
  expect_error(e, r, 400, "fusion.ratio");
  r = base();
  r.documents = {{"", "0123456789abcdef0123456789abcdef"}};
  expect_error(e, r, 404, "documents");
  r = base();
  r.documents = {{"", ""}};
  expect_error(e, r, 400, "documents");
  r = base();
  r.documents.assign(65, DocumentRef{"a passage", ""});
  expect_error(e, r, 400, "documents");
  r = base();
  std::string huge;
  for (int i = 0; i < 9000; ++i) huge += "word ";
  r.documents = {{huge, ""}};
  expect_error(e, r, 413, "messages");
  r = base();
  r.max_tokens = 0;
  expect_error(e, r, 400, "max_tokens");
  r.max_tokens = 1 << 30;
  expect_error(e, r, 400, "max_tokens");
  r = base();
  r.messages[0].role = "wizard";
  expect_error(e, r, 400, "messages");
  r = base();
  r.messages.push_back({"assistant", "Hello"});
  expect_error(e, r, 400, "messages");
  r = base();
  r.messages.clear();
  expect_error(e, r, 400, "messages");
  r = base();
  r.temperature = -1;
  expect_error(e, r, 400, "temperature");
  r = base();
  r.chat = false;
  r.prompt.clear();
  expect_error(e, r, 400, "prompt");
  EXPECT_EQ(e.metrics().errors, errors_before + 15);
  // Still serving.
  EXPECT_FALSE(e.complete(base()).text.empty());
}

TEST(Engine, RegisteredChunksServeAsDocumentsAndSurviveRestart) {
  CF_REQUIRE_MODEL();
  Engine& e = shared_engine();
  const std::string text = "The Rhine rises in the Swiss Alps and flows into the North Sea near Rotterdam.";
  auto infos = e.register_chunks({text});
  ASSERT_EQ(infos.size(), 1u);
  const std::string id = infos[0].id;
  auto info = e.chunk(id);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->text, text);
  EXPECT_TRUE(info->cached);
  EXPECT_GT(info->n_tokens, 10u);

  CompletionRequest by_id = chat("Where does the Rhine end?", {}, "reuse", 10);
  by_id.documents = {{"", id}};
  CompletionRequest inline_doc = chat("Where does the Rhine end?", {text}, "reuse", 10);
  CompletionResult a = e.complete(by_id);
  CompletionResult b = e.complete(inline_doc);
  EXPECT_EQ(a.text, b.text);
  EXPECT_EQ(a.chunk_order, std::vector<std::string>{id});
  EXPECT_EQ(b.chunk_order, std::vector<std::string>{id});
  EXPECT_EQ(a.chunk_hits, 1u);  // precomputed at registration

  // A second engine on the same directory knows the id (queue of one, batch of one: the
  // third concurrent request is refused with 503).
  EngineOptions o = engine_options();
  o.max_queue = 1;
  o.max_batch = 1;
  Engine second(o);
  ASSERT_TRUE(second.chunk(id).has_value());
  EXPECT_EQ(second.chunk(id)->text, text);

  auto running = std::async(std::launch::async, [&] { return second.complete(chat("Count to twenty.", {}, "full", 48)); });
  while (second.metrics().running == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  auto queued = std::async(std::launch::async, [&] { return second.complete(chat("Count to five.", {}, "full", 4)); });
  while (second.metrics().queue_length == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  try {
    second.complete(chat("Hi", {}, "full", 4));
    ADD_FAILURE() << "queue full not refused";
  } catch (const RequestError& err) {
    EXPECT_EQ(err.status, 503);
  }
  EXPECT_FALSE(running.get().text.empty());
  EXPECT_FALSE(queued.get().text.empty());

  EXPECT_TRUE(e.remove_chunk(id));
  EXPECT_FALSE(e.chunk(id).has_value());
  expect_error(e, by_id, 404, "documents");
  EXPECT_FALSE(e.remove_chunk(id));
}

TEST(Engine, MetricsCountRequestsAndTtft) {
  CF_REQUIRE_MODEL();
  Engine& e = shared_engine();
  e.register_chunks({kDocs[1]});  // something in the disk tier, whatever ran before
  const EngineMetrics before = e.metrics();
  e.complete(chat("Name a fruit.", {}, "full", 4));
  const EngineMetrics m = e.metrics();
  EXPECT_EQ(m.requests, before.requests + 1);
  EXPECT_EQ(m.ttft_count, before.ttft_count + 1);
  ASSERT_EQ(m.ttft_bucket_counts.size(), m.ttft_bucket_bounds_ms.size() + 1);
  EXPECT_EQ(m.ttft_bucket_counts.back(), m.ttft_count);
  for (size_t i = 1; i < m.ttft_bucket_counts.size(); ++i) EXPECT_LE(m.ttft_bucket_counts[i - 1], m.ttft_bucket_counts[i]);
  EXPECT_GT(m.prompt_tokens, before.prompt_tokens);
  EXPECT_GT(m.store_disk_bytes, 0u);
  EXPECT_EQ(e.model_name().empty(), false);
}

// Issue 59: every connection thread tokenized its prompt at once (up to 256 of them) before the
// queue was checked. Now whoever finds every tokenizing slot taken for the whole wait is
// refused 503 server_busy, and a waiter gets in as soon as a slot frees.
// Issue 59: POST /v1/chunks was unbounded (4,000 texts: about an hour of scheduler time in one
// call). Over --max-chunk-texts it is 413 before anything is tokenized or stored.
TEST(Engine, ChunkRegistrationIsBoundedInTexts) {
  CF_REQUIRE_MODEL();
  EngineOptions o = engine_options();
  o.max_chunk_texts = 2;
  o.cache_dir = test_dir() + "/store-bounded-texts";  // its own registry: "nothing registered" is about this engine
  Engine e(o);
  try {
    e.register_chunks({"first passage", "second passage", "third passage"});
    ADD_FAILURE() << "3 texts registered under a bound of 2";
  } catch (const RequestError& err) {
    EXPECT_EQ(err.status, 413);
    EXPECT_EQ(err.param, "input");
    EXPECT_NE(std::string(err.what()).find("--max-chunk-texts"), std::string::npos) << err.what();
  }
  EXPECT_TRUE(e.registry().texts().empty());  // nothing registered
  const auto two = e.register_chunks({"first passage", "second passage"});
  ASSERT_EQ(two.size(), 2u);
  EXPECT_TRUE(two[0].cached && two[1].cached);
}

// Issue 59: a client that leaves a POST /v1/chunks stops it at the next text: the caches of the
// texts after it are not computed, nothing is registered, and the error is 499.
TEST(Engine, ChunkRegistrationStopsAtTheNextTextOnceItsClientIsGone) {
  CF_REQUIRE_MODEL();
  EngineOptions o = engine_options();
  o.cache_dir = test_dir() + "/store-client-gone";
  std::filesystem::remove_all(o.cache_dir);
  Engine e(o);
  const uint64_t computes_before = e.chunk_store().stats().computes;
  int asked = 0;
  try {
    e.register_chunks({"the first of four passages", "the second of four passages", "the third of four passages",
                       "the fourth of four passages"},
                      [&] { return ++asked > 1; });  // gone once the first cache is computed
    ADD_FAILURE() << "the list was registered after its client left";
  } catch (const RequestError& err) {
    EXPECT_EQ(err.status, kClientGoneStatus);
  }
  EXPECT_EQ(asked, 2);
  EXPECT_EQ(e.chunk_store().stats().computes - computes_before, 1u) << "caches computed after the client left";
  EXPECT_TRUE(e.registry().texts().empty());
}

TEST(Engine, TokenizingIsCappedAndTheRestWaitThen503ServerBusy) {
  CF_REQUIRE_MODEL();
  EngineOptions o = engine_options();
  o.max_tokenizing = 1;
  o.tokenize_wait_ms = 100;
  Engine e(o);
  ASSERT_EQ(e.tokenize_gate().capacity(), 1u);
  auto held = std::make_unique<BusyGate::Slot>(e.tokenize_gate().enter());  // another request tokenizing
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<std::function<void()>> calls = {
      [&] { e.complete(chat("Hi", {"a passage"}, "full", 2)); },
      [&] { e.register_chunks({"a passage to register"}); }};
  for (const auto& call : calls) {
    try {
      call();
      ADD_FAILURE() << "not refused while every tokenizing slot is taken";
    } catch (const RequestError& err) {
      EXPECT_EQ(err.status, 503);
      EXPECT_EQ(err.code, "server_busy");
    }
  }
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(200));  // each waited first
  EXPECT_EQ(e.tokenize_gate().refused(), 2u);
  auto waiter = std::async(std::launch::async, [&] { return e.complete(chat("Hi", {}, "full", 2)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  held.reset();  // the other request is done: the waiter gets the slot within its wait
  EXPECT_NO_THROW(waiter.get());
  EXPECT_EQ(e.tokenize_gate().busy(), 0u);
  EXPECT_EQ(e.tokenize_gate().refused(), 2u);
}

}  // namespace
}  // namespace cf
