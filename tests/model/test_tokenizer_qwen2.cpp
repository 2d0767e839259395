// Qwen2.5's tokenizer (byte-level BPE, `qwen2` pre-tokenizer: single digits, contractions
// of any case, 151k pieces, no BOS) and chat template (ChatML with a default system turn
// and a tools branch): identical ids, text and renderings to llama.cpp / Jinja2 on the
// golden cases of tests/golden/qwen2.5_coder_*_instruct_q4_k_m.json, for the 0.5B (CI) and
// the 1.5B (a manual check: skipped when its file is absent).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "test_support.h"

namespace cf {
namespace {

using nlohmann::json;

class QwenTokenizer : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    const bool big = std::string(GetParam()) == "1.5b";
    if (big) {
      CF_REQUIRE_QWEN15_MANUAL();
    } else {
      CF_REQUIRE_QWEN05();
    }
    file_ = GgufFile::open(big ? test::qwen15_model_path() : test::qwen05_model_path());
    tok_ = Tokenizer::from_gguf(*file_);
    const std::string name = std::string("qwen2.5_coder_") + GetParam() + "_instruct_q4_k_m.json";
    std::ifstream in(test::fixture_path(name));
    ASSERT_TRUE(in) << "missing fixture " << name;
    fixture_ = json::parse(in);
  }
  std::unique_ptr<GgufFile> file_;
  std::unique_ptr<Tokenizer> tok_;
  json fixture_;
};

TEST_P(QwenTokenizer, Metadata) {
  EXPECT_EQ(tok_->model_name(), "gpt2");
  EXPECT_EQ(tok_->pre_tokenizer(), "qwen2");
  EXPECT_EQ(tok_->encode("", true, false), std::vector<TokenId>{});  // add_bos_token = false
  const auto im_end = tok_->encode("<|im_end|>", false, true);
  ASSERT_EQ(im_end.size(), 1u);
  EXPECT_TRUE(tok_->is_end_of_generation(im_end[0]));
}

TEST_P(QwenTokenizer, GoldenIdsAndTextMatchLlamaCpp) {
  const json& cases = fixture_.at("tokenize");
  ASSERT_GE(cases.size(), 40u);
  for (const json& c : cases) {
    const std::string name = c.at("name");
    const auto ids = c.at("ids").get<std::vector<TokenId>>();
    EXPECT_EQ(tok_->encode(c.at("text").get<std::string>(), c.at("add_special"), c.at("parse_special")), ids)
        << "case " << name;
    EXPECT_EQ(tok_->decode(ids, true), c.at("detok").get<std::string>()) << name;
    EXPECT_EQ(tok_->decode(ids, false), c.at("detok_plain").get<std::string>()) << name;
  }
}

TEST_P(QwenTokenizer, GreedyAndLogitPromptsTokenizeIdentically) {
  for (const char* section : {"greedy", "logits"})
    for (const json& c : fixture_.at(section))
      EXPECT_EQ(tok_->encode(c.at("prompt").get<std::string>(), false, true),
                c.at("prompt_ids").get<std::vector<TokenId>>())
          << section << " " << c.at("name");
}

// The file's own template, as chunkfuse reads it, renders what Jinja2 rendered (with and
// without a system message: Qwen's default system turn comes in only without one).
TEST_P(QwenTokenizer, ChatTemplateOfTheFileMatchesJinja) {
  const ChatTemplate t = ChatTemplate::from_gguf(*file_);
  EXPECT_EQ(t.family(), ChatFamily::ChatML);
  ASSERT_EQ(file_->get_string("tokenizer.chat_template").value_or(""),
            fixture_.at("chat_templates").at("model").get<std::string>());
  size_t checked = 0, with_system = 0;
  for (const json& c : fixture_.at("chat")) {
    if (c.at("template") != "model") continue;
    std::vector<ChatMessage> msgs;
    for (const json& m : c.at("messages")) msgs.push_back({m.at("role"), m.at("content")});
    with_system += msgs.front().role == "system";
    EXPECT_EQ(t.apply(msgs, c.at("add_generation_prompt")), c.at("text").get<std::string>()) << c.at("name");
    ++checked;
  }
  EXPECT_GE(checked, 8u);
  EXPECT_GE(with_system, 2u);
}

INSTANTIATE_TEST_SUITE_P(Qwen25Coder, QwenTokenizer, ::testing::Values("0.5b", "1.5b"),
                         [](const auto& info) { return std::string(info.param[0] == '0' ? "Qwen05" : "Qwen15Manual"); });

}  // namespace
}  // namespace cf
