// `chunkfuse serve`: the OpenAI-compatible RAG server (issue 5). Loads the engine, serves
// HTTP until SIGINT/SIGTERM, then stops accepting, lets in-flight requests finish and exits 0.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <thread>

#include "apps/app_common.h"
#include "apps/remote_options.h"
#include "base/clock.h"
#include "base/paths.h"
#include "fusion/methods.h"
#include "fusion/select_cachecraft.h"
#include "serve/engine.h"
#include "serve/server.h"

namespace cf::apps {
namespace {

struct ServeArgs {
  ModelOptions model;
  EngineOptions engine;
  HttpServerOptions http;
  std::vector<std::string> api_key_files;
  RemoteArgs remote;
  std::string chunk_context = "alone";
  bool method_given = false;
  double quality = 0;  // serve --quality: the auto policy for requests that name no method
  bool quality_given = false;
  double ttft_ms = 0;  // serve --ttft-ms: its first-token budget
  bool ttft_given = false;
  double self_check = 0.2;  // serve --self-check: the share of fused answers checked when idle
  std::string itl_target = "auto";  // serve --itl-target-ms: auto | 0 (off) | milliseconds
};

// serve --itl-target-ms: "auto" (3x a decode step), 0 (pieces of --prefill-chunk rows) or ms.
double parse_itl_target(const std::string& text) {
  if (text == "auto") return PrefillPieceSizer::kAuto;
  const double ms = parse_number(text).value_or(-1);
  if (!(ms >= 0 && ms <= 3.6e6))
    throw std::invalid_argument("--itl-target-ms must be auto, 0 (off) or milliseconds in [0, 3600000], got \"" +
                                text + "\"");
  return ms;
}

std::string number_text(double x) {
  char s[32];
  std::snprintf(s, sizeof s, "%g", x);
  return s;
}

// serve --quality q and --ttft-ms T make the auto policy (fusion/auto_quality.h) the default,
// at target q, within budget T, or both; checked here so that a bad value stops the server
// before the model loads.
void apply_default_auto(const ServeArgs& a, FusionOptions& fusion) {
  if (!a.quality_given && !a.ttft_given) {
    if (fusion.automatic())
      throw std::invalid_argument("--method " + auto_method_name() + " needs --quality q (the share in (0, 1] of "
                                  "answers identical to full prefill's) or --ttft-ms T");
    return;
  }
  if (a.quality_given && !(a.quality > 0 && a.quality <= 1))
    throw std::invalid_argument("--quality must be in (0, 1] (the share of answers identical to full prefill's), got " +
                                number_text(a.quality));
  if (a.ttft_given && !(a.ttft_ms > 0 && std::isfinite(a.ttft_ms)))
    throw std::invalid_argument("--ttft-ms must be a number of milliseconds > 0, got " + number_text(a.ttft_ms));
  if (a.method_given && !fusion.automatic())
    throw std::invalid_argument(std::string(a.quality_given ? "--quality" : "--ttft-ms") +
                                " is a setting of the auto policy: give --method " + auto_method_name() +
                                " or no --method, not --method " + fusion.method);
  fusion.method = auto_method_name();
  if (a.quality_given) fusion.quality = a.quality;
  if (a.ttft_given) fusion.ttft_ms = a.ttft_ms;
}

int run_serve(ServeArgs a) {
  a.engine.model_path = a.model.model_path;
  for (const auto& f : a.api_key_files)
    for (auto& k : read_api_key_file(f)) a.http.access.api_keys.push_back(std::move(k));
  a.engine.threads = a.model.threads;
  a.engine.remote = remote_tier_options(a.remote);
  FusionOptions& fusion = a.engine.default_fusion;
  apply_default_auto(a, fusion);
  if (!(a.self_check >= 0 && a.self_check <= 1))
    throw std::invalid_argument("--self-check must be a share in [0, 1] (of the served fused answers checked against "
                                "full prefill when idle; 0: off), got " + number_text(a.self_check));
  a.engine.self_check_share = a.self_check;
  a.engine.itl_target_ms = parse_itl_target(a.itl_target);
  if (a.http.max_key_chunk_texts > 0 && a.http.max_key_chunk_texts < a.engine.max_chunk_texts)
    throw std::invalid_argument("--max-key-chunk-texts " + std::to_string(a.http.max_key_chunk_texts) +
                                " is below --max-chunk-texts " + std::to_string(a.engine.max_chunk_texts) +
                                ": a request of that many texts could never be registered");
  if (a.http.match_chunks && fusion.full()) {
    if (a.method_given)
      throw std::invalid_argument("--match-chunks needs a fusion method: --method full would recompute every passage");
    fusion.method = default_fusion_method_name();
    std::fprintf(stderr, "chunkfuse serve: --match-chunks: fusion method %s at ratio %.2f\n", fusion.method.c_str(),
                 fusion.ratio);
  }
  parse_chunk_context(a.chunk_context, fusion.chunk_context);  // CLI11 checked the name
  validate_fusion_options(fusion, OptionsSource::trusted);  // an unknown --method fails now

  // Signals go to one watcher thread only: every thread started from here on (engine,
  // httplib's pool) inherits the blocked mask. SIGPIPE from a vanished client is ignored;
  // the write's error return is what we act on.
  signal(SIGPIPE, SIG_IGN);
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  if (!std::filesystem::exists(a.engine.model_path))
    throw std::runtime_error("model file not found: " + a.engine.model_path +
                             " (run scripts/setup.sh to fetch the default model, or pass -m)");
  std::fprintf(stderr, "chunkfuse serve: loading %s\n", a.engine.model_path.c_str());
  const double t0 = now_ms();
  Engine engine(a.engine);
  HttpServer server(engine, a.http);
  const int port = server.bind();
  std::fprintf(stderr,
               "chunkfuse serve: %s ready in %.0f ms; listening on http://%s:%d (at most %zu connections; %s)\n",
               engine.model_name().c_str(), now_ms() - t0, a.http.host.c_str(), port, a.http.connections.max_connections,
               a.http.access.api_keys.empty() ? "no API key required" : "API key required");
  std::fprintf(stderr, "chunkfuse serve: web page at http://%s:%d/ui/\n", a.http.host.c_str(), port);
  std::fflush(stderr);

  std::atomic<bool> listener_done{false};
  std::thread watcher([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    if (!listener_done) std::fprintf(stderr, "chunkfuse serve: signal %d, shutting down\n", sig);
    server.stop();
  });
  const bool ok = server.listen();
  // listen() also returns when the listener fails; wake the watcher so it can be joined.
  listener_done = true;
  pthread_kill(watcher.native_handle(), SIGTERM);
  watcher.join();
  std::fprintf(stderr, "chunkfuse serve: stopped\n");
  return ok ? 0 : 1;
}

}  // namespace

void add_serve_command(CLI::App& app, CommandRunner& run) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "serve", "OpenAI-compatible HTTP server with chunk-cache reuse (POST /v1/chat/completions, /v1/completions, "
               "/v1/chunks; GET /health, /metrics)");
  add_model_options(*cmd, a->model);
  cmd->add_option("--host", a->http.host, "address to listen on")->capture_default_str();
  cmd->add_option("--port", a->http.port, "TCP port (0: any free port, printed at start)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--max-connections,--http-threads", a->http.connections.max_connections,
                  "open HTTP connections (one thread each); more are answered 503 and closed")
      ->check(CLI::Range(size_t{1}, size_t{4096}))
      ->capture_default_str();
  cmd->add_option("--request-timeout", a->http.connections.request_timeout_s,
                  "seconds a request's line, headers and body may take to arrive, else the connection is closed")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  cmd->add_option("--keep-alive-timeout", a->http.connections.keep_alive_timeout_s,
                  "seconds an idle kept-alive connection waits for its next request")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  cmd->add_option("--api-key", a->http.access.api_keys,
                  "require 'Authorization: Bearer <key>' (repeatable; every route but GET /health)");
  cmd->add_option("--api-key-file", a->api_key_files, "file of API keys, one per line ('#' comments)")
      ->check(CLI::ExistingFile);
  add_store_key_option(*cmd, a->engine.store_key_file);
  cmd->add_flag("--isolate-keys", a->http.isolate_keys,
                "each API key sees only the chunks it registered, and no cache-hit figures (needs keys)");
  cmd->add_flag("--metrics-public", a->http.access.metrics_public, "serve GET /metrics without an API key");
  cmd->add_option("--cors-origin", a->http.access.cors_origins,
                  "origin allowed to call from a browser (repeatable; '*' for any); default: none");
  cmd->add_option("--allowed-host", a->http.access.allowed_hosts,
                  "without API keys, a Host name answered besides IP addresses and localhost (repeatable; '*' for "
                  "any): the guard against DNS rebinding");
  cmd->add_option("--cache-dir", a->engine.cache_dir, "chunk-cache store directory (default: <cache>/serve-store)");
  cmd->add_option("--mem-budget", a->engine.chunk_memory_bytes,
                  "memory tier of the chunk store at most, e.g. 512MiB, 1GiB; inside --kv-budget, whose requests "
                  "it gives room back to (demoting to the disk tier)")
      ->transform(CLI::AsSizeValue(false))
      ->default_str("all of --kv-budget (1GiB with --kv-budget 0)");
  cmd->add_option("--disk-budget", a->engine.chunk_disk_bytes,
                  "disk tier of the chunk store, e.g. 2GiB: past it, cache files are deleted, least valuable first "
                  "(0: unbounded)")
      ->transform(CLI::AsSizeValue(false))
      ->default_str("half the free space on the store's file system at start-up plus the store's own files, "
                    "16MiB to 10GiB");
  cmd->add_option("--kv-budget", a->engine.kv_budget_bytes,
                  "K/V bytes for the running requests (prompt + max_tokens each, reserved) and the cached K/V "
                  "(prefix cache, chunk store memory tier) together, e.g. 4GiB: the caches use what the requests "
                  "leave free and give it back (evicting; the memory tier demotes to disk) to admit a request; "
                  "past the requests' own reservations a request waits in the queue, one larger than all of it "
                  "gets 413 (0: unbounded)")
      ->transform(CLI::AsSizeValue(false))
      ->default_str("a quarter of the machine's memory");
  cmd->add_option("--prefix-cache-budget", a->engine.prefix_cache_bytes,
                  "K/V bytes of the exact prefix cache at most; inside --kv-budget, whose requests it gives room "
                  "back to")
      ->transform(CLI::AsSizeValue(false))
      ->default_str("all of --kv-budget (256MiB with --kv-budget 0)");
  cmd->add_option("--conversation-budget", a->engine.conversation_bytes,
                  "bytes of the kept conversation turns (fusion.conversation_id: texts and tokens), e.g. 512MiB; "
                  "past it the least recently used conversations are forgotten")
      ->transform(CLI::AsSizeValue(false))
      ->default_str("128MiB");
  cmd->add_option("--max-prompt-tokens", a->engine.max_prompt_tokens,
                  "longest prompt in tokens, else 413 (0: the model's context length)")
      ->capture_default_str();
  cmd->add_option("--max-queue", a->engine.max_queue, "waiting requests; more get 503")->capture_default_str();
  cmd->add_option("--max-tokenizing", a->engine.max_tokenizing,
                  "requests turning their text into tokens at once; the others wait --tokenize-wait-ms, then 503 "
                  "server_busy")
      ->default_str("2 x hardware threads");
  cmd->add_option("--tokenize-wait-ms", a->engine.tokenize_wait_ms, "wait for a tokenizing slot before 503 server_busy")
      ->capture_default_str();
  cmd->add_option("--max-batch", a->engine.max_batch, "requests decoding together")
      ->check(CLI::Range(size_t{1}, size_t{256}))
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", a->engine.prefill_chunk,
                  "prompt rows prefilled between two decode steps of the running requests, so that long "
                  "prompts do not stall answers being streamed (chunked prefill); 0: whole prefills")
      ->check(CLI::Range(size_t{0}, size_t{1} << 20))
      ->capture_default_str();
  cmd->add_option("--itl-target-ms", a->itl_target,
                  "while answers are streaming, size each prefill piece so that the gap between two of their "
                  "tokens stays near this many ms (at most --prefill-chunk rows, at least 16); auto: 3x the decode "
                  "step of the batch the requests in the server would form with no prefill arriving; 0: every "
                  "piece takes --prefill-chunk rows")
      ->capture_default_str();
  cmd->add_option("--schedule", a->engine.schedule,
                  "which waiting request prefills next: fifo (arrival), priority (a request's \"priority\", "
                  "lower first) or shortest (least prefill work first: fused before full)")
      ->check(CLI::IsMember({"fifo", "priority", "shortest"}))
      ->capture_default_str();
  cmd->add_option("--max-wait-ms", a->engine.max_wait_ms,
                  "under priority or shortest, a request that has waited this long goes first (no starvation)")
      ->capture_default_str();
  cmd->add_option("--max-documents", a->engine.max_documents, "documents per request")->capture_default_str();
  cmd->add_option("--max-chunk-texts", a->engine.max_chunk_texts,
                  "texts one POST /v1/chunks may register (each is a prefill; more: 413)")
      ->check(CLI::Range(size_t{1}, size_t{4096}))
      ->capture_default_str();
  cmd->add_option("--max-key-chunk-texts", a->http.max_key_chunk_texts,
                  "texts one API key may have registering at once over all its POST /v1/chunks (a server without "
                  "keys: all its clients together); a request past it: 429, retry later (default: --max-chunk-texts)")
      ->check(CLI::Range(size_t{1}, size_t{1} << 20));
  cmd->add_option("--registry-budget", a->engine.registry_budget_bytes,
                  "registered chunks (POST /v1/chunks, the knowledge base's): bytes of their texts and tokens kept in "
                  "memory together; a registration past it gets 409 (0: unbounded)")
      ->transform(CLI::AsSizeValue(false))
      ->default_str("512MiB");
  cmd->add_option("--max-variants", a->engine.max_variants,
                  "Cache-Craft variants per chunk a request may keep (fusion.options.max_variants above it: 400; "
                  "each is one more cache file per chunk, counted in --disk-budget; 0: none)")
      ->check(CLI::Range(size_t{0}, CacheCraftOptions::kMaxVariantsCeiling))
      ->capture_default_str();
  cmd->add_option("--max-completion-tokens", a->http.max_completion_tokens,
                  "largest answer in tokens: a request's max_tokens above it is lowered to it (0: no cap)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--max-body", a->http.max_body_bytes, "largest request body (any transfer encoding), else 413")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  CLI::Option* method = cmd->add_option("--method", a->engine.default_fusion.method,
                                        "fusion method of requests with documents that name none: " +
                                            known_methods_text() +
                                            " (with --match-chunks and no --method: qcfuse)")
                            ->capture_default_str();
  cmd->add_option("--ratio", a->engine.default_fusion.ratio,
                  "fusion ratio (share of context tokens recomputed) of requests that name none")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  CLI::Option* quality =
      cmd->add_option("--quality", a->quality,
                      "auto policy for requests that name no fusion method: the share in (0, 1] of answers identical "
                      "to full prefill's (as calibrated for the model); the engine picks method and ratio per request "
                      "and reports its choice (chunkfuse.auto). Implies --method auto");
  CLI::Option* ttft = cmd->add_option(
      "--ttft-ms", a->ttft_ms,
      "first-token budget in ms for requests that name no fusion method: the auto policy picks the best plan whose "
      "predicted time (this machine's cost model, measured at start-up) fits it; with --quality, the cheapest plan "
      "meeting the target within it. Implies --method auto");
  cmd->add_option("--self-check", a->self_check,
                  "share in [0, 1] of the served fused answers that are run again with full prefill when the server "
                  "is idle (never on a request's path) and compared, first token and answer; counts per plan with "
                  "Wilson intervals in GET /v1/self_check and /metrics; an auto plan below its target (by the lower "
                  "bound) is taken out of the policy. 0: off")
      ->capture_default_str();
  cmd->add_flag("--match-chunks", a->http.match_chunks,
                "find passages (blank-line-separated paragraphs, registered chunks) inside plain messages and "
                "prompts and serve them from chunk caches with the fusion method's recomputation (approximate; off "
                "by default)");
  cmd->add_option("--chunk-context,--chunk-variant", a->chunk_context,
                  "chunk caches of requests that name none (fusion.chunk_context): alone (each chunk computed from "
                  "position 0) or prefixed (after the request's system prefix S, FusionRAG eq. 5; keyed apart)")
      ->check(CLI::IsMember({"alone", "prefixed"}))
      ->capture_default_str();
  cmd->add_flag("--log-requests", a->http.log_requests, "one line per HTTP request on stderr");
  cmd->add_option("--pdf-timeout-ms", a->http.extract.pdf_timeout_ms,
                  "PDF uploads: pdftotext's wall-clock and CPU limit, else 400/413")
      ->check(CLI::Range(100, 600000))
      ->capture_default_str();
  cmd->add_option("--pdf-memory", a->http.extract.pdf_memory_bytes,
                  "PDF uploads: pdftotext's address-space limit (RLIMIT_AS), else 400/413 (0: none)")
      ->transform(CLI::AsSizeValue(false))
      ->default_str("512MiB");
  cmd->add_option("--pdf-jobs", a->http.pdf_jobs,
                  "PDF uploads: pdftotext processes at once; another upload waits up to 10 s, then 503 server_busy")
      ->check(CLI::Range(size_t{1}, size_t{64}))
      ->capture_default_str();
  cmd->add_option("--kb-max-documents", a->http.knowledge.max_documents,
                  "knowledge base (the web page's uploads): documents it holds; another upload gets 409")
      ->check(CLI::Range(size_t{1}, size_t{1000000}))
      ->capture_default_str();
  cmd->add_option("--kb-max-chunks", a->http.knowledge.max_chunks, "knowledge base: chunks of all its documents")
      ->check(CLI::Range(size_t{1}, size_t{10000000}))
      ->capture_default_str();
  cmd->add_option("--kb-max-text", a->http.knowledge.max_text_bytes,
                  "knowledge base: bytes of text of all its chunks, kept in memory and in knowledge-base.json (their "
                  "caches count in --disk-budget)")
      ->transform(CLI::AsSizeValue(false))
      ->default_str("64MiB");
  add_remote_options(*cmd, a->remote);
  cmd->add_option("--web-dir", a->http.web_dir,
                  "folder of the built web page served at /ui/ (default: found beside the binary or in web/dist)");
  cmd->callback([&run, a, method, quality, ttft] {
    a->method_given = method->count() > 0;
    a->quality_given = quality->count() > 0;
    a->ttft_given = ttft->count() > 0;
    run = [a] { return run_serve(*a); };
  });
}

}  // namespace cf::apps
