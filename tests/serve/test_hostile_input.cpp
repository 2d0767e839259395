// Holes a security review of the serving path found (issue 29), closed at the level of the
// functions that parse what a client sends; tests/serve_e2e/test_hostile_requests.py sends
// the same probes to the real server over HTTP. The upload bounds (items 1 and 2) are in
// test_knowledge_base.cpp, DocumentText.TextIsBoundedInEveryFormat.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "model/gguf.h"
#include "model/tokenizer.h"
#include "serve/http_access.h"
#include "serve/request_limits.h"
#include "test_support.h"
#include "serve/knowledge_base_file.h"
#include "serve/api_json.h"
#include "serve/request_plan.h"

namespace cf {
namespace {

std::string nested(size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

// Item 1: the body that killed the server (SIGSEGV) is a 400 before anything copies it.
TEST(HostileInput, DeepJsonBodyIsRefusedBeforeItIsCopied) {
  const std::string body =
      R"({"messages": [{"role": "user", "content": "hi"}], "fusion": {"method": "nope", "options": {"a": )" +
      nested(200000) + "}}}";
  try {
    (void)api::parse_body(body);
    FAIL() << "a 200,000-deep body parsed";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(std::string(e.what()).find("deeper than 64"), std::string::npos) << e.what();
  }
  // Every route's body goes through parse_body; a merely deep (but allowed) one still works,
  // and a QCFuse option error quotes at most a short excerpt of the offending value.
  const nlohmann::json ok = api::parse_body(R"({"messages": [{"role": "user", "content": "hi"}],
      "fusion": {"method": "qcfuse", "options": {"threshold": )" + nested(60) + "}}}");
  try {
    PlanLimits limits;  // the engine's check of what the method accepts, after the parser's
    limits.context_length = limits.max_prompt_tokens = 1024;
    validate_request(api::parse_completion(ok, true).request, limits);
    FAIL() << "a list as the threshold was accepted";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_LT(std::string(e.what()).size(), 300u) << e.what();
  }
}

// The saved knowledge base goes through the same bound, refused as any damaged file is
// (knowledge_base_file_fuzz found it escaping as another exception type at first).
// Issue 59: the byte bound before tokenizing comes from decoded pieces. On Qwen's byte-level
// BPE the vocabulary strings (2 bytes a byte) made it 256 bytes a token, so a 7.5 MB one-word
// prompt at --max-prompt-tokens 32768 passed the bound and was tokenized in full (937,529
// tokens, 3.3 s) before its 413; the bound itself must never refuse text that fits.
TEST(HostileInput, ByteBoundComesFromDecodedPiecesAndRefusesBeforeTokenizing) {
  CF_REQUIRE_QWEN05();
  const auto file = GgufFile::open(test::qwen05_model_path());
  const auto tok = Tokenizer::from_gguf(*file);
  const InputBound b = input_bound(*tok, 32768);
  size_t longest_piece = 0;
  for (size_t i = 0; i < tok->vocab_size(); ++i)
    longest_piece = std::max(longest_piece, tok->token_to_piece(static_cast<TokenId>(i), true).size());
  EXPECT_EQ(b.longest_token_bytes, longest_piece);
  std::printf("Qwen 0.5B byte bound: %zu bytes a token, %zu bytes at 32768 tokens\n", b.longest_token_bytes,
              b.max_text_bytes());
  EXPECT_LT(b.max_text_bytes(), size_t{7500000}) << "a 7.5 MB prompt would be tokenized before its 413";
  CompletionRequest req;
  req.chat = false;
  req.prompt = std::string(7500000, 'a');
  const auto t0 = std::chrono::steady_clock::now();
  try {
    check_input_size(req, b);
    FAIL() << "a 7.5 MB prompt passed the byte bound";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.status, 413);
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.5);
  // Never refuses what fits: the longest piece, repeated max_prompt_tokens times, is exactly
  // at the bound and passes.
  req.prompt = std::string(b.max_text_bytes(), 'x');
  EXPECT_NO_THROW(check_input_size(req, b));
}

TEST(HostileInput, DeepKnowledgeBaseFileIsADamagedFile) {
  EXPECT_THROW(parse_knowledge_base_file("{\"version\": " + nested(1000) + "}", {10, 10}), std::runtime_error);
}

// Item 3: without keys, only IP literals, localhost and the listed names reach the server.
TEST(HostileInput, HostCheckAgainstDnsRebinding) {
  const std::vector<std::string> none;
  for (const char* h : {"127.0.0.1", "127.0.0.1:8080", "10.1.2.3:80", "[::1]:8080", "[::1]", "localhost",
                        "LOCALHOST:8080", "localhost.", "app.localhost:3000"})
    EXPECT_TRUE(host_allowed(h, none)) << h;
  for (const char* h : {"rebind.example.com", "rebind.example.com:8080", "127.0.0.1.nip.io", "localhost.evil.com",
                        "evillocalhost", "[::1", "", "[zz]:80"})
    EXPECT_FALSE(host_allowed(h, none)) << h;
  EXPECT_TRUE(host_allowed("Chat.Example.ORG:8443", {"chat.example.org"}));
  EXPECT_FALSE(host_allowed("other.example.org", {"chat.example.org"}));
  EXPECT_TRUE(host_allowed("anything.example", {"*"}));
}

TEST(HostileInput, HostCheckRunsBeforeRoutingWithoutKeysOnly) {
  auto request = [](const std::string& host) {
    httplib::Request r;
    r.method = "GET";
    r.path = "/v1/documents";
    r.headers.emplace("Host", host);
    return r;
  };
  AccessPolicy open(AccessOptions{});
  httplib::Response res;
  EXPECT_TRUE(open.pre_route(request("rebind.example.com"), res, /*needs_key=*/false));
  EXPECT_EQ(res.status, 403);
  EXPECT_NE(res.body.find("host_not_allowed"), std::string::npos) << res.body;
  httplib::Response ok;
  EXPECT_FALSE(open.pre_route(request("127.0.0.1:8080"), ok));
  // With keys a rebinding page holds none: the key check decides, whatever the Host.
  AccessOptions keyed;
  keyed.api_keys = {"k"};
  AccessPolicy with_keys(keyed);
  httplib::Response r401;
  EXPECT_TRUE(with_keys.pre_route(request("rebind.example.com"), r401));
  EXPECT_EQ(r401.status, 401);
}

// Item 6: under --isolate-keys /metrics leaves out every series that moves with a cache hit.
TEST(HostileInput, MetricsWithoutCacheUseSeries) {
  EngineMetrics m;
  m.chunk_hits = 3;
  m.prompt_tokens = 10;
  m.store.has_remote = true;
  const std::string full = api::prometheus_text(m, api::HttpCounters{});
  const std::string isolated = api::prometheus_text(m, api::HttpCounters{}, /*cache_use=*/false);
  for (const char* series : {"chunkfuse_chunk_hits_total", "chunkfuse_prefilled_tokens_total",
                             "chunkfuse_prefix_hit_tokens_total", "chunkfuse_cached_tokens_total", "chunkfuse_store_bytes", "chunkfuse_store_hits_total",
                             "chunkfuse_remote_hits_total", "chunkfuse_prefix_cache_bytes"}) {
    EXPECT_NE(full.find(series), std::string::npos) << series;
    EXPECT_EQ(isolated.find(series), std::string::npos) << series;
  }
  EXPECT_NE(isolated.find("chunkfuse_prompt_tokens_total 10"), std::string::npos);
  EXPECT_NE(isolated.find("chunkfuse_ttft_seconds_count"), std::string::npos);
}

}  // namespace
}  // namespace cf
