// The nesting bound on JSON from outside the process (issue 29, item 1).
#include <gtest/gtest.h>

#include <string>

#include "base/bounded_json.h"

namespace cf {
namespace {

std::string nested(int depth, char open = '[', char close = ']') {
  return std::string(static_cast<size_t>(depth), open) + std::string(static_cast<size_t>(depth), close);
}

TEST(BoundedJson, DepthCountsArraysAndObjectsNotStrings) {
  EXPECT_EQ(json_nesting_depth("1"), 0);
  EXPECT_EQ(json_nesting_depth("[]"), 1);
  EXPECT_EQ(json_nesting_depth(R"({"a": [1, {"b": []}], "c": {}})"), 4);
  // Brackets inside strings, escaped quotes included, are text.
  EXPECT_EQ(json_nesting_depth(R"(["[[[[", "\"[[[", {"k\\": "{{"}])"), 2);
  EXPECT_EQ(json_nesting_depth(nested(10) + nested(3)), 10);  // siblings do not add up
  // It stops at limit + 1: a 200,000-deep text is not walked to its end.
  EXPECT_EQ(json_nesting_depth(nested(200000), 64), 65);
}

TEST(BoundedJson, ParseRefusesPastTheLimitAndAcceptsUpToIt) {
  const auto ok = parse_json_bounded(nested(kMaxJsonDepth));
  EXPECT_TRUE(ok.is_array());
  EXPECT_THROW(parse_json_bounded(nested(kMaxJsonDepth + 1)), JsonTooDeep);
  EXPECT_THROW(parse_json_bounded(nested(kMaxJsonDepth + 1, '{', '}'), false), JsonTooDeep);
  // The request that crashed the server: an object whose option nests 200,000 deep.
  const std::string body = R"({"fusion": {"method": "nope", "options": {"a": )" + nested(200000) + "}}}";
  try {
    (void)parse_json_bounded(body, false);
    FAIL() << "a 200,000-deep body was accepted";
  } catch (const JsonTooDeep& e) {
    EXPECT_EQ(e.limit, kMaxJsonDepth);
  }
  // Invalid text still parses to a discarded value (or throws nlohmann's parse_error).
  EXPECT_TRUE(parse_json_bounded("[1, 2", false).is_discarded());
  EXPECT_THROW(parse_json_bounded("[1, 2"), nlohmann::json::parse_error);
}

TEST(BoundedJson, ExcerptIsCutOnACharacterBoundary) {
  EXPECT_EQ(json_excerpt(nlohmann::json{{"a", 1}}), R"({"a":1})");
  const std::string long_text(1000, 'x');
  const std::string e = json_excerpt(nlohmann::json(long_text), 20);
  EXPECT_EQ(e, "\"" + std::string(19, 'x') + "...");
  // "é" is two bytes: a cut inside it moves back to the character's start.
  const std::string accents = json_excerpt(nlohmann::json("ééééé"), 4);
  EXPECT_EQ(accents, "\"é...");
}

}  // namespace
}  // namespace cf
