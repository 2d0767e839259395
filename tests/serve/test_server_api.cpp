// The HTTP layer's request parsing and response formatting (src/serve/api_json.cpp): what
// OpenAI clients send must parse, what they must not send must be a 400 naming the field,
// and what we answer must have the shape the openai client and Prometheus read.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <set>
#include <sstream>

#include "fusion/methods.h"
#include "serve/api_json.h"
#include "serve/request_plan.h"

namespace cf {
namespace {

using nlohmann::json;

api::ParsedCompletion chat(const json& body) { return api::parse_completion(body, true); }

// The RequestError a body raises (status 0 when it parses): the parser's (types and ranges),
// then the engine's one check of the request (validate_request: what the methods accept).
RequestError refusal(const json& body, bool is_chat = true) {
  try {
    const api::ParsedCompletion pc = api::parse_completion(body, is_chat);
    PlanLimits limits;
    limits.context_length = limits.max_prompt_tokens = 1024;
    validate_request(pc.request, limits);
  } catch (const RequestError& e) {
    return e;
  }
  return RequestError(0, "", "");
}

json basic_chat() { return json{{"model", "m"}, {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}}; }

TEST(ServerApi, ChatBodyWithAllKnownFieldsParses) {
  json b = basic_chat();
  b["messages"] = json::array({{{"role", "system"}, {"content", "be brief"}},
                               {{"role", "user"}, {"content", json::array({{{"type", "text"}, {"text", "a"}},
                                                                           {{"type", "text"}, {"text", "b"}}})}}});
  b["max_tokens"] = 7;
  b["temperature"] = 0.5;
  b["top_p"] = 0.9;
  b["seed"] = 42;
  b["priority"] = -3;
  b["stop"] = json::array({"\n", "END"});
  b["stream"] = true;
  b["stream_options"] = {{"include_usage", true}};
  b["documents"] = json::array({"passage one", {{"id", "abc"}}, {{"text", "passage three"}}});
  b["fusion"] = {{"method", "epic"}, {"ratio", 0.3}, {"reorder", true}, {"conversation_id", "c1"},
                 {"prefix_cache", false}, {"chunk_context", "prefixed"}};
  b["frequency_penalty"] = 0;  // unknown to us: ignored, as OpenAI ignores unknown fields
  b["user"] = "someone";
  const auto pc = chat(b);
  const auto& r = pc.request;
  EXPECT_TRUE(r.chat);
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "ab");
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_DOUBLE_EQ(r.temperature, 0.5);
  EXPECT_DOUBLE_EQ(r.top_p, 0.9);
  ASSERT_TRUE(r.seed.has_value());
  EXPECT_EQ(*r.seed, 42u);
  EXPECT_EQ(r.priority, -3);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_TRUE(pc.stream);
  EXPECT_TRUE(pc.include_usage);
  ASSERT_EQ(r.documents.size(), 3u);
  EXPECT_EQ(r.documents[0].text, "passage one");
  EXPECT_EQ(r.documents[1].id, "abc");
  EXPECT_TRUE(r.documents[1].text.empty());
  EXPECT_EQ(r.documents[2].text, "passage three");
  EXPECT_EQ(r.fusion.options.method, "epic");
  EXPECT_DOUBLE_EQ(r.fusion.options.ratio, 0.3);
  EXPECT_TRUE(r.fusion.reorder);
  EXPECT_EQ(r.fusion.conversation_id, "c1");
  EXPECT_FALSE(r.fusion.prefix_cache);

  // Method options (issue 16) reach the engine as given; bad ones are refused naming them.
  b["fusion"] = {{"method", "qcfuse"}, {"options", {{"probe_rows", "suffix"}, {"layers", "top1"}}}};
  EXPECT_EQ(chat(b).request.fusion.options.method_options, json({{"probe_rows", "suffix"}, {"layers", "top1"}}));
  b["fusion"] = {{"method", "qcfuse"}, {"options", {{"anchor_ratio", 3}}}};
  const RequestError e = refusal(b);
  EXPECT_EQ(e.param, "fusion.options");
  EXPECT_NE(std::string(e.what()).find("anchor_ratio"), std::string::npos) << e.what();
  b["fusion"] = {{"method", "qcfuse"}, {"options", {{"anchors_ratio", 0.1}}}};
  EXPECT_NE(std::string(refusal(b).what()).find("anchors_ratio"), std::string::npos);
  EXPECT_EQ(r.fusion.options.chunk_context, ChunkContext::prefixed);
}

TEST(ServerApi, DefaultsAndNullsMeanNotGiven) {
  json b = basic_chat();
  b["max_tokens"] = nullptr;
  b["stop"] = nullptr;
  b["temperature"] = nullptr;
  const auto r = api::parse_completion(b, true, FusionOptions{.method = "cacheblend"}).request;
  EXPECT_EQ(r.max_tokens, CompletionRequest{}.max_tokens);
  EXPECT_DOUBLE_EQ(r.temperature, 0.0);
  EXPECT_TRUE(r.stop.empty());
  EXPECT_FALSE(r.seed.has_value());
  EXPECT_EQ(r.fusion.options.method, "cacheblend");  // the server's default method
  EXPECT_DOUBLE_EQ(r.fusion.options.ratio, FusionOptions{}.ratio);
  EXPECT_FALSE(chat(b).stream);
  // serve --ratio fills fusion.ratio when the request names none, with or without a fusion object.
  EXPECT_DOUBLE_EQ(api::parse_completion(b, true, FusionOptions{.method = "cacheblend", .ratio = 0.3}).request.fusion.options.ratio, 0.3);
  b["fusion"] = json{{"method", "epic"}};
  EXPECT_DOUBLE_EQ(api::parse_completion(b, true, FusionOptions{.method = "cacheblend", .ratio = 0.3}).request.fusion.options.ratio, 0.3);
  b["fusion"]["ratio"] = 0.05;
  EXPECT_DOUBLE_EQ(api::parse_completion(b, true, FusionOptions{.method = "cacheblend", .ratio = 0.3}).request.fusion.options.ratio, 0.05);
}

TEST(ServerApi, MaxCompletionTokensWinsAndStopMayBeAString) {
  json b = basic_chat();
  b["max_tokens"] = 5;
  b["max_completion_tokens"] = 9;
  b["stop"] = "###";
  const auto r = chat(b).request;
  EXPECT_EQ(r.max_tokens, 9);
  EXPECT_EQ(r.stop, std::vector<std::string>{"###"});
}

TEST(ServerApi, DeveloperRoleIsSystemAndAssistantContentMayBeNull) {
  json b = basic_chat();
  b["messages"] = json::array({{{"role", "developer"}, {"content", "x"}},
                               {{"role", "assistant"}, {"content", nullptr}},
                               {{"role", "user"}, {"content", "q"}}});
  const auto r = chat(b).request;
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "");
}

TEST(ServerApi, CompletionPromptIsAStringOrAListOfOne) {
  EXPECT_EQ(api::parse_completion(json{{"prompt", "abc"}}, false).request.prompt, "abc");
  EXPECT_EQ(api::parse_completion(json{{"prompt", {"xyz"}}}, false).request.prompt, "xyz");
  EXPECT_FALSE(api::parse_completion(json{{"prompt", "abc"}}, false).request.chat);
  EXPECT_EQ(refusal(json{{"prompt", {"a", "b"}}}, false).param, "prompt");
  EXPECT_EQ(refusal(json{{"prompt", {1, 2, 3}}}, false).param, "prompt");
  EXPECT_EQ(refusal(json{{"model", "m"}}, false).param, "prompt");
}

TEST(ServerApi, WrongTypesAndValuesAre400NamingTheField) {
  struct Case {
    const char* key;
    json value;
    const char* param;
  };
  const std::vector<Case> cases = {
      {"model", 3, "model"},
      {"max_tokens", "ten", "max_tokens"},
      {"max_tokens", 0, "max_tokens"},
      {"max_tokens", 2.5, "max_tokens"},
      {"max_completion_tokens", -1, "max_completion_tokens"},
      {"temperature", "hot", "temperature"},
      {"temperature", 3.0, "temperature"},
      {"top_p", 0.0, "top_p"},
      {"top_p", 1.5, "top_p"},
      {"seed", "s", "seed"},
      {"priority", 1.5, "priority"},
      {"priority", "high", "priority"},
      {"stop", 5, "stop"},
      {"stop", json::array({"a", 1}), "stop[1]"},
      {"stop", "", "stop"},
      {"stream", "yes", "stream"},
      {"stream_options", json{{"include_usage", 1}}, "stream_options.include_usage"},
      {"n", 2, "n"},
      {"documents", "one passage", "documents"},
      {"documents", json::array({1}), "documents[0]"},
      {"documents", json::array({json::object()}), "documents[0]"},
      {"documents", json::array({{{"id", "a"}, {"text", "b"}}}), "documents[0]"},
      {"documents", json::array({{{"id", 7}}}), "documents[0].id"},
      {"documents", json::array({""}), "documents[0]"},
      {"fusion", "epic", "fusion"},
      {"fusion", json{{"ratio", 1.5}}, "fusion.ratio"},
      {"fusion", json{{"ratio", -0.1}}, "fusion.ratio"},
      {"fusion", json{{"ratio", "half"}}, "fusion.ratio"},
      {"fusion", json{{"method", 1}}, "fusion.method"},
      {"fusion", json{{"reorder", "true"}}, "fusion.reorder"},
      {"fusion", json{{"prefix_cache", 0}}, "fusion.prefix_cache"},
      {"fusion", json{{"method", "qcfuse"}, {"options", {{"depth", 3}}}}, "fusion.options"},
      {"fusion", json{{"method", "qcfuse"}, {"options", {{"anchor_ratio", 2}}}}, "fusion.options"},
      {"fusion", json{{"method", "qcfuse"}, {"options", {{"profile", "/etc/passwd"}}}}, "fusion.options"},
      {"fusion", json{{"method", "prophet"}, {"options", {{"probe_rows", "tail"}}}}, "fusion.options"},
      {"fusion", json{{"method", "epic"}, {"options", {{"x", 1}}}}, "fusion.options"},
      {"fusion", json{{"method", "cachecraft"}, {"options", {{"alpha", "x"}}}}, "fusion.options"},  // was a 500
      {"fusion", json{{"method", "cachecraft"}, {"options", {{"max_variants", 100000}}}}, "fusion.options"},
      {"fusion", json{{"method", "qcfuse"}, {"options", "fast"}}, "fusion.options"},
      {"fusion", json{{"chunk_context", "pic"}}, "fusion.chunk_context"},
      {"fusion", json{{"chunk_context", 1}}, "fusion.chunk_context"},
      {"fusion", json{{"chunk_variant", "pic"}}, "fusion.chunk_context"},  // the older name
      // Quality on demand (issue 26): auto takes a quality in (0, 1] and chooses the ratio itself.
      {"fusion", json{{"method", "auto"}}, "fusion.quality"},
      {"fusion", json{{"method", "auto"}, {"quality", 0}}, "fusion.quality"},
      {"fusion", json{{"method", "auto"}, {"quality", 1.5}}, "fusion.quality"},
      {"fusion", json{{"method", "auto"}, {"quality", "high"}}, "fusion.quality"},
      {"fusion", json{{"method", "auto"}, {"quality", 0.9}, {"ratio", 0.15}}, "fusion.ratio"},
      {"fusion", json{{"method", "auto"}, {"quality", 0.9}, {"options", {{"layers", "all"}}}}, "fusion.options"},
      {"fusion", json{{"method", "prophet"}, {"quality", 0.9}}, "fusion.quality"},
      {"messages", "hi", "messages"},
      {"messages", json::array(), "messages"},
      {"messages", json::array({{{"role", "tool"}, {"content", "x"}}}), "messages[0].role"},
      {"messages", json::array({{{"content", "x"}}}), "messages[0].role"},
      {"messages", json::array({{{"role", "user"}}}), "messages[0].content"},
      {"messages", json::array({{{"role", "user"}, {"content", 5}}}), "messages[0].content"},
      {"messages", json::array({{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}),
       "messages[0].content[0].type"},
  };
  for (const auto& c : cases) {
    json b = basic_chat();
    b[c.key] = c.value;
    const RequestError e = refusal(b);
    EXPECT_EQ(e.status, 400) << c.key << " = " << c.value.dump();
    EXPECT_EQ(e.type, "invalid_request_error") << c.key;
    EXPECT_EQ(e.param, c.param) << c.key << " = " << c.value.dump() << ": " << e.what();
  }
  json no_messages = basic_chat();
  no_messages.erase("messages");
  EXPECT_EQ(refusal(no_messages).param, "messages");
}

// OpenAI fields that would change what the answer is (its shape or its content) and that the
// engine does not implement are refused naming the field, not silently ignored (issue 59); their
// "off" values and null, which SDKs send, still parse.
TEST(ServerApi, FieldsThatChangeTheAnswerAre400UnlessOff) {
  const std::vector<std::pair<const char*, json>> refused = {
      {"logprobs", true},
      {"logprobs", 2},  // /v1/completions' form: the top 2
      {"top_logprobs", 3},
      {"echo", true},
      {"logit_bias", {{"50256", -100}}},
      {"tools", json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}})},
      {"tool_choice", "required"},
      {"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}}}}},
      {"functions", json::array({{{"name", "f"}}})},
      {"function_call", {{"name", "f"}}},
      {"response_format", {{"type", "json_object"}}},
      {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}}},
      {"n", 2},
      {"best_of", 3},
      {"suffix", "tail"},
      {"logprobs", "yes"},  // a wrong type is refused as well
  };
  for (const bool is_chat : {true, false}) {
    for (const auto& [key, value] : refused) {
      json b = is_chat ? basic_chat() : json{{"prompt", "hi"}};
      b[key] = value;
      const RequestError e = refusal(b, is_chat);
      EXPECT_EQ(e.status, 400) << key << " = " << value.dump();
      EXPECT_EQ(e.type, "invalid_request_error") << key;
      EXPECT_EQ(e.param, key) << key << " = " << value.dump() << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
  const std::vector<std::pair<const char*, json>> off = {
      {"logprobs", false}, {"logprobs", 0}, {"top_logprobs", 0}, {"echo", false},
      {"logit_bias", json::object()}, {"tools", json::array()}, {"tool_choice", "none"},
      {"tool_choice", "auto"}, {"functions", json::array()}, {"function_call", "none"},
      {"response_format", {{"type", "text"}}}, {"n", 1}, {"best_of", 1}, {"suffix", ""},
  };
  for (const auto& [key, value] : off) {
    json b = basic_chat();
    b[key] = value;
    EXPECT_EQ(refusal(b).status, 0) << key << " = " << value.dump() << ": " << refusal(b).what();
    b[key] = nullptr;
    EXPECT_EQ(refusal(b).status, 0) << key << " = null";
  }
}

// Stop strings are matched on the scheduler thread after every token, each one's held-back
// prefix compared at every length (quadratic in its size): at most 16 of at most 256 bytes
// each (issue 59; a single stop string could fill the 8 MiB body).
TEST(ServerApi, StopStringsAreBoundedInCountAndBytes) {
  json b = basic_chat();
  b["stop"] = json::array();
  for (int i = 0; i < 16; ++i) b["stop"].push_back(std::string(256, static_cast<char>('a' + i)));
  EXPECT_EQ(chat(b).request.stop.size(), 16u);
  b["stop"].push_back("q");
  EXPECT_EQ(refusal(b).param, "stop");
  b["stop"] = json::array({"ok", std::string(257, 'x')});
  const RequestError e = refusal(b);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "stop[1]") << e.what();
  EXPECT_NE(std::string(e.what()).find("256 bytes"), std::string::npos) << e.what();
  b["stop"] = std::string(1 << 20, 'x');  // the single-string form
  EXPECT_EQ(refusal(b).param, "stop");
  json completion{{"prompt", "hi"}, {"stop", std::string(257, 'x')}};
  EXPECT_EQ(refusal(completion, false).param, "stop");
}

// fusion.conversation_id keys CRAFT's conversation maps (bounded in count only) and was
// bounded by --max-body alone: at most 256 bytes (issue 59).
TEST(ServerApi, ConversationIdIsBoundedInBytes) {
  json b = basic_chat();
  b["fusion"] = {{"conversation_id", std::string(api::kMaxConversationIdBytes, 'c')}};
  EXPECT_EQ(chat(b).request.fusion.conversation_id.size(), api::kMaxConversationIdBytes);
  b["fusion"]["conversation_id"] = std::string(2 << 20, 'c');  // a 2 MiB id
  const RequestError e = refusal(b);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "fusion.conversation_id") << e.what();
  EXPECT_NE(std::string(e.what()).find("256 bytes"), std::string::npos) << e.what();
}

TEST(ServerApi, RatioBoundsAreInclusive) {
  for (double ratio : {0.0, 1.0}) {
    json b = basic_chat();
    b["fusion"] = {{"ratio", ratio}};
    EXPECT_DOUBLE_EQ(chat(b).request.fusion.options.ratio, ratio);
  }
}

TEST(ServerApi, BodyMustBeAJsonObject) {
  for (const char* text : {"{\"model\": ", "", "not json", "[1, 2]", "\"str\"", "{\"a\": \"\xff\"}"}) {
    try {
      api::parse_body(text);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const RequestError& e) {
      EXPECT_EQ(e.status, 400);
    }
  }
  EXPECT_EQ(api::parse_body("{\"a\": 1}")["a"], 1);
}

TEST(ServerApi, ChunkTextsFromTextsOrDocuments) {
  EXPECT_EQ(api::parse_chunk_texts(json{{"texts", {"a", "b"}}}), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(api::parse_chunk_texts(json{{"documents", json::array({"a", {{"text", "b"}}})}}),
            (std::vector<std::string>{"a", "b"}));
  for (const json& bad : {json::object(), json{{"texts", "a"}}, json{{"texts", json::array()}},
                          json{{"texts", {1}}}, json{{"texts", {"a"}}, {"documents", {"b"}}},
                          json{{"texts", json::array({{{"text", "b"}}})}}, json{{"texts", {""}}}}) {
    EXPECT_THROW(api::parse_chunk_texts(bad), RequestError) << bad.dump();
  }
}

CompletionResult sample_result() {
  CompletionResult r;
  r.text = "Paris.";
  r.finish_reason = "stop";
  r.prompt_tokens = 100;
  r.completion_tokens = 3;
  r.prefilled_tokens = 30;
  r.prefix_hit_tokens = 32;
  r.chunk_hits = 2;
  r.chunk_misses = 1;
  r.recomputed_tokens = 12;
  r.cached_tokens = 58;  // 32 from the prefix cache, 26 of the two stored chunks (the missed one was computed)
  r.chunk_order = {"c1", "c2", "c3"};
  r.timings.ttft_ms = 42.5;
  return r;
}

TEST(ServerApi, AutoTakesAQualityAndReportsItsChoice) {
  json b = basic_chat();
  b["fusion"] = {{"method", "auto"}, {"quality", 0.95}};
  const CompletionRequest r = chat(b).request;
  EXPECT_EQ(r.fusion.options.method, "auto");
  EXPECT_DOUBLE_EQ(r.fusion.options.quality, 0.95);
  b["fusion"]["quality"] = 1;  // the bound is inclusive at 1 (full prefill always reaches it)
  EXPECT_DOUBLE_EQ(chat(b).request.fusion.options.quality, 1.0);
  CompletionResult res = sample_result();
  EXPECT_FALSE(api::completion_response({"c", 1, "m", true}, res)["chunkfuse"].contains("auto"));
  res.auto_choice = {{"method", "prophet"}, {"ratio", 0.15}, {"predicted_quality", 0.97}, {"decision_ms", 3.0}};
  EXPECT_EQ(api::completion_response({"c", 1, "m", true}, res)["chunkfuse"]["auto"]["method"], "prophet");
  // A stream's last chunk carries the choice whether or not usage was asked for (issue 60 item 4).
  EXPECT_EQ(api::stream_finish_chunk({"c", 1, "m", true}, res)["chunkfuse"]["auto"]["method"], "prophet");
  EXPECT_FALSE(api::stream_finish_chunk({"c", 1, "m", true}, sample_result()).contains("chunkfuse"));
}

// fusion.ttft_ms (issue 60 item 1): auto's first-token budget, alone or with a quality; for
// auto only; a server's default budget is not inherited by a request naming another method.
TEST(ServerApi, TtftBudgetIsAnAutoField) {
  PlanLimits limits;
  limits.context_length = limits.max_prompt_tokens = 1024;
  json b = basic_chat();
  b["fusion"] = {{"method", "auto"}, {"ttft_ms", 150}};
  CompletionRequest r = chat(b).request;
  EXPECT_DOUBLE_EQ(r.fusion.options.ttft_ms, 150);
  EXPECT_DOUBLE_EQ(r.fusion.options.quality, 0);
  EXPECT_NO_THROW(validate_request(r, limits));
  b["fusion"]["quality"] = 0.9;
  EXPECT_NO_THROW(validate_request(chat(b).request, limits));
  b["fusion"] = {{"method", "epic"}, {"ttft_ms", 150}};
  EXPECT_EQ(refusal(b).param, "fusion.ttft_ms");
  b["fusion"] = {{"method", "auto"}, {"ttft_ms", -1}};
  EXPECT_EQ(refusal(b).status, 400);
  EXPECT_EQ(refusal(b).param, "fusion.ttft_ms");
  b["fusion"] = {{"method", "auto"}, {"ttft_ms", "fast"}};
  EXPECT_EQ(refusal(b).param, "fusion.ttft_ms");
  b["fusion"] = {{"method", "auto"}, {"ttft_ms", 0}};  // neither a target nor a budget
  EXPECT_EQ(refusal(b).param, "fusion.quality");
  const FusionOptions server{.method = "auto", .ttft_ms = 200};
  b.erase("fusion");
  EXPECT_DOUBLE_EQ(api::parse_completion(b, true, server).request.fusion.options.ttft_ms, 200);
  b["fusion"] = {{"method", "epic"}};
  r = api::parse_completion(b, true, server).request;
  EXPECT_DOUBLE_EQ(r.fusion.options.ttft_ms, 0);
  EXPECT_NO_THROW(validate_request(r, limits));
}

// serve --quality (issue 60 item 4): a request without fusion fields gets the auto policy at the
// server's target; one naming another method drops that target, so it is not refused for it;
// one naming auto with a quality of its own keeps its own.
TEST(ServerApi, ServerQualityIsTheDefaultOfRequestsThatNameNoMethod) {
  const FusionOptions server{.method = "auto", .ratio = 0.15, .quality = 0.8};
  json b = basic_chat();
  const CompletionRequest plain = api::parse_completion(b, true, server).request;
  EXPECT_EQ(plain.fusion.options.method, "auto");
  EXPECT_DOUBLE_EQ(plain.fusion.options.quality, 0.8);
  PlanLimits limits;
  limits.context_length = limits.max_prompt_tokens = 1024;
  EXPECT_NO_THROW(validate_request(plain, limits));
  b["fusion"] = {{"method", "epic"}};
  const CompletionRequest epic = api::parse_completion(b, true, server).request;
  EXPECT_EQ(epic.fusion.options.method, "epic");
  EXPECT_DOUBLE_EQ(epic.fusion.options.quality, 0.0);
  EXPECT_NO_THROW(validate_request(epic, limits));
  b["fusion"] = {{"method", "auto"}, {"quality", 0.6}};
  EXPECT_DOUBLE_EQ(api::parse_completion(b, true, server).request.fusion.options.quality, 0.6);
  b["fusion"] = {{"reorder", true}};  // fusion fields that name no method keep the default
  EXPECT_DOUBLE_EQ(api::parse_completion(b, true, server).request.fusion.options.quality, 0.8);
}

TEST(ServerApi, ChatResponseHasOpenAIShapeAndTheExtension) {
  const api::ResponseMeta meta{"chatcmpl-1", 1700000000, "smol", true};
  const json j = api::completion_response(meta, sample_result());
  EXPECT_EQ(j["id"], "chatcmpl-1");
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["created"], 1700000000);
  EXPECT_EQ(j["model"], "smol");
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Paris.");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 100);
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  EXPECT_EQ(j["usage"]["total_tokens"], 103);
  // The tokens whose K/V was reused (token_accounting.h), not every token the prompt's forward
  // pass skipped (100 - 30 = 70: the missed chunk's 12 tokens were computed for this request).
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 58);
  EXPECT_EQ(j["chunkfuse"]["recomputed_tokens"], 12);
  EXPECT_EQ(j["chunkfuse"]["chunk_order"], json({"c1", "c2", "c3"}));
  EXPECT_DOUBLE_EQ(j["chunkfuse"]["timings_ms"]["ttft"].get<double>(), 42.5);
}

TEST(ServerApi, CompletionResponseCarriesText) {
  const api::ResponseMeta meta{"cmpl-1", 1, "smol", false};
  const json j = api::completion_response(meta, sample_result());
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "Paris.");
  EXPECT_FALSE(j["choices"][0].contains("message"));
}

TEST(ServerApi, StreamChunksFollowOpenAI) {
  const api::ResponseMeta meta{"chatcmpl-2", 1, "smol", true};
  const json first = api::stream_role_chunk(meta);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  const json piece = api::stream_text_chunk(meta, " Par");
  EXPECT_EQ(piece["choices"][0]["delta"]["content"], " Par");
  EXPECT_FALSE(piece["choices"][0]["delta"].contains("role"));
  CompletionResult stopped = sample_result();
  stopped.finish_reason = "length";
  const json last = api::stream_finish_chunk(meta, stopped);
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  const json usage = api::stream_usage_chunk(meta, sample_result());
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 103);
  EXPECT_EQ(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 58);  // the same usage object as the response's

  const api::ResponseMeta text_meta{"cmpl-2", 1, "smol", false};
  EXPECT_EQ(api::stream_text_chunk(text_meta, "x")["object"], "text_completion");
  EXPECT_EQ(api::stream_text_chunk(text_meta, "x")["choices"][0]["text"], "x");
}

TEST(ServerApi, SseEventIsOneDataLine) {
  const std::string ev = api::sse_event(json{{"a", "line1\nline2"}});
  EXPECT_EQ(ev, "data: {\"a\":\"line1\\nline2\"}\n\n");  // newlines escaped: one event, one line
}

TEST(ServerApi, DumpSurvivesASplitUtf8Character) {
  // "é" is C3 A9; a piece that ends after C3 must not throw.
  const std::string out = api::dump(json{{"t", std::string("caf\xC3")}});
  EXPECT_NE(out.find("caf"), std::string::npos);
  EXPECT_TRUE(json::accept(out));
}

TEST(ServerApi, ErrorBodyHasOpenAIFields) {
  const json j = api::error_body(RequestError(404, "not_found_error", "no chunk 'x'", "documents[0].id"));
  EXPECT_EQ(j["error"]["message"], "no chunk 'x'");
  EXPECT_EQ(j["error"]["type"], "not_found_error");
  EXPECT_EQ(j["error"]["param"], "documents[0].id");
  EXPECT_TRUE(j["error"].contains("code"));
  EXPECT_TRUE(api::error_body(400, "invalid_request_error", "bad")["error"]["param"].is_null());
}

// `name value` or `name{key="v"} value` (the exposition format's sample line, one label at
// most as ours have): {name, value}, or nullopt when the line is not of that shape.
std::optional<std::pair<std::string, std::string>> parse_prometheus_sample(const std::string& line) {
  size_t i = 0;
  while (i < line.size() && ((line[i] >= 'a' && line[i] <= 'z') || line[i] == '_')) ++i;
  if (i == 0) return std::nullopt;
  const std::string name = line.substr(0, i);
  if (i < line.size() && line[i] == '{') {
    const size_t close = line.find('}', i);
    if (close == std::string::npos) return std::nullopt;
    const std::string label = line.substr(i + 1, close - i - 1);
    const size_t eq = label.find("=\"");
    if (eq == std::string::npos || eq == 0 || label.size() < eq + 3 || label.back() != '"') return std::nullopt;
    for (size_t c = 0; c < eq; ++c)
      if (label[c] < 'a' || label[c] > 'z') return std::nullopt;
    i = close + 1;
  }
  if (i >= line.size() || line[i] != ' ') return std::nullopt;
  const std::string value = line.substr(i + 1);
  if (value.empty() || value.find_first_of(" \t") != std::string::npos) return std::nullopt;
  return std::make_pair(name, value);
}

// GET /v1/methods (the web page's method list): every method a request may name, with its
// parameters as the selector describes them, and serve --method as the default.
TEST(ServerApi, MethodsListTheRegistryWithParameters) {
  FusionOptions defaults;
  defaults.method = "qcfuse";
  const json j = api::methods_json(defaults);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["default"], "qcfuse");
  EXPECT_EQ(j["defaults"], (json{{"method", "qcfuse"}, {"ratio", 0.15}, {"fusion_method", "epic"}}));
  defaults.method = "auto";
  defaults.quality = 0.8;
  EXPECT_EQ(api::methods_json(defaults)["defaults"],
            (json{{"method", "auto"}, {"ratio", 0.15}, {"quality", 0.8}, {"fusion_method", "epic"}}));
  std::vector<std::string> ids;
  for (const auto& m : j["data"]) {
    ids.push_back(m["id"]);
    EXPECT_EQ(m["object"], "method");
    EXPECT_TRUE(m["parameters"].is_array());
  }
  std::vector<std::string> expected{"full"};
  for (const auto& n : selector_names()) expected.push_back(n);
  expected.push_back("auto");  // issue 26: quality on demand, listed last with its "fields"
  EXPECT_EQ(ids, expected);
  const auto qc = std::find_if(j["data"].begin(), j["data"].end(), [](const json& m) { return m["id"] == "qcfuse"; });
  ASSERT_NE(qc, j["data"].end());
  bool probe_rows = false;
  for (const auto& p : (*qc)["parameters"])
    if (p["name"] == "probe_rows") probe_rows = p["values"] == json({"question", "suffix"}) && p["default"] == "question";
  EXPECT_TRUE(probe_rows) << qc->dump();
}

TEST(ServerApi, PrometheusTextIsWellFormed) {
  EngineMetrics m;
  m.requests = 10;
  m.errors = 1;
  m.chunk_hits = 3;
  m.chunk_misses = 1;
  m.prompt_tokens = 200;
  m.prefix_hit_tokens = 50;
  m.queue_length = 2;
  m.store_memory_bytes = 1024;
  m.store_disk_bytes = 4096;
  m.ttft_bucket_bounds_ms = {10, 100, 1000};
  m.ttft_bucket_counts = {1, 4, 6, 7};
  m.ttft_sum_ms = 2500;
  m.ttft_count = 7;
  const std::string text = api::prometheus_text(m, api::HttpCounters{9, 2, 0, 1});

  // Every line is a comment or `name{labels} value`; every sample's family has a TYPE.
  std::istringstream in(text);
  std::string line;
  std::set<std::string> typed;
  size_t samples = 0;
  while (std::getline(in, line)) {
    if (line.rfind("# TYPE ", 0) == 0) {
      typed.insert(line.substr(7, line.find(' ', 7) - 7));
      continue;
    }
    if (line.rfind("# HELP ", 0) == 0) continue;
    const auto sample = parse_prometheus_sample(line);
    ASSERT_TRUE(sample.has_value()) << line;
    std::string family = sample->first;
    for (const char* suffix : {"_bucket", "_sum", "_count"})
      if (!typed.count(family) && family.size() > std::strlen(suffix) &&
          family.compare(family.size() - std::strlen(suffix), std::string::npos, suffix) == 0)
        family.resize(family.size() - std::strlen(suffix));
    EXPECT_TRUE(typed.count(family)) << "no TYPE for " << line;
    EXPECT_NO_THROW((void)std::stod(sample->second == "+Inf" ? std::string("0") : sample->second)) << line;
    ++samples;
  }
  EXPECT_GT(samples, 15u);
  EXPECT_NE(text.find("# TYPE chunkfuse_ttft_seconds histogram"), std::string::npos);
  EXPECT_NE(text.find("chunkfuse_ttft_seconds_bucket{le=\"0.1\"} 4\n"), std::string::npos);
  EXPECT_NE(text.find("chunkfuse_ttft_seconds_bucket{le=\"+Inf\"} 7\n"), std::string::npos);
  EXPECT_NE(text.find("chunkfuse_ttft_seconds_sum 2.5\n"), std::string::npos);
  EXPECT_NE(text.find("chunkfuse_ttft_seconds_count 7\n"), std::string::npos);
  EXPECT_NE(text.find("chunkfuse_requests_total 10\n"), std::string::npos);
  EXPECT_NE(text.find("chunkfuse_chunk_hit_ratio 0.75\n"), std::string::npos);
  EXPECT_NE(text.find("chunkfuse_prefix_hit_ratio 0.25\n"), std::string::npos);
  EXPECT_NE(text.find("chunkfuse_store_bytes{tier=\"disk\"} 4096\n"), std::string::npos);
  EXPECT_NE(text.find("chunkfuse_queue_length 2\n"), std::string::npos);
  EXPECT_NE(text.find("chunkfuse_http_responses_total{code=\"4xx\"} 2\n"), std::string::npos);
}

}  // namespace
}  // namespace cf
