// libFuzzer target over whole HTTP requests (issue 29): the real `chunkfuse serve` route
// table (HttpServer over the real SmolLM2 model, on a loopback port of its own) receives
// each input as one request from a real HTTP client. The first byte picks a route, the rest
// is the body (POST) or the path's last segment (GET/DELETE). The server must answer every
// request with a status below 500 and stay up: a crash of any server thread, a sanitizer
// report or a 5xx is a finding. This is the target that would have found the deep-JSON crash
// of issue 29, item 1 (a 400 KB body nesting 200,000 levels under fusion.options).
//
// Generation is kept cheap so that valid requests do not dominate: prompts are capped at 96
// tokens and answers at 2 (--max-prompt-tokens, --max-completion-tokens). Model: the tests'
// SmolLM2-135M file ($CHUNKFUSE_FUZZ_MODEL overrides), as scripts/setup.sh installs it, not
// the engine's default 0.5B: a 2-token chat on that took 35 s here (the fuzzer's hang limit
// is 10 s; CI failed on it when the default changed).
#include <httplib.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "base/paths.h"
#include "serve/engine.h"
#include "serve/server.h"

namespace {

struct Route {
  const char* method;
  const char* path;  // POST: the path; GET/DELETE: the prefix the input's text is appended to
};

constexpr Route kRoutes[] = {
    {"POST", "/v1/chat/completions"}, {"POST", "/v1/completions"}, {"POST", "/v1/chunks"},
    {"POST", "/v1/documents"},        {"POST", "/v1/retrieve"},    {"GET", "/v1/chunks/"},
    {"DELETE", "/v1/chunks/"},        {"GET", "/v1/details/"},     {"GET", "/v1/documents/"},
    {"DELETE", "/v1/documents/"},     {"DELETE", "/v1/knowledge/chunks/"}, {"GET", "/v1/models/"},
};
constexpr size_t kRouteCount = sizeof(kRoutes) / sizeof(kRoutes[0]);

struct Harness {
  std::unique_ptr<cf::Engine> engine;
  std::unique_ptr<cf::HttpServer> server;
  std::thread listener;
  std::unique_ptr<httplib::Client> client;

  Harness() {
    cf::EngineOptions eo;
    const char* model = std::getenv("CHUNKFUSE_FUZZ_MODEL");
    eo.model_path = model && *model ? model : cf::cache_root() + "/models/" + cf::kTestModelFile;
    eo.threads = 1;
    eo.max_prompt_tokens = 96;
    eo.max_documents = 8;
    eo.chunk_memory_bytes = size_t{64} << 20;
    eo.prefix_cache_bytes = size_t{16} << 20;
    char dir[] = "/tmp/chunkfuse-http-fuzz-XXXXXX";
    if (!mkdtemp(dir)) std::abort();
    eo.cache_dir = std::string(dir) + "/store";
    engine = std::make_unique<cf::Engine>(eo);
    cf::HttpServerOptions ho;
    ho.port = 0;
    ho.max_body_bytes = size_t{1} << 20;
    ho.max_completion_tokens = 2;
    server = std::make_unique<cf::HttpServer>(*engine, ho);
    const int port = server->bind();
    listener = std::thread([this] { server->listen(); });
    client = std::make_unique<httplib::Client>("127.0.0.1", port);
    client->set_read_timeout(30, 0);
    client->set_keep_alive(true);
  }
};

Harness& harness() {
  static Harness* h = new Harness();  // never destroyed: the fuzzer exits with the server up
  return *h;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)harness();  // load the model once, before the first input
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Harness& h = harness();
  const Route& r = kRoutes[data[0] % kRouteCount];
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  auto send = [&]() -> httplib::Result {
    if (std::string(r.method) == "POST") return h.client->Post(r.path, text, "application/json");
    // The last path segment, percent-encoded so that every byte reaches the router.
    std::string path = r.path;
    static constexpr char kHex[] = "0123456789ABCDEF";
    for (unsigned char c : text.substr(0, 256)) {
      path += '%';
      path += kHex[c >> 4];
      path += kHex[c & 15];
    }
    return std::string(r.method) == "GET" ? h.client->Get(path) : h.client->Delete(path);
  };
  const httplib::Result res = send();
  if (!res) {
    std::fprintf(stderr, "http_request_fuzz: no answer to %s %s (%s)\n", r.method, r.path,
                 httplib::to_string(res.error()).c_str());
    std::abort();
  }
  if (res->status >= 500) {
    std::fprintf(stderr, "http_request_fuzz: %d from %s %s: %s\n", res->status, r.method, r.path,
                 res->body.substr(0, 400).c_str());
    std::abort();
  }
  return 0;
}
