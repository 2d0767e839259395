// The HTTP hardening pieces without a socket (issue 17): API keys and CORS on httplib's
// request/response objects, the byte bound before tokenizing. The real server under
// hostile clients is tests/serve_e2e/test_hostile.py.
#include <gtest/gtest.h>

#include "serve/http_access.h"
#include "serve/key_isolation.h"
#include "serve/request_limits.h"

namespace cf {
namespace {

httplib::Request request(const std::string& method, const std::string& path,
                         std::initializer_list<std::pair<std::string, std::string>> headers = {}) {
  httplib::Request r;
  r.method = method;
  r.path = path;
  for (const auto& [k, v] : headers) r.headers.emplace(k, v);
  return r;
}

TEST(AccessPolicy, OpenWithoutKeys) {
  AccessPolicy p(AccessOptions{});
  httplib::Response res;
  EXPECT_FALSE(p.pre_route(request("POST", "/v1/chat/completions"), res));
  EXPECT_FALSE(res.has_header("Access-Control-Allow-Origin"));
}

TEST(AccessPolicy, BearerKeysExceptHealth) {
  AccessOptions o;
  o.api_keys = {"sk-one", "sk-two"};
  AccessPolicy p(o);
  auto answered = [&](const httplib::Request& r, int* status = nullptr) {
    httplib::Response res;
    const bool a = p.pre_route(r, res);
    if (status) *status = res.status;
    return a;
  };
  int status = 0;
  EXPECT_TRUE(answered(request("GET", "/v1/models"), &status));
  EXPECT_EQ(status, 401);
  EXPECT_TRUE(answered(request("GET", "/v1/models", {{"Authorization", "Bearer sk-on"}})));
  EXPECT_TRUE(answered(request("GET", "/v1/models", {{"Authorization", "Basic sk-one"}})));
  EXPECT_TRUE(answered(request("GET", "/v1/models", {{"Authorization", "Bearer sk-one2"}})));
  EXPECT_FALSE(answered(request("GET", "/v1/models", {{"Authorization", "Bearer sk-one"}})));
  EXPECT_FALSE(answered(request("GET", "/v1/models", {{"Authorization", "bearer  sk-two "}})));
  EXPECT_FALSE(answered(request("GET", "/health")));
  EXPECT_TRUE(answered(request("GET", "/metrics")));  // guarded unless metrics_public
  EXPECT_EQ(p.unauthorized(), 5u);

  httplib::Response res;
  ASSERT_TRUE(p.pre_route(request("POST", "/v1/chat/completions"), res));
  const auto body = nlohmann::json::parse(res.body);
  EXPECT_EQ(body["error"]["code"], "invalid_api_key");
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_EQ(res.get_header_value("WWW-Authenticate"), "Bearer");

  o.metrics_public = true;
  AccessPolicy pub(o);
  httplib::Response r2;
  EXPECT_FALSE(pub.pre_route(request("GET", "/metrics"), r2));
  EXPECT_THROW(AccessPolicy(AccessOptions{{" "}, false, {}, {}}), std::invalid_argument);
}

TEST(AccessPolicy, CorsOnlyForListedOrigins) {
  AccessOptions o;
  o.cors_origins = {"https://app.example"};
  o.api_keys = {"sk-one"};
  AccessPolicy p(o);
  httplib::Response pre;
  // Preflights carry no credentials: answered before the key check.
  EXPECT_TRUE(p.pre_route(request("OPTIONS", "/v1/chat/completions", {{"Origin", "https://app.example"}}), pre));
  EXPECT_EQ(pre.status, 204);
  EXPECT_EQ(pre.get_header_value("Access-Control-Allow-Origin"), "https://app.example");
  httplib::Response evil;
  EXPECT_TRUE(p.pre_route(request("OPTIONS", "/v1/chat/completions", {{"Origin", "https://evil.example"}}), evil));
  EXPECT_EQ(evil.status, 401);  // not a preflight we answer: it needs a key like anything else
  EXPECT_FALSE(evil.has_header("Access-Control-Allow-Origin"));
}

TEST(AccessPolicy, JsonOnlyPosts) {
  EXPECT_NO_THROW(require_json_content(request("POST", "/x", {{"Content-Type", "application/json"}})));
  EXPECT_NO_THROW(require_json_content(request("POST", "/x", {{"Content-Type", "Application/JSON; charset=utf-8"}})));
  for (const char* ct : {"text/plain", "application/x-www-form-urlencoded", "multipart/form-data", "",
                         "application/jsonp", "application/json-patch+json"}) {
    try {
      require_json_content(request("POST", "/x", {{"Content-Type", ct}}));
      ADD_FAILURE() << ct << " accepted";
    } catch (const RequestError& e) {
      EXPECT_EQ(e.status, 415) << ct;
    }
  }
}

TEST(RequestLimits, BytesThatCannotFitAreRefusedBeforeTokenizing) {
  const InputBound b{100, 8};  // at most 800 bytes of text
  CompletionRequest ok;
  ok.messages = {{"user", std::string(400, 'a')}};
  ok.documents = {{std::string(399, 'b'), ""}};
  EXPECT_NO_THROW(check_input_size(ok, b));

  CompletionRequest too_long = ok;
  too_long.documents.push_back({std::string(2, 'c'), ""});
  try {
    check_input_size(too_long, b);
    ADD_FAILURE() << "801 bytes accepted";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.status, 413);
    EXPECT_EQ(e.param, "documents");
  }
  // A conversation may drop repeated documents (CRAFT), so each is bounded on its own.
  too_long.fusion.conversation_id = "c1";
  EXPECT_NO_THROW(check_input_size(too_long, b));
  too_long.documents.push_back({std::string(801, 'd'), ""});
  EXPECT_THROW(check_input_size(too_long, b), RequestError);

  CompletionRequest completion;
  completion.chat = false;
  completion.prompt = std::string(801, 'p');
  EXPECT_THROW(check_input_size(completion, b), RequestError);
  EXPECT_NO_THROW(check_chunk_texts_size({std::string(800, 'x')}, b));
  EXPECT_THROW(check_chunk_texts_size({"short", std::string(801, 'x')}, b), RequestError);
}

TEST(KeyIsolation, OwnershipAndRedaction) {
  KeyIsolation iso(true);
  iso.note_registered(0, {"aa", "bb"});
  iso.note_registered(1, {"bb"});
  EXPECT_TRUE(iso.owns(0, "aa"));
  EXPECT_FALSE(iso.owns(1, "aa"));
  bool was_owner = false;
  EXPECT_FALSE(iso.release(1, "aa", was_owner));
  EXPECT_FALSE(was_owner);
  EXPECT_FALSE(iso.release(0, "bb", was_owner));  // key 1 still holds it
  EXPECT_TRUE(was_owner);
  EXPECT_TRUE(iso.release(1, "bb", was_owner));   // the last holder
  CompletionRequest req;
  req.documents = {{"inline text", ""}, {"", "aa"}};
  EXPECT_NO_THROW(iso.check_documents(0, req));
  EXPECT_THROW(iso.check_documents(1, req), RequestError);

  nlohmann::json r = {{"usage", {{"prompt_tokens", 9}, {"prompt_tokens_details", {{"cached_tokens", 7}}}}},
                      {"chunkfuse", {{"chunk_hits", 1}, {"prefix_hit_tokens", 7}, {"prompt_tokens", 9},
                                     {"timings_ms", {{"load", 1.0}, {"ttft", 5.0}}}}}};
  KeyIsolation::redact(r);
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_FALSE(r["chunkfuse"].contains("chunk_hits"));
  EXPECT_FALSE(r["chunkfuse"].contains("prefix_hit_tokens"));
  EXPECT_FALSE(r["chunkfuse"]["timings_ms"].contains("load"));
  EXPECT_EQ(r["chunkfuse"]["prompt_tokens"], 9);
  // The auto policy's view of the shared store (issue 60 item 2) is a cache figure too.
  nlohmann::json a = {{"chunkfuse", {{"auto", {{"method", "full"}, {"cold_chunks", 2}, {"cold_tokens", 90},
                                               {"price_rows", {{"full", 100}, {"ladder", 120}}}}}}}};
  KeyIsolation::redact(a);
  EXPECT_EQ(a["chunkfuse"]["auto"], nlohmann::json({{"method", "full"}}));
}

TEST(AccessPolicy, MatchedKeyIsTheKeysIndex) {
  AccessOptions o;
  o.api_keys = {"sk-one", "sk-two"};
  AccessPolicy p(o);
  EXPECT_EQ(p.matched_key(request("GET", "/", {{"Authorization", "Bearer sk-two"}})), 1);
  EXPECT_EQ(p.matched_key(request("GET", "/", {{"Authorization", "Bearer sk-one"}})), 0);
  EXPECT_EQ(p.matched_key(request("GET", "/", {{"Authorization", "Bearer nope"}})), -1);
  EXPECT_EQ(p.matched_key(request("GET", "/")), -1);
}

}  // namespace
}  // namespace cf
