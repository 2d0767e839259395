// Tokenizer tests: identical ids to llama.cpp on the golden cases (real model), the
// pre-tokenizer patterns on hand-checked splits, BPE and SentencePiece merging on small
// synthetic vocabularies, and clear errors for defective metadata.
#include <gtest/gtest.h>

#include <random>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "gguf_writer.h"
#include "model/gguf.h"
#include "model/pretokenizer.h"
#include "model/tokenizer.h"
#include "model/tokenizer_vocab.h"
#include "model/unicode.h"
#include "test_support.h"

namespace cf {
namespace {

using nlohmann::json;

json load_fixture() {
  std::ifstream f(test::fixture_path("smollm2_q4_1.json"));
  if (!f) throw std::runtime_error("cannot open fixture " + test::fixture_path("smollm2_q4_1.json"));
  return json::parse(f);
}

class RealTokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    CF_REQUIRE_MODEL();
    file_ = GgufFile::open(test::default_model_path());
    tok_ = Tokenizer::from_gguf(*file_);
    fixture_ = load_fixture();
  }
  std::unique_ptr<GgufFile> file_;
  std::unique_ptr<Tokenizer> tok_;
  json fixture_;
};

TEST_F(RealTokenizer, MetadataOfSmolLM2) {
  EXPECT_EQ(tok_->model_name(), "gpt2");
  EXPECT_EQ(tok_->pre_tokenizer(), "smollm");
  EXPECT_EQ(tok_->vocab_size(), 49152u);
  EXPECT_EQ(tok_->bos(), 1);
  EXPECT_EQ(tok_->eos(), 2);
  EXPECT_EQ(tok_->token_text(1), "<|im_start|>");
  EXPECT_TRUE(tok_->is_special(1));
  EXPECT_FALSE(tok_->is_special(504));
  EXPECT_TRUE(tok_->is_end_of_generation(2));  // <|im_end|>
  EXPECT_TRUE(tok_->is_end_of_generation(0));  // <|endoftext|>
  EXPECT_FALSE(tok_->is_end_of_generation(1));
  EXPECT_FALSE(tok_->is_end_of_generation(198));
}

// The word cache is bounded in bytes whatever the input (issue 59: random 2 MB "words" kept
// hundreds of MB after their requests were refused): long words are not kept, and many
// distinct short ones stay under 16 MiB; repeated words are still served from it.
TEST_F(RealTokenizer, WordCacheStaysBoundedInBytes) {
  std::mt19937 rng(5);
  auto random_word = [&](size_t n) {
    std::string w;
    for (size_t i = 0; i < n; ++i) w.push_back(static_cast<char>('a' + rng() % 26));
    return w;
  };
  const size_t before = tok_->word_cache_bytes();
  for (int i = 0; i < 4; ++i) tok_->encode(random_word(1 << 20), false, false);  // four 1 MiB words
  EXPECT_LT(tok_->word_cache_bytes() - before, size_t{4096}) << "a long word was kept";
  std::string many;
  for (int i = 0; i < 200000; ++i) many += random_word(8 + i % 200) + " ";  // ~21 MB of distinct words
  const auto ids = tok_->encode(many, false, false);
  EXPECT_LE(tok_->word_cache_bytes(), size_t{16} << 20);
  EXPECT_GT(tok_->word_cache_bytes(), size_t{0});
  const std::string head = many.substr(0, many.find(' ', 5000));  // whole words
  const auto head_ids = tok_->encode(head, false, false);
  ASSERT_LE(head_ids.size(), ids.size());
  EXPECT_TRUE(std::equal(head_ids.begin(), head_ids.end(), ids.begin())) << "the cache changed what words encode to";
}

TEST_F(RealTokenizer, GoldenIdsMatchLlamaCpp) {
  const json& cases = fixture_.at("tokenize");
  ASSERT_GE(cases.size(), 30u);
  for (const json& c : cases) {
    const std::string name = c.at("name");
    const std::string text = c.at("text");
    const std::vector<TokenId> expected = c.at("ids").get<std::vector<TokenId>>();
    const std::vector<TokenId> got = tok_->encode(text, c.at("add_special"), c.at("parse_special"));
    EXPECT_EQ(got, expected) << "case " << name;
  }
}

TEST_F(RealTokenizer, GoldenDecodeMatchesLlamaCpp) {
  for (const json& c : fixture_.at("tokenize")) {
    const std::vector<TokenId> ids = c.at("ids").get<std::vector<TokenId>>();
    EXPECT_EQ(tok_->decode(ids, true), c.at("detok").get<std::string>()) << c.at("name");
    EXPECT_EQ(tok_->decode(ids, false), c.at("detok_plain").get<std::string>()) << c.at("name");
    // Byte-level BPE is lossless: decoding gives back the input text.
    EXPECT_EQ(tok_->decode(tok_->encode(c.at("text").get<std::string>(), false, c.at("parse_special")), true),
              c.at("text").get<std::string>())
        << c.at("name");
  }
}

TEST_F(RealTokenizer, GreedyAndLogitPromptsTokenizeIdentically) {
  for (const char* section : {"greedy", "logits"}) {
    for (const json& c : fixture_.at(section)) {
      EXPECT_EQ(tok_->encode(c.at("prompt").get<std::string>(), false, true),
                c.at("prompt_ids").get<std::vector<TokenId>>())
          << section << " " << c.at("name");
    }
  }
}

TEST_F(RealTokenizer, SpecialTokenTextIsPlainWithoutParseSpecial) {
  const auto plain = tok_->encode("<|im_start|>", false, false);
  EXPECT_GT(plain.size(), 1u);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 1), 0);
  EXPECT_EQ(tok_->encode("<|im_start|>", false, true), std::vector<TokenId>{1});
  EXPECT_EQ(tok_->token_to_piece(1, true), "<|im_start|>");
  EXPECT_EQ(tok_->token_to_piece(1, false), "");
}

TEST_F(RealTokenizer, MalformedUtf8DoesNotThrow) {
  const std::string bad = "ok \xff\xfe \xe2\x82 end";
  const auto ids = tok_->encode(bad, false, false);
  EXPECT_FALSE(ids.empty());
  // Invalid bytes become U+FFFD, as in llama.cpp.
  EXPECT_NE(tok_->decode(ids).find("\xEF\xBF\xBD"), std::string::npos);
}

// A fresh tokenizer (empty word cache) and the same one again, warm, give the same ids on a
// ~2,000-token passage. Its speed is measured by build/bench_tokenizer, not here: a wall-clock
// bound in a unit test fails on a busy CI machine without saying anything about the code.
TEST_F(RealTokenizer, ColdAndWarmEncodingOfALongPassageAgree) {
  std::string passage;
  for (const json& c : fixture_.at("tokenize")) {
    if (c.at("name") == "musique_passage") passage = c.at("text");
  }
  ASSERT_FALSE(passage.empty());
  auto fresh = Tokenizer::from_gguf(*file_);
  const auto ids = fresh->encode(passage, false, false);
  EXPECT_GT(ids.size(), 1900u);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(fresh->encode(passage, false, false), ids);
  EXPECT_EQ(tok_->encode(passage, false, false), ids);
}

TEST_F(RealTokenizer, ConcurrentEncodingAgrees) {
  std::vector<std::string> texts;
  for (const json& c : fixture_.at("tokenize")) texts.push_back(c.at("text"));
  auto fresh = Tokenizer::from_gguf(*file_);
  std::vector<std::vector<std::vector<TokenId>>> results(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < results.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        results[t].clear();
        for (const auto& s : texts) results[t].push_back(fresh->encode(s, false, true));
      }
    });
  }
  for (auto& th : threads) th.join();
  for (size_t t = 0; t < results.size(); ++t) {
    ASSERT_EQ(results[t].size(), texts.size());
    for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(results[t][i], tok_->encode(texts[i], false, true));
  }
}

// --- pre-tokenizers ----------------------------------------------------------------------

using Words = std::vector<std::string>;

TEST(PreTokenizer, Gpt2Pattern) {
  EXPECT_EQ(pre_tokenize(PreTokenizer::Gpt2, "Hello world's 123  x\n"),
            (Words{"Hello", " world", "'s", " 123", " ", " x", "\n"}));
  // Contractions are lower-case only; a lone apostrophe is punctuation.
  EXPECT_EQ(pre_tokenize(PreTokenizer::Gpt2, "I'M ok"), (Words{"I", "'", "M", " ok"}));
  // Only a literal space may lead a word; other whitespace stands alone.
  EXPECT_EQ(pre_tokenize(PreTokenizer::Gpt2, "a\t\tb  "), (Words{"a", "\t", "\t", "b", "  "}));
  EXPECT_EQ(pre_tokenize(PreTokenizer::Gpt2, "x += 1;"), (Words{"x", " +=", " 1", ";"}));
  EXPECT_TRUE(pre_tokenize(PreTokenizer::Gpt2, "").empty());
}

TEST(PreTokenizer, StarCoderSplitsDigitsFirst) {
  EXPECT_EQ(pre_tokenize(PreTokenizer::StarCoder, "abc 123"), (Words{"abc", " ", "1", "2", "3"}));
  EXPECT_EQ(pre_tokenize(PreTokenizer::StarCoder, "v2.0"), (Words{"v", "2", ".", "0"}));
  // Non-ASCII numbers (\p{N}) are split too.
  EXPECT_EQ(pre_tokenize(PreTokenizer::StarCoder, "\u2460\u2461"), (Words{"\u2460", "\u2461"}));
}

TEST(PreTokenizer, Llama3Pattern) {
  EXPECT_EQ(pre_tokenize(PreTokenizer::Llama3, "Hello 12345 world!!\n\nok"),
            (Words{"Hello", " ", "123", "45", " world", "!!\n\n", "ok"}));
  EXPECT_EQ(pre_tokenize(PreTokenizer::Llama3, "I'M (x)"), (Words{"I", "'M", " (", "x", ")"}));
  EXPECT_EQ(pre_tokenize(PreTokenizer::Llama3, "a \n\n b"), (Words{"a", " \n\n", " b"}));
}

TEST(PreTokenizer, Qwen2SingleDigits) {
  EXPECT_EQ(pre_tokenize(PreTokenizer::Qwen2, "x12345"), (Words{"x", "1", "2", "3", "4", "5"}));
}

TEST(PreTokenizer, DefaultSequence) {
  EXPECT_EQ(pre_tokenize(PreTokenizer::Default, "a+b=3,456!"),
            (Words{"a", "+", "b", "=", "3", ",", "456", "!"}));
  EXPECT_EQ(pre_tokenize(PreTokenizer::Default, "1234567"), (Words{"123", "456", "7"}));
}

TEST(PreTokenizer, NamesAsLlamaCppGroupsThem) {
  EXPECT_EQ(pre_tokenizer_from_name("smollm").kind, PreTokenizer::StarCoder);
  EXPECT_EQ(pre_tokenizer_from_name("gpt2").kind, PreTokenizer::Gpt2);
  EXPECT_EQ(pre_tokenizer_from_name("llama-bpe").kind, PreTokenizer::Llama3);
  EXPECT_TRUE(pre_tokenizer_from_name("llama-bpe").ignore_merges);
  EXPECT_EQ(pre_tokenizer_from_name("qwen2").kind, PreTokenizer::Qwen2);
  EXPECT_TRUE(pre_tokenizer_from_name("").known);
  EXPECT_FALSE(pre_tokenizer_from_name("no-such-tokenizer").known);
  EXPECT_EQ(pre_tokenizer_from_name("no-such-tokenizer").kind, PreTokenizer::Default);
}

// --- unicode helpers -----------------------------------------------------------------------

TEST(Unicode, ByteAlphabetIsABijection) {
  EXPECT_EQ(unicode::byte_to_codepoint(' '), 0x120u);   // 'Ġ'
  EXPECT_EQ(unicode::byte_to_codepoint('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(unicode::byte_to_codepoint('a'), static_cast<uint32_t>('a'));
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(unicode::codepoint_to_byte(unicode::byte_to_codepoint(static_cast<uint8_t>(b))), b);
  }
}

TEST(Unicode, CategoriesAndDecoding) {
  EXPECT_TRUE(unicode::is_letter('a'));
  EXPECT_TRUE(unicode::is_letter(0x65E5));   // 日
  EXPECT_TRUE(unicode::is_number(0x0663));   // Arabic-Indic three
  EXPECT_TRUE(unicode::is_whitespace(0x3000));
  EXPECT_FALSE(unicode::is_whitespace(0x1C));  // not White_Space, unlike str.isspace()
  EXPECT_TRUE(unicode::flags(0x0301) & unicode::kMark);
  EXPECT_TRUE(unicode::flags(0x1F600) & unicode::kSymbol);  // beyond the flat BMP table
  EXPECT_EQ(unicode::flags(0x110000), 0);
  EXPECT_EQ(unicode::decode_utf8("a\xC3\xA9\xF0\x9F\x98\x80"), (std::vector<uint32_t>{'a', 0xE9, 0x1F600}));
  EXPECT_EQ(unicode::decode_utf8("\xE2\x82x"), (std::vector<uint32_t>{0xFFFD, 0xFFFD, 'x'}));
}

// --- synthetic BPE --------------------------------------------------------------------------

TokenizerVocab tiny_bpe(std::vector<std::string> merges) {
  TokenizerVocab v;
  v.model = "gpt2";
  v.pre = "gpt2";
  // Byte-level alphabet for a, b, c, space ('Ġ'), plus merge results and one control token.
  v.tokens = {"a", "b", "c", "\xC4\xA0", "ab", "bc", "\xC4\xA0" "a", "<|end|>"};
  v.token_types = {1, 1, 1, 1, 1, 1, 1, 3};
  v.merges = std::move(merges);
  v.eos = 7;
  return v;
}

TEST(BpeSynthetic, LowerRankMergesFirst) {
  auto bc_first = make_tokenizer(tiny_bpe({"b c", "a b", "\xC4\xA0 a"}));
  EXPECT_EQ(bc_first->encode("abc", false, false), (std::vector<TokenId>{0, 5}));
  auto ab_first = make_tokenizer(tiny_bpe({"a b", "b c", "\xC4\xA0 a"}));
  EXPECT_EQ(ab_first->encode("abc", false, false), (std::vector<TokenId>{4, 2}));
  // " abc": 'a b' (rank 0) takes the 'a' before 'Ġ a' (rank 2) can.
  EXPECT_EQ(ab_first->encode("abc abc", false, false), (std::vector<TokenId>{4, 2, 3, 4, 2}));
  EXPECT_EQ(bc_first->encode("abc abc", false, false), (std::vector<TokenId>{0, 5, 6, 5}));
  EXPECT_EQ(bc_first->decode({0, 5, 6, 5}), "abc abc");
}

TEST(BpeSynthetic, SpecialTokensAndMissingBytes) {
  auto tok = make_tokenizer(tiny_bpe({"a b"}));
  EXPECT_EQ(tok->encode("ab<|end|>a", false, true), (std::vector<TokenId>{4, 7, 0}));
  EXPECT_TRUE(tok->is_end_of_generation(7));  // eos, and "<|end|>" by its text
  // 'z' has no entry and no byte token: dropped, as llama.cpp does.
  EXPECT_EQ(tok->encode("azb", false, false), (std::vector<TokenId>{0, 1}));
}

TEST(BpeSynthetic, MergeWithUnknownPartIsAnError) {
  try {
    make_tokenizer(tiny_bpe({"a b", "x y"}));
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("merge #1 'x y'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not in the vocabulary"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_tokenizer(tiny_bpe({"ab"})), std::runtime_error);  // no separator
  EXPECT_THROW(make_tokenizer(tiny_bpe({})), std::runtime_error);      // no merges at all
}

TEST(VocabErrors, DefectiveVocabularies) {
  auto expect_error = [](TokenizerVocab v, const std::string& fragment) {
    try {
      make_tokenizer(std::move(v));
      ADD_FAILURE() << "expected an error containing '" << fragment << "'";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  TokenizerVocab empty = tiny_bpe({"a b"});
  empty.tokens.clear();
  empty.token_types.clear();
  expect_error(empty, "empty");
  TokenizerVocab types = tiny_bpe({"a b"});
  types.token_types.pop_back();
  expect_error(types, "token_type");
  TokenizerVocab model = tiny_bpe({"a b"});
  model.model = "bert";
  expect_error(model, "unsupported");
  TokenizerVocab eos = tiny_bpe({"a b"});
  eos.eos = 100;
  expect_error(eos, "outside the vocabulary");
}

// --- synthetic SentencePiece ----------------------------------------------------------------

constexpr const char* kSpace = "\xE2\x96\x81";  // U+2581

TokenizerVocab tiny_spm(std::vector<std::pair<std::string, float>> pieces) {
  TokenizerVocab v;
  v.model = "llama";
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.token_types = {2, 3, 3};
  v.scores = {0, 0, 0};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    v.tokens.push_back(name);
    v.token_types.push_back(6);
    v.scores.push_back(0);
  }
  for (auto& [text, score] : pieces) {
    v.tokens.push_back(text);
    v.token_types.push_back(1);
    v.scores.push_back(score);
  }
  return v;
}

constexpr TokenId kFirstPiece = 3 + 256;

TEST(SpmSynthetic, HigherScoreMergesFirst) {
  const std::string sp = kSpace;
  // pieces: 0 ▁, 1 a, 2 b, 3 c, 4 ab, 5 bc
  auto make = [&](float ab, float bc) {
    return make_tokenizer(tiny_spm({{sp, -1}, {"a", -2}, {"b", -2}, {"c", -2}, {"ab", ab}, {"bc", bc}}));
  };
  const TokenId S = kFirstPiece, A = S + 1, B = S + 2, C = S + 3, AB = S + 4, BC = S + 5;
  EXPECT_EQ(make(-1.0f, -0.5f)->encode("abc", false, false), (std::vector<TokenId>{S, A, BC}));
  EXPECT_EQ(make(-0.5f, -1.0f)->encode("abc", false, false), (std::vector<TokenId>{S, AB, C}));
  // Equal scores: the leftmost pair wins.
  EXPECT_EQ(make(-1.0f, -1.0f)->encode("abc", false, false), (std::vector<TokenId>{S, AB, C}));
  (void)B;
}

TEST(SpmSynthetic, WordsSpacePrefixBytesAndSpecials) {
  const std::string sp = kSpace;
  auto tok = make_tokenizer(tiny_spm({{sp, -1},        {"h", -2},        {"e", -2},        {"l", -2},
                                      {"o", -2},       {"w", -2},        {"r", -2},        {"d", -2},
                                      {"he", -1},      {"ll", -1.1f},    {"or", -1.2f},    {"ld", -1.3f},
                                      {"wo", -2},      {"orld", -2.2f},  {"world", -2.4f}, {"wor", -2.5f},
                                      {"hell", -3},    {"hello", -4},    {sp + "hello", -5},
                                      {sp + "world", -6}}));
  const TokenId HELLO = kFirstPiece + 18, WORLD = kFirstPiece + 19, H = kFirstPiece + 1;
  EXPECT_EQ(tok->bos(), 1);
  EXPECT_EQ(tok->eos(), 2);
  EXPECT_EQ(tok->encode("hello world", false, false), (std::vector<TokenId>{HELLO, WORLD}));
  // add_special: BOS first (SentencePiece default).
  EXPECT_EQ(tok->encode("hello world", true, false), (std::vector<TokenId>{1, HELLO, WORLD}));
  EXPECT_EQ(tok->decode({1, HELLO, WORLD}, false), " hello world");
  EXPECT_EQ(tok->decode({1, HELLO, WORLD}, true), "<s> hello world");
  // "é" is not a piece: byte fallback to <0xC3><0xA9>.
  EXPECT_EQ(tok->encode("h\xC3\xA9", false, false),
            (std::vector<TokenId>{kFirstPiece, H, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(tok->decode({kFirstPiece, H, 3 + 0xC3, 3 + 0xA9}), " h\xC3\xA9");
  // A special token in the text; the text after it gets the space prefix again.
  EXPECT_EQ(tok->encode("hello</s>world", false, true), (std::vector<TokenId>{HELLO, 2, WORLD}));
  EXPECT_TRUE(tok->is_end_of_generation(2));
}

TEST(SpmSynthetic, NoSpacePrefixWhenFileSaysSo) {
  const std::string sp = kSpace;
  TokenizerVocab v = tiny_spm({{sp, -1}, {"a", -2}});
  v.add_space_prefix = false;
  v.add_bos = false;
  auto tok = make_tokenizer(std::move(v));
  EXPECT_EQ(tok->encode("a a", true, false), (std::vector<TokenId>{kFirstPiece + 1, kFirstPiece, kFirstPiece + 1}));
  TokenizerVocab bad = tiny_spm({{sp, -1}});
  bad.scores.pop_back();
  EXPECT_THROW(make_tokenizer(std::move(bad)), std::runtime_error);
}

// --- from_gguf on synthetic files -------------------------------------------------------------

std::unique_ptr<GgufFile> gguf_with(const std::function<void(test::GgufWriter&)>& fill) {
  test::GgufWriter w;
  fill(w);
  const auto bytes = w.build();
  return GgufFile::from_bytes(bytes.data(), bytes.size(), "synthetic.gguf");
}

TEST(TokenizerFromGguf, ReadsSyntheticFile) {
  // Token types as a hand-encoded INT32 array payload.
  test::GgufWriter::Bytes types;
  for (int32_t t : {1, 1, 1, 3}) test::GgufWriter::put<int32_t>(types, t);
  auto file = gguf_with([&](test::GgufWriter& w) {
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string("tokenizer.ggml.pre", "gpt2");
    w.add_string_array("tokenizer.ggml.tokens", {"a", "b", "ab", "<|im_end|>"});
    w.add_raw("tokenizer.ggml.token_type", static_cast<uint32_t>(GgufValueType::ARRAY),
              test::GgufWriter::array_payload(GgufValueType::INT32, 4, types));
    w.add_string_array("tokenizer.ggml.merges", {"a b"});
    w.add_u32("tokenizer.ggml.eos_token_id", 3);
  });
  auto tok = Tokenizer::from_gguf(*file);
  EXPECT_EQ(tok->encode("abab<|im_end|>", false, true), (std::vector<TokenId>{2, 2, 3}));
  EXPECT_EQ(tok->eos(), 3);
  EXPECT_EQ(tok->bos(), -1);
}

TEST(TokenizerFromGguf, MissingTokensIsAClearError) {
  auto file = gguf_with([](test::GgufWriter& w) {
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string_array("tokenizer.ggml.merges", {"a b"});
  });
  try {
    Tokenizer::from_gguf(*file);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.ggml.tokens"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("synthetic.gguf"), std::string::npos) << e.what();
  }
}

TEST(TokenizerFromGguf, BadMergesAndMissingModelAreErrors) {
  auto bad_merge = gguf_with([](test::GgufWriter& w) {
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string_array("tokenizer.ggml.tokens", {"a", "b"});
    w.add_string_array("tokenizer.ggml.merges", {"a q"});
  });
  try {
    Tokenizer::from_gguf(*bad_merge);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("'q', which is not in the vocabulary"), std::string::npos) << e.what();
  }
  auto no_model = gguf_with([](test::GgufWriter& w) { w.add_string_array("tokenizer.ggml.tokens", {"a"}); });
  EXPECT_THROW(Tokenizer::from_gguf(*no_model), std::runtime_error);
  auto no_merges = gguf_with([](test::GgufWriter& w) {
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string_array("tokenizer.ggml.tokens", {"a"});
  });
  EXPECT_THROW(Tokenizer::from_gguf(*no_merges), std::runtime_error);
}

}  // namespace
}  // namespace cf
