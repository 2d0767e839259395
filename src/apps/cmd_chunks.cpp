// `chunkfuse chunks`: manage the chunk-cache store.
//   precompute  computes the PIC cache of every passage of a JSON Lines file (skipping
//               those already stored), with progress on stderr and totals on stdout
//   ls          lists the stored caches
//   rm          removes caches by id, or all of them
//   verify      validates every file; exit code 1 if any is bad
//   enrich      FusionRAG's offline stage: PIC caches plus each passage's neighbour-enriched
//               cache (fusion/fusionrag_enrich.h), with progress and the cost per chunk
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <numeric>
#include <stdexcept>
#include <unordered_set>

#include "apps/app_common.h"
#include "base/clock.h"
#include "base/paths.h"
#include "base/progress.h"
#include "fusion/fusionrag_enrich.h"
#include "fusion/rag_prompt.h"
#include "kv/chunk_store.h"
#include "apps/remote_options.h"

namespace cf::apps {
namespace {

std::string default_store_dir() { return cache_root() + "/store"; }

KvDtype dtype_option(const std::string& name) {
  KvDtype dtype;
  if (!parse_dtype(name, dtype)) throw std::runtime_error("unknown --dtype " + name);
  return dtype;
}

// A store for writing this model's caches; `memory_budget` 0 makes it write-through.
ChunkStoreOptions writing_store(const Model& model, const std::string& dir, KvDtype dtype, size_t memory_budget) {
  ChunkStoreOptions opt;
  opt.dir = dir;
  opt.disk_dtype = dtype;
  opt.memory_budget_bytes = memory_budget;
  opt.model = StoreModel{model.fingerprint(), model.hparams()};
  return opt;
}

struct PrecomputeArgs {
  ModelOptions model;
  std::string passages_file;
  std::string store_dir = default_store_dir();
  std::string dtype = "f16";
  std::string store_key_file;
  RemoteArgs remote;
  std::string chunk_context = "alone";
};

int run_precompute(const PrecomputeArgs& a) {
  const KvDtype dtype = dtype_option(a.dtype);
  const auto passages = read_passages_jsonl(a.passages_file);
  auto model = load_model(a.model);
  ThreadPool pool(a.model.threads);
  Forward fwd(*model, pool);
  // Write-through only: nothing here reads the caches back.
  ChunkStoreOptions store_opt = writing_store(*model, a.store_dir, dtype, 0);
  store_opt.auth = EntryAuth::optional_from_key_file(a.store_key_file);
  store_opt.remote = remote_tier_options(a.remote);  // fills the shared tier too (issue 13)
  ChunkStore store(store_opt);

  const double t0 = now_ms();
  const RagPromptOptions prompt_opt;
  ChunkContext context = ChunkContext::alone;
  parse_chunk_context(a.chunk_context, context);  // CLI11 checked the name
  // prefixed: after the S requests built with the default prompt have (default_system_tokens).
  const std::vector<TokenId> system =
      context == ChunkContext::prefixed ? default_system_tokens(*model, prompt_opt) : std::vector<TokenId>{};
  size_t computed = 0, present = 0, duplicates = 0, tokens = 0, computed_tokens = 0;
  uint64_t remote_hits_before = 0;
  double offline_ms = 0;
  std::unordered_set<std::string> seen;
  ProgressBar progress(passages.size(), "chunks");
  for (size_t i = 0; i < passages.size(); ++i) {
    const ChunkKey key = base_chunk_key(
        model->fingerprint(), model->tokenizer().encode(passage_text(passages[i], prompt_opt), false, false), context, system);
    tokens += key.tokens().size();
    if (key.tokens().empty() || !seen.insert(key.id()).second) {
      ++duplicates;
    } else if (auto have = store.get(key)) {  // validates: a bad file is reported, set aside and recomputed
      ++present;
      // Stored locally only so far: publish it (the remote writer skips what Redis already has).
      if (store_opt.remote && store.stats().remote_hits == remote_hits_before) store.put(*have);
      remote_hits_before = store.stats().remote_hits;
    } else {
      ChunkCache c = compute_chunk_cache(fwd, key, system);
      offline_ms += c.offline_ms;
      computed_tokens += c.n_tokens();
      store.put(std::move(c));
      ++computed;
    }
    const double secs = (now_ms() - t0) / 1000;
    char note[48];
    std::snprintf(note, sizeof note, "%.0f tok/s", secs > 0 ? computed_tokens / secs : 0.0);
    progress.update(i + 1, note);
  }
  if (store_opt.remote && !store.flush_remote(600000)) std::fprintf(stderr, "remote tier: writes still queued\n");
  const double secs = (now_ms() - t0) / 1000;
  const auto st = store.stats();
  std::printf("chunks %zu: computed %zu, already stored %zu, duplicate or empty %zu", passages.size(), computed,
              present, duplicates);
  if (st.corrupt_files) std::printf(", %zu bad files replaced", static_cast<size_t>(st.corrupt_files));
  std::printf("\n");
  std::printf("tokens %zu (computed %zu), bytes written %zu (%s, %s), %.2f s (forward passes %.2f s, %.1f tok/s)\n",
              tokens, computed_tokens, static_cast<size_t>(st.disk_bytes_written),
              format_bytes(static_cast<double>(st.disk_bytes_written)).c_str(), dtype_name(dtype), secs,
              offline_ms / 1000, offline_ms > 0 ? computed_tokens * 1000.0 / offline_ms : 0.0);
  std::printf("store %s\n", a.store_dir.c_str());
  if (st.has_remote)
    std::printf("remote %s: %llu written (%s), %llu already there, %llu hits, %llu errors, %llu failed, %llu dropped\n",
                a.remote.url.c_str(), static_cast<unsigned long long>(st.remote.writes),
                format_bytes(static_cast<double>(st.remote.bytes_written)).c_str(),
                static_cast<unsigned long long>(st.remote.writes_present),
                static_cast<unsigned long long>(st.remote_hits), static_cast<unsigned long long>(st.remote.errors),
                static_cast<unsigned long long>(st.remote.write_errors),
                static_cast<unsigned long long>(st.remote.writes_dropped));
  return 0;
}

struct EnrichArgs {
  ModelOptions model;
  std::string passages_file;
  std::string store_dir = default_store_dir();
  std::string dtype = "f16";
  size_t neighbours = kFusionRagDefaultNeighbours;
  size_t limit = 0;  // 0: every passage
  std::string store_key_file;
  std::string chunk_context = "alone";
};

int run_enrich(const EnrichArgs& a) {
  const KvDtype dtype = dtype_option(a.dtype);
  const auto passages = read_corpus_passages(a.passages_file);
  auto model = load_model(a.model);
  ThreadPool pool(a.model.threads);
  Forward fwd(*model, pool);
  // Neighbours are read again and again: keep them in memory.
  ChunkStoreOptions store_opt = writing_store(*model, a.store_dir, dtype, size_t{1} << 30);
  store_opt.auth = EntryAuth::optional_from_key_file(a.store_key_file);
  ChunkStore store(store_opt);

  EnrichOptions eo;
  eo.neighbours = a.neighbours;
  eo.system = default_system_tokens(*model);
  parse_chunk_context(a.chunk_context, eo.chunk_context);  // CLI11 checked the name
  if (a.limit) eo.limit = a.limit;
  std::unique_ptr<ProgressBar> progress;
  std::string phase;
  eo.progress = [&](const char* p, size_t done, size_t total) {
    if (phase != p) {
      phase = p;
      std::fprintf(stderr, "%s\n", phase == "pic" ? "PIC caches (chunks and their neighbours):"
                                                  : "neighbour-enriched caches:");
      progress = std::make_unique<ProgressBar>(total, "chunks");
    }
    progress->update(done);
  };
  const double t0 = now_ms();
  const EnrichReport r = enrich_corpus(fwd, store, corpus_chunks(*model, passages), eo);
  const double secs = (now_ms() - t0) / 1000;

  std::vector<double> ms = r.enrich_ms;
  std::sort(ms.begin(), ms.end());
  const double total_ms = std::accumulate(ms.begin(), ms.end(), 0.0);
  std::printf("passages %zu: %zu unique, %zu duplicate or empty; S %zu tokens, top-%zu neighbours by BM25 (%.1f ms)\n",
              r.chunks, r.unique, r.duplicates_or_empty, eo.system.size(), a.neighbours, r.similarity_ms);
  std::printf("PIC caches: computed %zu (%.2f s of forward passes), already stored %zu\n", r.pic_computed,
              r.pic_ms / 1000, r.pic_present);
  std::printf("enriched: computed %zu, already stored %zu, no neighbour %zu\n", r.enriched, r.enriched_present,
              r.no_neighbours);
  if (!ms.empty())
    std::printf("enrichment per chunk: mean %.1f ms, median %.1f ms, p90 %.1f ms (%zu chunk tokens after %.0f context "
                "tokens on average; %.1f chunk tok/s)\n",
                total_ms / ms.size(), ms[ms.size() / 2], ms[std::min(ms.size() - 1, ms.size() * 9 / 10)],
                r.enriched_tokens / ms.size(), static_cast<double>(r.context_tokens) / ms.size(),
                r.enriched_tokens * 1000.0 / total_ms);
  const auto st = store.stats();
  std::printf("%.2f s in all, bytes written %s (%s), store %s\n", secs,
              format_bytes(static_cast<double>(st.disk_bytes_written)).c_str(), dtype_name(dtype), a.store_dir.c_str());
  return 0;
}

struct StoreArgs {
  std::string store_dir = default_store_dir();
  std::vector<std::string> ids;
  bool all = false;
  std::string model_path;  // verify: also check fingerprint and shape against this model
  std::string key_file;    // verify: also check every entry's HMAC tag (serve --store-key-file)
};

ChunkStoreOptions bare_store(const std::string& dir) {
  ChunkStoreOptions o;
  o.dir = dir;
  return o;
}

int run_ls(const StoreArgs& a) {
  const ChunkStore store(bare_store(a.store_dir));
  const auto entries = store.list();
  std::printf("%-32s %7s %10s %5s %-12s %-16s %-19s %10s\n", "ID", "TOKENS", "BYTES", "DTYPE", "VARIANT", "MODEL",
              "CREATED", "OFFLINE_MS");
  size_t bytes = 0, tokens = 0, bad = 0;
  for (const auto& e : entries) {
    bytes += e.file_bytes;
    if (!e.problem.empty()) {
      ++bad;
      std::printf("%-32s %7s %10zu  unreadable: %s\n", e.id.c_str(), "-", e.file_bytes, e.problem.c_str());
      continue;
    }
    tokens += e.n_tokens;
    char created[32] = "-";
    const std::time_t t = static_cast<std::time_t>(e.created_unix_ms / 1000);
    std::tm tm{};
    if (e.created_unix_ms > 0 && ::localtime_r(&t, &tm)) std::strftime(created, sizeof created, "%Y-%m-%d %H:%M:%S", &tm);
    std::printf("%-32s %7zu %10zu %5s %-12s %016llx %-19s %10.1f\n", e.id.c_str(), e.n_tokens, e.file_bytes,
                dtype_name(e.dtype), context_kind_name(e.kind), static_cast<unsigned long long>(e.model_fingerprint),
                created, e.offline_ms);
  }
  std::printf("%zu entries, %zu tokens, %s in %s%s\n", entries.size(), tokens, format_bytes(static_cast<double>(bytes)).c_str(),
              a.store_dir.c_str(), bad ? (", " + std::to_string(bad) + " unreadable (run `chunkfuse chunks verify`)").c_str() : "");
  return 0;
}

int run_rm(const StoreArgs& a) {
  ChunkStore store(bare_store(a.store_dir));
  if (a.all) {
    std::printf("removed %zu entries from %s\n", store.remove_all(), a.store_dir.c_str());
    return 0;
  }
  if (a.ids.empty()) throw std::runtime_error("give the ids to remove, or --all");
  int missing = 0;
  size_t removed = 0;
  for (const auto& id : a.ids) {
    Hash128 h;
    if (!parse_hash128_hex(id, h)) {
      std::fprintf(stderr, "not a chunk id (32 lower-case hex digits): %s\n", id.c_str());
      ++missing;
    } else if (store.remove(id)) {
      ++removed;
    } else {
      std::fprintf(stderr, "no such entry: %s\n", id.c_str());
      ++missing;
    }
  }
  std::printf("removed %zu entries\n", removed);
  return missing ? 1 : 0;
}

int run_verify(const StoreArgs& a) {
  ChunkStoreOptions o = bare_store(a.store_dir);
  if (!a.model_path.empty()) {
    ModelOptions mo;
    mo.model_path = a.model_path;
    auto model = load_model(mo);
    o.model = StoreModel{model->fingerprint(), model->hparams()};
  }
  o.auth = EntryAuth::optional_from_key_file(a.key_file);
  const ChunkStore store(o);
  const VerifyReport r = store.verify();
  for (const auto& b : r.bad) std::printf("BAD %s\n", b.message.c_str());
  std::printf("checked %zu: %zu valid (%s), %zu bad; %zu set aside as .corrupt, %zu temp files%s\n", r.checked, r.valid,
              format_bytes(static_cast<double>(r.valid_bytes)).c_str(), r.bad.size(), r.corrupt_aside, r.temp_files,
              o.model ? "" : " (integrity only: pass -m to check the model too)");
  return r.ok() ? 0 : 1;
}

}  // namespace

void add_chunks_command(CLI::App& app, CommandRunner& run) {
  CLI::App* chunks = app.add_subcommand("chunks", "manage the chunk-cache store (precompute, ls, rm, verify)");
  chunks->require_subcommand(1);

  auto [p, pre] = add_model_command<PrecomputeArgs>(
      *chunks, run, "precompute", "compute and store the chunk cache of every passage", run_precompute);
  pre->add_option("--passages", p->passages_file, "JSON Lines file, one {\"title\":..., \"text\":...} per line")
      ->required()
      ->check(CLI::ExistingFile);
  pre->add_option("--store", p->store_dir, "store directory")->capture_default_str();
  pre->add_option("--dtype", p->dtype, "K/V type on disk")->check(CLI::IsMember({"f16", "bf16", "f32"}))->capture_default_str();
  add_store_key_option(*pre, p->store_key_file);
  add_remote_options(*pre, p->remote);
  const std::string context_help =
      "alone (each chunk computed from position 0) or prefixed (after the default system prefix S, FusionRAG eq. 5; "
      "requests use it with fusion.chunk_context / --chunk-context prefixed)";
  pre->add_option("--chunk-context,--chunk-variant", p->chunk_context, context_help)
      ->check(CLI::IsMember({"alone", "prefixed"}))
      ->capture_default_str();

  auto [e, enr] = add_model_command<EnrichArgs>(
      *chunks, run, "enrich", "FusionRAG offline stage: PIC caches and each passage's cache enriched by its top-n similar passages",
      run_enrich);
  enr->add_option("--passages", e->passages_file,
                  "the corpus: JSON Lines of {\"title\", \"text\"}, or a JSON array of passages or of examples with "
                  "\"ctxs\" (musique_s.json)")
      ->required()
      ->check(CLI::ExistingFile);
  enr->add_option("--neighbours", e->neighbours, "similar passages per passage (FusionRAG's top-n)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  enr->add_option("--limit", e->limit, "enrich only the first N unique passages (neighbours still from all); 0: all")
      ->capture_default_str();
  enr->add_option("--store", e->store_dir, "store directory")->capture_default_str();
  enr->add_option("--dtype", e->dtype, "K/V type on disk")->check(CLI::IsMember({"f16", "bf16", "f32"}))->capture_default_str();
  add_store_key_option(*enr, e->store_key_file);
  enr->add_option("--chunk-context,--chunk-variant", e->chunk_context,
                  "base caches of the passages and of their neighbours: " + context_help +
                      "; the paper's eq. 10 is prefixed")
      ->check(CLI::IsMember({"alone", "prefixed"}))
      ->capture_default_str();

  auto s = std::make_shared<StoreArgs>();
  auto add_store = [&](CLI::App* c) { c->add_option("--store", s->store_dir, "store directory")->capture_default_str(); };
  CLI::App* ls = chunks->add_subcommand("ls", "list the stored chunk caches");
  add_store(ls);
  ls->callback([&run, s] { run = [s] { return run_ls(*s); }; });

  CLI::App* rm = chunks->add_subcommand("rm", "remove chunk caches by id, or all of them");
  add_store(rm);
  auto* ids = rm->add_option("ids", s->ids, "ids to remove (as `chunks ls` prints them)");
  rm->add_flag("--all", s->all, "remove every entry (and files set aside as corrupt, and stale temp files)")->excludes(ids);
  rm->callback([&run, s] { run = [s] { return run_rm(*s); }; });

  CLI::App* verify = chunks->add_subcommand("verify", "validate every stored file; exit code 1 if any is bad");
  add_store(verify);
  verify->add_option("-m,--model", s->model_path, "also check that entries were made by this model (fingerprint, shape)")
      ->check(CLI::ExistingFile);
  verify->add_option("--store-key-file", s->key_file, "also check every entry's HMAC tag with this key (as serve's)")
      ->check(CLI::ExistingFile);
  verify->callback([&run, s] { run = [s] { return run_verify(*s); }; });
}

}  // namespace cf::apps
