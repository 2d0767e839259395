// Chat templates: the built-in formatters render exactly what Jinja2 renders from the
// real SmolLM2 template (and reference Llama 3 / Mistral templates), per the fixture.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "gguf_writer.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "test_support.h"

namespace cf {
namespace {

using nlohmann::json;

json load_fixture(const std::string& name = "smollm2_q4_1.json") {
  std::ifstream f(test::fixture_path(name));
  if (!f) throw std::runtime_error("cannot open fixture " + name);
  return json::parse(f);
}

std::vector<ChatMessage> messages_of(const json& j) {
  std::vector<ChatMessage> out;
  for (const json& m : j) out.push_back({m.at("role"), m.at("content")});
  return out;
}

// SmolLM2's template and Qwen2.5's (ChatML with a tools branch, rendered without tools).
TEST(ChatTemplate, MatchesJinjaRenderingOfFixtureTemplates) {
  for (const char* name : {"smollm2_q4_1.json", "qwen2.5_coder_0.5b_instruct_q4_k_m.json"}) {
    SCOPED_TRACE(name);
    const json fixture = load_fixture(name);
    const json& templates = fixture.at("chat_templates");
    size_t checked = 0;
    for (const json& c : fixture.at("chat")) {
      const std::string jinja = templates.at(c.at("template").get<std::string>());
      const auto tmpl = ChatTemplate::from_template_text(jinja);
      ASSERT_TRUE(tmpl.has_value()) << c.at("template");
      EXPECT_EQ(tmpl->name(), c.at("family").get<std::string>());
      EXPECT_EQ(tmpl->apply(messages_of(c.at("messages")), c.at("add_generation_prompt")), c.at("text").get<std::string>())
          << c.at("template") << " / " << c.at("name");
      ++checked;
    }
    EXPECT_GE(checked, 15u);
  }
}

TEST(ChatTemplate, SmolLM2FromModelFile) {
  CF_REQUIRE_MODEL();
  auto file = GgufFile::open(test::default_model_path());
  const ChatTemplate t = ChatTemplate::from_gguf(*file);
  EXPECT_EQ(t.family(), ChatFamily::ChatML);
  EXPECT_EQ(t.apply({{"user", "Hi"}}, true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  // With a system message of its own there is no default one.
  EXPECT_EQ(t.apply({{"system", "S"}, {"user", "Hi"}}, false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplate, RecognitionAndDefaults) {
  EXPECT_FALSE(ChatTemplate::from_template_text("{{ messages }}").has_value());
  // A ChatML template whose system turn comes from message content has no default.
  const auto plain = ChatTemplate::from_template_text(
      "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n'}}{% endfor %}");
  ASSERT_TRUE(plain.has_value());
  EXPECT_EQ(plain->apply({{"user", "x"}}, false), "<|im_start|>user\nx<|im_end|>\n");
  // Escaped newlines in the literal (Qwen2.5 style) are understood.
  const auto qwen = ChatTemplate::from_template_text(
      "{{- '<|im_start|>system\\nYou are Qwen.<|im_end|>\\n' }}{% for m in messages %}...{% endfor %}");
  ASSERT_TRUE(qwen.has_value());
  EXPECT_EQ(qwen->apply({{"user", "x"}}, true),
            "<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n");
  // Nothing is injected into an empty conversation (the template's loop never runs).
  EXPECT_EQ(qwen->apply({}, true), "<|im_start|>assistant\n");
  const ChatTemplate mistral(ChatFamily::Mistral);
  EXPECT_EQ(mistral.apply({{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"}}, true),
            "[INST] Be brief.\n\nHi [/INST]Hello</s>");
}

TEST(ChatTemplate, FromGgufWithoutTemplateOrUnknown) {
  test::GgufWriter none;
  none.add_string("general.architecture", "llama");
  auto bytes = none.build();
  auto file = GgufFile::from_bytes(bytes.data(), bytes.size(), "none.gguf");
  EXPECT_EQ(ChatTemplate::from_gguf(*file).family(), ChatFamily::ChatML);

  test::GgufWriter odd;
  odd.add_string("tokenizer.chat_template", "{{ strange }}");
  bytes = odd.build();
  file = GgufFile::from_bytes(bytes.data(), bytes.size(), "odd.gguf");
  try {
    ChatTemplate::from_gguf(*file);
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("odd.gguf"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cf
