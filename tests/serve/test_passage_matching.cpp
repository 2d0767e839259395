// Passage matching (issue 27): the split rules on text, the bound on matching work under
// hostile shapes (thousands of tiny paragraphs, one huge paragraph, registered texts built
// to make verification expensive), near-duplicates that must not match, the layout against
// the plain prompt's tokens with the real model, and the real engine serving permuted
// passages from chunk caches.
#include "serve/chunk_registry.h"
#include "serve/engine.h"
#include "serve/passage_matching.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "../runtime/model_fixture.h"
#include "fusion/rag_prompt.h"

namespace cf {
namespace {

namespace fs = std::filesystem;

// A passage of about `n` bytes whose words depend on `seed` (so passages differ).
std::string passage(int seed, size_t n = 300) {
  static const char* words[] = {"river", "tower", "island", "harbour", "lamp", "granite", "keeper", "storm",
                                "ferry", "cliff", "beacon", "salt", "chapel", "market", "bridge", "north"};
  std::string s = "Passage " + std::to_string(seed) + ":";
  unsigned x = 2654435761u * static_cast<unsigned>(seed + 1);
  while (s.size() < n) {
    x = x * 1103515245u + 12345u;
    s += " ";
    s += words[(x >> 16) % 16];
  }
  return s + ".";
}

std::string join(const std::vector<std::string>& parts, const std::string& sep = "\n\n") {
  std::string s;
  for (size_t i = 0; i < parts.size(); ++i) s += (i ? sep : "") + parts[i];
  return s;
}

std::string span(const std::string& t, const MatchedSpan& s) { return t.substr(s.begin, s.end - s.begin); }

size_t bound(const std::string& t, const PassageMatchOptions& o) { return o.work_factor * t.size() + o.kWorkSlack; }

const RegisteredTextIndex kNoIndex;

TEST(PassageMatching, SplitsBlankLineSeparatedPassagesAroundTheQuestion) {
  const std::string t = join({"Context:", passage(1), passage(2), passage(3), "Question: who lit the lamp?"});
  const TextMatch m = match_text(t, kNoIndex, {}, /*keep_last=*/true);
  ASSERT_EQ(m.chunks.size(), 3u);
  EXPECT_EQ(span(t, m.chunks[0]), passage(1));
  EXPECT_EQ(span(t, m.chunks[2]), passage(3));
  EXPECT_EQ(t.substr(0, m.before_end), "Context:\n\n");
  EXPECT_EQ(t.substr(m.after_begin), "Question: who lit the lamp?");
  EXPECT_EQ(m.passages(), 3u);
}

TEST(PassageMatching, TheLastParagraphStaysTextOnlyWhereTheQuestionGoes) {
  const std::string t = join({passage(1), passage(2)});
  EXPECT_EQ(match_text(t, kNoIndex, {}, true).chunks.size(), 1u);   // the last user message
  EXPECT_EQ(match_text(t, kNoIndex, {}, false).chunks.size(), 2u);  // an earlier (system) message
}

TEST(PassageMatching, MinimumLengthDecidesWhatIsAPassage) {
  PassageMatchOptions o;
  const std::string shorter(o.min_chars - 1, 'a'), enough(o.min_chars, 'b');
  EXPECT_TRUE(match_text(join({shorter, "q"}), kNoIndex, o, true).chunks.empty());
  EXPECT_EQ(match_text(join({enough, "q"}), kNoIndex, o, true).chunks.size(), 1u);
}

TEST(PassageMatching, ShortParagraphsBetweenPassagesAreTheirOwnGlueChunk) {
  const std::string t = join({passage(1), "Source: b", "page 2", passage(2), "Q?"});
  const TextMatch m = match_text(t, kNoIndex, {}, true);
  ASSERT_EQ(m.chunks.size(), 3u);
  EXPECT_TRUE(m.chunks[1].glue);
  EXPECT_EQ(span(t, m.chunks[1]), "Source: b\n\npage 2");
  EXPECT_EQ(span(t, m.chunks[2]), passage(2));  // a passage's chunk never holds its neighbours
  EXPECT_EQ(m.passages(), 2u);
}

TEST(PassageMatching, RepeatedPassagesAreEachAChunk) {
  const std::string t = join({passage(1), passage(1), "Q?"});
  const TextMatch m = match_text(t, kNoIndex, {}, true);
  ASSERT_EQ(m.chunks.size(), 2u);
  EXPECT_EQ(span(t, m.chunks[0]), span(t, m.chunks[1]));
}

TEST(PassageMatching, RegisteredTextsSpanningParagraphsAreFoundVerbatim) {
  const std::string reg = join({"Heading", passage(7, 60), "end."});  // three short paragraphs
  RegisteredTextIndex idx;
  idx.build({reg});
  const std::string t = join({"Intro", reg, passage(2), "Q?"});
  const TextMatch m = match_text(t, idx, {}, true);
  ASSERT_EQ(m.chunks.size(), 2u);
  EXPECT_TRUE(m.chunks[0].registered);
  EXPECT_EQ(span(t, m.chunks[0]), reg);
  EXPECT_EQ(t.substr(0, m.before_end), "Intro\n\n");
}

TEST(PassageMatching, NearDuplicatesOfRegisteredTextsDoNotMatch) {
  const std::string reg = join({"Heading", passage(7, 60), "end."});
  RegisteredTextIndex idx;
  idx.build({reg});
  std::string near = reg;
  near[near.size() - 2] = 'x';  // one character in its last paragraph
  const TextMatch m = match_text(join({near, "Q?"}), idx, {}, true);
  EXPECT_TRUE(m.chunks.empty());  // all its paragraphs are short: nothing is a passage
  // Ending mid-paragraph is not a match either.
  const TextMatch m2 = match_text(join({reg + " and more", "Q?"}), idx, {}, true);
  EXPECT_TRUE(m2.chunks.empty());
}

TEST(PassageMatching, AtMostMaxChunksTheRestStaysText) {
  PassageMatchOptions o;
  o.max_chunks = 4;
  std::vector<std::string> parts;
  for (int i = 0; i < 10; ++i) parts.push_back(passage(i));
  parts.push_back("Q?");
  const std::string t = join(parts);
  const TextMatch m = match_text(t, kNoIndex, o, true);
  ASSERT_EQ(m.chunks.size(), 4u);
  EXPECT_EQ(t.substr(m.after_begin, passage(4).size()), passage(4));
}

TEST(PassageMatching, ThousandsOfTinyParagraphsCostLinearWork) {
  std::vector<std::string> parts(20000, "ab");
  const std::string t = join(parts);
  RegisteredTextIndex idx;
  idx.build({"ab\n\nab\n\nab\n\nzz"});  // every paragraph is a candidate start
  PassageMatchOptions o;
  const TextMatch m = match_text(t, idx, o, true);
  EXPECT_TRUE(m.chunks.empty());
  EXPECT_EQ(m.paragraphs, 20000u);
  EXPECT_LE(m.work_bytes, bound(t, o));
}

TEST(PassageMatching, VerificationWorkIsBoundedAgainstCraftedRegisteredTexts) {
  // Each of 4000 paragraph starts would verify a 60-paragraph registered text that fails
  // only at its end: quadratic without the budget (about 5 MB compared vs a 0.3 MB bound).
  std::vector<std::string> rep(60, "alpha beta gamma delta");
  RegisteredTextIndex idx;
  idx.build({join(rep) + "\n\nalpha beta gamma delte"});  // same length as the paragraph it ends on
  const std::string t = join(std::vector<std::string>(4000, "alpha beta gamma delta"));
  PassageMatchOptions o;
  const TextMatch m = match_text(t, idx, o, true);
  EXPECT_TRUE(m.chunks.empty());
  EXPECT_LE(m.work_bytes, bound(t, o));
}

TEST(PassageMatching, OneHugeParagraphIsOneChunkOrNone) {
  const std::string huge = passage(3, 1 << 20);
  PassageMatchOptions o;
  EXPECT_TRUE(match_text(huge, kNoIndex, o, true).chunks.empty());  // it is the question's place
  const TextMatch m = match_text(huge, kNoIndex, o, false);
  ASSERT_EQ(m.chunks.size(), 1u);
  EXPECT_LE(m.work_bytes, bound(huge, o));
}

// ---- with the real model and engine ----

std::string test_dir() {
  static const std::string dir = [] {
    auto d = fs::temp_directory_path() / ("cf_passage_test_" + std::to_string(::getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    return d.string();
  }();
  return dir;
}

Engine& engine() {
  static Engine e([] {
    EngineOptions o;
    o.model_path = test::default_model_path();
    o.threads = 2;
    o.cache_dir = test_dir() + "/store";
    return o;
  }());
  return e;
}

const std::string kSystem = "You are a helpful assistant. Answer briefly.";

CompletionRequest plain_chat(const std::string& user, const std::string& method = "cacheblend") {
  CompletionRequest r;
  r.messages = {{"system", kSystem}, {"user", user}};
  r.fusion.options.method = method;
  r.max_tokens = 4;
  return r;
}

// The matched request laid out as the engine does (S, each document + "\n\n", U) and the
// plain request's prompt (encode_chat_prompt).
std::pair<std::vector<TokenId>, std::vector<TokenId>> laid_and_plain(const Model& m, const CompletionRequest& r) {
  const Tokenizer& tok = m.tokenizer();
  std::vector<TokenId> s, u;
  lay_out_inline_passages(tok, m.chat_template(), r, s, u);
  std::vector<TokenId> laid = s;
  for (const auto& d : r.documents) {
    const auto c = tok.encode(d.text + "\n\n", false, false);  // the engine's chunk text
    laid.insert(laid.end(), c.begin(), c.end());
  }
  laid.insert(laid.end(), u.begin(), u.end());
  const ChatPromptTokens plain = encode_chat_prompt(tok, m.chat_template(), r.messages);
  std::vector<TokenId> want = plain.before;
  want.insert(want.end(), plain.content.begin(), plain.content.end());
  want.insert(want.end(), plain.after.begin(), plain.after.end());
  return {laid, want};
}

const std::string kStuffed = join({"Use the passages.", passage(1), passage(2), passage(3), "Question: who?"});

TEST(PassageMatching, LayoutSpellsThePlainPromptsText) {
  CF_REQUIRE_MODEL();
  const Model& m = test::shared_model();
  CompletionRequest r = plain_chat(kStuffed);
  PassageMatcher matcher(engine().registry(), {});
  ASSERT_TRUE(matcher.apply(r));
  ASSERT_EQ(r.documents.size(), 3u);
  const auto [laid, want] = laid_and_plain(m, r);
  // Same text; SmolLM2's GPT-2 pre-tokenizer spells a "\n\n" that ends a chunk as one token
  // where the plain prompt has two (the next word follows), so tokens may differ there.
  EXPECT_EQ(m.tokenizer().decode(laid, true), m.tokenizer().decode(want, true));
  EXPECT_LE(want.size() - std::min(want.size(), laid.size()), r.documents.size() + 1);

  // Passages in the system message (LangChain's stuff chain): the last passage ends the
  // message, so its chunk adds one "\n\n" the plain prompt lacks.
  CompletionRequest r2;
  r2.messages = {{"system", join({"Answer from the context.", passage(4), passage(5)})}, {"user", "Who?"}};
  r2.fusion.options.method = "cacheblend";
  ASSERT_TRUE(matcher.apply(r2));
  EXPECT_EQ(r2.inline_passages->message, 0u);
  ASSERT_EQ(r2.documents.size(), 2u);
  const std::string sys_laid = r2.inline_passages->before + r2.documents[0].text + "\n\n" + r2.documents[1].text + "\n\n";
  EXPECT_EQ(sys_laid, r2.messages[0].content + "\n\n");
  const auto [laid2, want2] = laid_and_plain(m, r2);
  std::string plain2 = m.tokenizer().decode(want2, true);
  plain2.insert(plain2.find("<|im_end|>"), "\n\n");
  EXPECT_EQ(m.tokenizer().decode(laid2, true), plain2);
}

TEST(PassageMatching, LayoutEqualsThePlainPromptsTokensOnQwen) {
  CF_REQUIRE_QWEN05();
  const Model& m = test::shared_qwen05();
  CompletionRequest r = plain_chat(kStuffed);
  PassageMatcher matcher(engine().registry(), {});
  ASSERT_TRUE(matcher.apply(r));
  const auto [laid, want] = laid_and_plain(m, r);
  EXPECT_EQ(laid, want);  // Qwen's pre-tokenizer keeps "\n\n" whole either way
}

TEST(PassageMatching, EngineServesPermutedPassagesFromChunkCaches) {
  CF_REQUIRE_MODEL();
  PassageMatcher matcher(engine().registry(), {});
  const std::vector<std::string> p = {passage(11), passage(12), passage(13)};
  CompletionRequest first = plain_chat(join({p[0], p[1], p[2], "Question: which tower?"}));
  ASSERT_TRUE(matcher.apply(first));
  const CompletionResult a = engine().complete(first);
  ASSERT_FALSE(a.passages.is_null());
  EXPECT_EQ(a.passages["matched"], 3);
  EXPECT_EQ(a.passages["computed"], 3);
  EXPECT_EQ(a.passages["hit"], 0);

  CompletionRequest second = plain_chat(join({p[2], p[0], p[1], "Question: which tower?"}));
  ASSERT_TRUE(matcher.apply(second));
  const CompletionResult b = engine().complete(second);
  EXPECT_EQ(b.passages["hit"], 3);  // every passage seen before hits, in any order
  EXPECT_EQ(b.passages["computed"], 0);
  EXPECT_GT(b.prefix_hit_tokens, 0u);  // the system prompt from the exact prefix cache

  // One character off: that passage is computed, never served from its neighbour's cache.
  std::string near = p[1];
  near[20] = near[20] == 'a' ? 'b' : 'a';
  CompletionRequest third = plain_chat(join({p[0], near, p[2], "Question: which tower?"}));
  ASSERT_TRUE(matcher.apply(third));
  const CompletionResult c = engine().complete(third);
  EXPECT_EQ(c.passages["hit"], 2);
  EXPECT_EQ(c.passages["computed"], 1);
}

TEST(PassageMatching, NotAppliedToFullPrefillDocumentsOrConversations) {
  CF_REQUIRE_MODEL();
  PassageMatcher matcher(engine().registry(), {});
  const std::string user = join({passage(21), passage(22), "Q?"});
  CompletionRequest full = plain_chat(user, "full");
  EXPECT_FALSE(matcher.apply(full));
  CompletionRequest docs = plain_chat(user);
  docs.documents.push_back({"a document", ""});
  EXPECT_FALSE(matcher.apply(docs));
  CompletionRequest conv = plain_chat(user);
  conv.fusion.conversation_id = "c1";
  EXPECT_FALSE(matcher.apply(conv));
  CompletionRequest no_passages = plain_chat("Just a question?");
  EXPECT_FALSE(matcher.apply(no_passages));
  EXPECT_FALSE(no_passages.inline_passages);
}

// Passages in an earlier message (here the system message) are fused the first time only: the
// same prompt prefix again is left plain, for the exact prefix cache. The last message's
// passages are matched every time, and another prefix is matched afresh.
TEST(PassageMatching, ARepeatedPromptPrefixIsLeftToThePrefixCache) {
  CF_REQUIRE_MODEL();
  PassageMatcher matcher(engine().registry(), {});
  auto with_system_passages = [](const std::string& system, const std::string& question) {
    CompletionRequest r = plain_chat(question);
    r.messages = {{"system", system}, {"user", question}};
    return r;
  };
  const std::string shared = join({"Answer from these passages.", passage(31), passage(32)});
  CompletionRequest first = with_system_passages(shared, "Q1?");
  EXPECT_TRUE(matcher.apply(first));
  ASSERT_TRUE(first.inline_passages);
  EXPECT_EQ(first.inline_passages->message, 0u);
  CompletionRequest again = with_system_passages(shared, "Q2?");
  EXPECT_FALSE(matcher.apply(again));
  EXPECT_FALSE(again.inline_passages);
  CompletionRequest other = with_system_passages(join({"Answer from these passages.", passage(33), passage(31)}), "Q1?");
  EXPECT_TRUE(matcher.apply(other));
  const std::string user = join({passage(34), passage(35), "Q?"});
  CompletionRequest last_a = plain_chat(user), last_b = plain_chat(user);
  EXPECT_TRUE(matcher.apply(last_a));
  EXPECT_TRUE(matcher.apply(last_b));
}

TEST(PassageMatching, RegisteredMultiParagraphChunkHitsItsOwnCache) {
  CF_REQUIRE_MODEL();
  const std::string reg = join({"Carrow notes", passage(31, 90), "Lit in 1868."});
  const auto infos = engine().register_chunks({reg});
  PassageMatcher matcher(engine().registry(), {});
  CompletionRequest r = plain_chat(join({passage(32), reg, "Q?"}));
  ASSERT_TRUE(matcher.apply(r));
  ASSERT_EQ(r.documents.size(), 2u);
  EXPECT_EQ(r.documents[1].text, reg);
  EXPECT_EQ(r.inline_passages->registered, 1u);
  const CompletionResult res = engine().complete(r);
  EXPECT_EQ(res.chunk_order.at(1), infos.at(0).id);  // the registered chunk's own id and cache
  EXPECT_EQ(res.passages["hit"], 1);
}

TEST(PassageMatching, CompletionsPromptIsMatchedBetweenItsEdges) {
  CF_REQUIRE_MODEL();
  PassageMatcher matcher(engine().registry(), {});
  CompletionRequest r;
  r.chat = false;
  r.prompt = join({"Read:", passage(41), passage(42), "Answer:"});
  r.fusion.options.method = "cacheblend";
  r.max_tokens = 4;
  ASSERT_TRUE(matcher.apply(r));
  EXPECT_EQ(r.documents.size(), 2u);
  EXPECT_EQ(r.inline_passages->after, "Answer:");
  const CompletionResult res = engine().complete(r);
  EXPECT_EQ(res.passages["matched"], 2);
  EXPECT_EQ(res.passages["computed"], 2);
}

}  // namespace
}  // namespace cf
