#include "serve/knowledge_routes.h"

#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "model/tokenizer.h"
#include "serve/fusion_trace.h"
#include "serve/route_wrappers.h"
#include "serve/api_json.h"

#ifndef CHUNKFUSE_SOURCE_WEB_DIR
#define CHUNKFUSE_SOURCE_WEB_DIR ""
#endif

namespace cf {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {


std::string decode_base64(const std::string& in) {
  std::string s;
  s.reserve(in.size());
  for (char c : in)
    if (c != '\n' && c != '\r' && c != ' ') s += c;
  if (s.size() % 4 != 0) throw invalid_request("content_base64 is not valid base64", "content_base64");
  std::string out(s.size() / 4 * 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(s.data()), static_cast<int>(s.size()));
  if (n < 0) throw invalid_request("content_base64 is not valid base64", "content_base64");
  size_t pad = 0;  // EVP_DecodeBlock counts the padding as zero bytes
  if (!s.empty() && s.back() == '=') ++pad;
  if (s.size() > 1 && s[s.size() - 2] == '=') ++pad;
  out.resize(static_cast<size_t>(n) - pad);
  return out;
}

std::string content_type_of(const std::string& path) {
  const std::string ext = fs::path(path).extension().string();
  if (ext == ".html") return "text/html; charset=utf-8";
  if (ext == ".js") return "text/javascript; charset=utf-8";
  if (ext == ".css") return "text/css; charset=utf-8";
  if (ext == ".svg") return "image/svg+xml";
  if (ext == ".png") return "image/png";
  if (ext == ".json") return "application/json";
  if (ext == ".ico") return "image/x-icon";
  return "application/octet-stream";
}

bool has_index(const fs::path& dir) {
  std::error_code ec;
  return !dir.empty() && fs::is_regular_file(dir / "index.html", ec);
}

size_t positive_size(const json& j, const char* key, size_t fallback, size_t max) {
  if (!j.contains(key)) return fallback;
  const json& v = j[key];
  if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > static_cast<int64_t>(max))
    throw invalid_request(std::string(key) + " must be an integer from 1 to " + std::to_string(max), key);
  return v.get<size_t>();
}

// The question a retrieval searches with: the last user message, or the prompt.
std::string question_of(const CompletionRequest& req) {
  if (!req.chat) return req.prompt;
  for (auto it = req.messages.rbegin(); it != req.messages.rend(); ++it)
    if (it->role == "user") return it->content;
  return "";
}

}  // namespace

std::string find_web_dir() {
  std::vector<fs::path> candidates;
  if (const char* env = std::getenv("CHUNKFUSE_WEB_DIR"); env && *env) candidates.emplace_back(env);
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path dir = exe.parent_path();
    candidates.push_back(dir / "web");
    candidates.push_back(dir / ".." / "web" / "dist");
    candidates.push_back(dir / ".." / "share" / "chunkfuse" / "web");
  }
  candidates.emplace_back(CHUNKFUSE_SOURCE_WEB_DIR);
  for (const auto& c : candidates)
    if (has_index(c)) return fs::weakly_canonical(c, ec).string();
  return "";
}

// The trace's chunks for the page: token pieces, recomputed rows, scaled scores, the last layer
// that recomputes each, and the retrieval facts of each; counts context and recomputed tokens.
json trace_chunks_json(const FusionTrace& t, const std::vector<RetrievedChunk>& retrieved, const Tokenizer& tok,
                       size_t& context, size_t& recomputed) {
  json chunks = json::array();
  const json& selection = t.selection;
  const std::vector<double>& scores = t.scores;
  // The selector's scores index the fused context, which starts at the first fused chunk.
  size_t fused_begin = 0;
  for (const auto& c : t.chunks)
    if (!c.exact) {
      fused_begin = c.begin;
      break;
    }
  double max_score = 0;
  for (double s : scores) max_score = std::max(max_score, s);
  // Cache-Craft (Alg. 1) stops recomputing the chunks outside its focus after a layer.
  std::optional<int> focus_layer;
  std::vector<size_t> focused;
  if (selection.contains("focus") && selection["focus"].value("decided", false) &&
      selection["focus"]["layer"].is_number_integer()) {
    focus_layer = selection["focus"]["layer"].get<int>();
    focused = selection["focus"].value("focused_chunks", std::vector<size_t>{});
  }
  size_t fused_index = 0;
  for (const auto& c : t.chunks) {
    json pieces = json::array(), rec = json::array(), sc = json::array();
    for (TokenId tid : c.tokens) pieces.push_back(tok.token_to_piece(tid, true));
    const auto lo = std::lower_bound(t.recomputed.begin(), t.recomputed.end(), c.begin);
    const auto hi = std::lower_bound(t.recomputed.begin(), t.recomputed.end(), c.begin + c.tokens.size());
    for (auto it = lo; it != hi; ++it) rec.push_back(*it - c.begin);
    recomputed += static_cast<size_t>(hi - lo);
    context += c.tokens.size();
    // Scaled to [0, 1] by the largest (the page's highlight strength); order kept.
    if (!scores.empty() && !c.exact)
      for (size_t i = 0; i < c.tokens.size(); ++i) {
        const size_t k = c.begin - fused_begin + i;
        sc.push_back(k < scores.size() ? (max_score > 0 ? scores[k] / max_score : scores[k]) : 0.0);
      }
    // The last layer that recomputes this chunk's rows.
    int last_layer = t.n_layers - 1;
    if (!c.exact) {
      if (focus_layer && std::find(focused.begin(), focused.end(), fused_index) == focused.end())
        last_layer = std::min(last_layer, *focus_layer);
      ++fused_index;
    }
    json cj{{"cache_id", c.id}, {"begin", c.begin},           {"exact", c.exact},
            {"tokens", pieces}, {"recomputed", rec},          {"last_layer", last_layer}};
    if (!sc.empty()) cj["scores"] = sc;
    for (const auto& rc : retrieved)
      if (rc.cache_id == c.id) {
        cj["chunk_id"] = rc.chunk_id;
        cj["source"] = rc.source;
        cj["score"] = rc.score;
        break;
      }
    chunks.push_back(std::move(cj));
  }
  return chunks;
}

json request_detail_json(const std::string& id, const CompletionRequest& req, const CompletionResult& r,
                         const std::vector<RetrievedChunk>& retrieved, const Tokenizer& tok) {
  json j{{"id", id},
         {"object", "completion.detail"},
         {"method", req.fusion.options.method},
         {"ratio", req.fusion.options.ratio},
         {"reorder", req.fusion.reorder},
         {"answer", r.text},
         {"usage", r.to_json()}};
  if (!r.auto_choice.is_null()) {  // method auto: what it chose (fusion/auto_quality.h)
    j["auto"] = r.auto_choice;
    j["ratio"] = r.auto_choice.at("ratio");
  }
  if (!r.self_check.is_null()) j["self_check"] = r.self_check;  // serve --self-check: its plan's record
  json ret = json::array();
  for (const auto& c : retrieved) {
    json x = c.to_json();
    x.erase("text");
    ret.push_back(std::move(x));
  }
  j["retrieval"] = ret;
  json chunks = json::array();
  size_t context = 0, recomputed = 0;
  if (r.trace) {
    j["n_layers"] = r.trace->n_layers;
    j["selection"] = r.trace->selection;
    j["score_kind"] = r.trace->score_kind;
    chunks = trace_chunks_json(*r.trace, retrieved, tok, context, recomputed);
  }
  j["chunks"] = chunks;
  j["context_tokens"] = context;
  j["recomputed_tokens"] = recomputed;
  j["recomputed_share"] = context ? static_cast<double>(recomputed) / static_cast<double>(context) : 0.0;
  const CompletionTimings& t = r.timings;
  j["timings"] = {{"queue_ms", t.queue_ms},         {"lookup_ms", t.lookup_ms},   {"load_ms", t.load_ms},
                  {"selection_ms", t.selection_ms}, {"recompute_ms", t.recompute_ms},
                  {"ttft_ms", t.ttft_ms},           {"decode_ms", t.decode_ms}};
  return j;
}

KnowledgeService::KnowledgeService(Engine& engine, KnowledgeServiceOptions opt, CallerOf caller_of)
    : opt_(std::move(opt)), kb_(engine, opt_.kb), caller_of_(std::move(caller_of)) {
  if (opt_.web_dir.empty()) opt_.web_dir = find_web_dir();
}

bool KnowledgeService::is_public_page(const httplib::Request& req) {
  if (req.method != "GET" && req.method != "HEAD") return false;
  return req.path == "/" || req.path == "/ui" || req.path.rfind("/ui/", 0) == 0 || req.path == "/favicon.ico";
}

void KnowledgeService::check_shared() const {
  if (opt_.isolated)
    throw RequestError(403, "permission_error", "the knowledge base is shared, so it is off under --isolate-keys");
}

void KnowledgeService::serve_page(const httplib::Request& req, httplib::Response& res) const {
  if (opt_.web_dir.empty()) {
    res.status = 404;
    res.set_content(
        "<!doctype html><title>chunkfuse</title><p>The web page is not built. Run <code>scripts/setup.sh</code> (it runs "
        "<code>npm ci &amp;&amp; npm run build</code> in <code>web/</code>) or set CHUNKFUSE_WEB_DIR.</p>",
        "text/html; charset=utf-8");
    return;
  }
  std::string rel = req.path.size() > 4 ? req.path.substr(4) : "";  // after "/ui/"
  if (rel.empty()) rel = "index.html";
  // Only plain relative names: no "..", no leading "/" (an absolute path would replace the
  // folder in the join below), nothing outside the folder.
  const bool safe = rel.find("..") == std::string::npos && rel.front() != '/' &&
                    std::all_of(rel.begin(), rel.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' || c == '/'; });
  const fs::path path = fs::path(opt_.web_dir) / rel;
  std::error_code ec;
  if (!safe || !fs::is_regular_file(path, ec)) throw RequestError(404, "not_found_error", "no file " + req.path);
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  // Vite names assets by content hash: they never change; index.html always revalidates.
  res.set_header("Cache-Control", rel.rfind("assets/", 0) == 0 ? "public, max-age=31536000, immutable" : "no-cache");
  // frame-ancestors 'none' (and X-Frame-Options for older browsers): no other page may frame
  // this one, so its Delete buttons cannot be clickjacked (issue 29, item 12).
  res.set_header("Content-Security-Policy",
                 "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; "
                 "frame-ancestors 'none'; base-uri 'none'");
  res.set_header("X-Frame-Options", "DENY");
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_content(ss.str(), content_type_of(path.string()));
}

void KnowledgeService::add_routes(httplib::Server& svr) {
  svr.Get("/", guarded([](const httplib::Request&, httplib::Response& res) { res.set_redirect("/ui/"); }));
  svr.Get("/ui", guarded([](const httplib::Request&, httplib::Response& res) { res.set_redirect("/ui/"); }));
  svr.Get(R"(/ui/.*)", guarded([this](const httplib::Request& req, httplib::Response& res) { serve_page(req, res); }));

  svr.Post("/v1/documents", guarded_post(opt_.max_body_bytes, [this](const httplib::Request&, httplib::Response& res,
                                                                     const std::string& body) {
    check_shared();
    const json j = api::parse_body(body);
    if (!j.contains("name") || !j["name"].is_string() || j["name"].get<std::string>().empty())
      throw invalid_request("name (the file name, e.g. notes.txt) is required", "name");
    const std::string name = j["name"];
    std::string format = j.contains("format") && j["format"].is_string() ? j["format"].get<std::string>() : "";
    if (format.empty()) format = document_format(name);
    std::string bytes;
    if (j.contains("text") && j["text"].is_string()) {
      bytes = j["text"].get<std::string>();
      if (format.empty() || format == "pdf") format = "txt";  // pasted text
    } else if (j.contains("content_base64") && j["content_base64"].is_string()) {
      bytes = decode_base64(j["content_base64"]);
    } else {
      throw invalid_request("give the document as text (a string) or content_base64", "text");
    }
    const size_t chunk_tokens = positive_size(j, "chunk_tokens", 0, kb_.options().max_chunk_tokens);
    reply_json(res, 202, kb_.add_document(name, format, bytes, chunk_tokens));
  }));
  svr.Get("/v1/documents", guarded([this](const httplib::Request&, httplib::Response& res) {
    check_shared();
    reply_json(res, 200, kb_.list_documents());
  }));
  svr.Get(R"(/v1/documents/([^/]+))", guarded([this](const httplib::Request& req, httplib::Response& res) {
    check_shared();
    auto d = kb_.document(req.matches[1]);
    if (!d) throw RequestError(404, "not_found_error", "no document '" + std::string(req.matches[1]) + "'", "id");
    reply_json(res, 200, *d);
  }));
  svr.Delete(R"(/v1/documents/([^/]+))", guarded_no_body([this](const httplib::Request& req, httplib::Response& res) {
    check_shared();
    const std::string id = req.matches[1];
    if (!kb_.remove_document(id)) throw RequestError(404, "not_found_error", "no document '" + id + "'", "id");
    reply_json(res, 200, json{{"id", id}, {"object", "document.deleted"}, {"deleted", true}});
  }));
  svr.Get("/v1/knowledge/chunks", guarded([this](const httplib::Request&, httplib::Response& res) {
    check_shared();
    reply_json(res, 200, kb_.list_chunks());
  }));
  svr.Delete(R"(/v1/knowledge/chunks/([^/]+))", guarded_no_body([this](const httplib::Request& req,
                                                                       httplib::Response& res) {
    check_shared();
    const std::string id = req.matches[1];
    if (!kb_.remove_chunk(id)) throw RequestError(404, "not_found_error", "no chunk '" + id + "'", "id");
    reply_json(res, 200, json{{"id", id}, {"object", "knowledge.chunk.deleted"}, {"deleted", true}});
  }));
  svr.Post("/v1/retrieve", guarded_post(opt_.max_body_bytes, [this](const httplib::Request&, httplib::Response& res,
                                                                    const std::string& body) {
    check_shared();
    const json j = api::parse_body(body);
    if (!j.contains("query") || !j["query"].is_string()) throw invalid_request("query (a string) is required", "query");
    const size_t k = positive_size(j, "k", 3, 64);
    json data = json::array();
    for (const auto& c : kb_.retrieve(j["query"], k)) data.push_back(c.to_json());
    reply_json(res, 200, json{{"object", "list"}, {"data", data}});
  }));
  svr.Get(R"(/v1/details/([^/]+))", guarded([this](const httplib::Request& req, httplib::Response& res) {
    if (auto d = detail(req.matches[1], caller_of_(req))) return reply_json(res, 200, *d);
    throw RequestError(404, "not_found_error",
                       "no details for '" + std::string(req.matches[1]) + "' (only recent requests are kept)", "id");
  }));
}

std::optional<json> KnowledgeService::detail(const std::string& id, int caller) const {
  std::lock_guard lk(mu_);
  // Another key's request reads as unknown (issue 29, item 4): details hold its texts.
  for (const auto& d : details_)
    if (d.id == id && d.caller == caller) return d.detail;
  return std::nullopt;
}

std::vector<RetrievedChunk> KnowledgeService::apply_retrieval(const json& body, CompletionRequest& req) {
  if (!body.contains("retrieval") || body["retrieval"].is_null()) return {};
  check_shared();
  const json& r = body["retrieval"];
  if (!r.is_object()) throw invalid_request("retrieval must be an object like {\"k\": 3}", "retrieval");
  if (!req.documents.empty()) throw invalid_request("give either documents or retrieval, not both", "retrieval");
  const size_t k = positive_size(r, "k", 3, std::min<size_t>(64, kb_.max_documents()));
  std::string query = question_of(req);
  if (r.contains("query")) {
    if (!r["query"].is_string()) throw invalid_request("retrieval.query must be a string", "retrieval.query");
    query = r["query"];
  }
  auto hits = kb_.retrieve(query, k);
  for (const auto& h : hits) req.documents.push_back({h.text, ""});
  return hits;
}

void KnowledgeService::after_completion(const std::string& id, int caller, const CompletionRequest& req,
                                        const CompletionResult& r,
                                        const std::vector<RetrievedChunk>& retrieved, json* response) {
  if (!retrieved.empty()) kb_.note_used(retrieved);
  if (response && !retrieved.empty() && response->contains("chunkfuse")) {
    json list = json::array();
    for (const auto& c : retrieved) {
      json x = c.to_json();
      x.erase("text");
      list.push_back(std::move(x));
    }
    (*response)["chunkfuse"]["retrieval"] = list;
  }
  if (opt_.isolated) return;  // details hold cache-use figures and texts: not shared across keys
  json d = request_detail_json(id, req, r, retrieved, kb_.tokenizer());
  // Bounded in bytes as well as in count: one detail holds a piece per prompt token. A piece
  // may be part of a character (byte-level BPE splits a multi-byte one across tokens): counted
  // as served, with api::dump's U+FFFD for it; a plain dump() threw there, a 500 for the
  // answer and, on a stream, an uncaught exception that ended the process.
  const size_t bytes = api::dump(d).size();
  std::lock_guard lk(mu_);
  details_.push_back({id, caller, std::move(d), bytes});
  details_bytes_ += bytes;
  while (details_.size() > opt_.kept_details || (details_.size() > 1 && details_bytes_ > opt_.kept_details_bytes)) {
    details_bytes_ -= details_.front().bytes;
    details_.pop_front();
  }
}

}  // namespace cf
