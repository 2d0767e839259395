// Gemma 3's tokenizer (SentencePiece-style `llama` vocabulary of 262144 pieces, no space
// prefix, BOS added, user-defined pieces for HTML tags and whitespace runs): identical
// ids and text to llama.cpp on the golden cases of tests/golden/gemma3_270m_q4_k_m.json.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "model/tokenizer.h"
#include "test_support.h"

namespace cf {
namespace {

using nlohmann::json;

class Gemma3Tokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    CF_REQUIRE_GEMMA3();
    file_ = GgufFile::open(test::gemma3_model_path());
    tok_ = Tokenizer::from_gguf(*file_);
    std::ifstream in(test::fixture_path("gemma3_270m_q4_k_m.json"));
    ASSERT_TRUE(in) << "missing fixture gemma3_270m_q4_k_m.json";
    fixture_ = json::parse(in);
  }
  std::unique_ptr<GgufFile> file_;
  std::unique_ptr<Tokenizer> tok_;
  json fixture_;
};

TEST_F(Gemma3Tokenizer, Metadata) {
  EXPECT_EQ(tok_->model_name(), "llama");
  EXPECT_EQ(tok_->vocab_size(), 262144u);
  EXPECT_EQ(tok_->bos(), 2);
  EXPECT_EQ(tok_->eos(), 1);
  EXPECT_EQ(tok_->encode("", true, false), std::vector<TokenId>{2});  // add_bos_token = true
  EXPECT_TRUE(tok_->is_end_of_generation(1));
}

TEST_F(Gemma3Tokenizer, GoldenIdsAndTextMatchLlamaCpp) {
  const json& cases = fixture_.at("tokenize");
  ASSERT_GE(cases.size(), 40u);
  for (const json& c : cases) {
    const std::string name = c.at("name");
    const std::vector<TokenId> ids = c.at("ids").get<std::vector<TokenId>>();
    EXPECT_EQ(tok_->encode(c.at("text").get<std::string>(), c.at("add_special"), c.at("parse_special")), ids)
        << "case " << name;
    EXPECT_EQ(tok_->decode(ids, true), c.at("detok").get<std::string>()) << name;
    EXPECT_EQ(tok_->decode(ids, false), c.at("detok_plain").get<std::string>()) << name;
  }
}

TEST_F(Gemma3Tokenizer, GreedyAndLogitPromptsTokenizeIdentically) {
  // A base model: the fixture's prompts are tokenized with BOS (add_special).
  for (const char* section : {"greedy", "logits"})
    for (const json& c : fixture_.at(section))
      EXPECT_EQ(tok_->encode(c.at("prompt").get<std::string>(), true, true),
                c.at("prompt_ids").get<std::vector<TokenId>>())
          << section << " " << c.at("name");
}

}  // namespace
}  // namespace cf
