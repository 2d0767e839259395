// The server's chat layout for a model file without a chat template (Gemma 3 270M, a base
// model): the plain-text conversation, cut around the contents like a template's rendering.
#include <gtest/gtest.h>

#include "fusion/rag_prompt.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "test_support.h"

namespace cf {
namespace {

ChatTemplate gemma3_template() {
  auto file = GgufFile::open(test::gemma3_model_path());  // metadata only: no weights are read
  return ChatTemplate::from_gguf(*file);
}

TEST(RagPrompt, PlainTextChatForAFileWithoutTemplate) {
  CF_REQUIRE_GEMMA3();
  const ChatTemplate t = gemma3_template();
  ASSERT_FALSE(t.from_file());
  const std::vector<ChatMessage> msgs = {
      {"system", "Be brief."}, {"user", "What is exported?"}, {"assistant", "Copper."}, {"user", "Which river?"}};
  // A new turn: S ends where the last user content starts (the passages go there).
  auto p = render_prompt_around(t, msgs, {3});
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0], "Be brief.\n\nWhat is exported?\nAnswer: Copper.\n\n");
  EXPECT_EQ(p[1], "\nAnswer:");
  // A continued conversation: the text between the kept answer and the new question.
  p = render_prompt_around(t, msgs, {2, 3});
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0], "Be brief.\n\nWhat is exported?\nAnswer: ");
  EXPECT_EQ(p[1], "\n\n");
  EXPECT_EQ(p[2], "\nAnswer:");
  // The pieces and the contents give back the whole prompt, no ChatML marker in it.
  EXPECT_EQ(p[0] + "Copper." + p[1] + "Which river?" + p[2],
            "Be brief.\n\nWhat is exported?\nAnswer: Copper.\n\nWhich river?\nAnswer:");
  EXPECT_EQ(default_chat_stops(t), std::vector<std::string>{"\n\n"});
  EXPECT_THROW(render_prompt_around(t, msgs, {3, 1}), std::invalid_argument);
}

TEST(RagPrompt, AFileWithATemplateKeepsIt) {
  const ChatTemplate t(ChatFamily::ChatML);
  const std::vector<ChatMessage> msgs = {{"user", "Hi?"}};
  EXPECT_EQ(render_prompt_around(t, msgs, {0}), render_chat_around(t, msgs, {0}));
  EXPECT_TRUE(default_chat_stops(t).empty());
}

}  // namespace
}  // namespace cf
