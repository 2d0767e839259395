#include "eval/datasets.h"

#include <cctype>
#include <cstdlib>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <utility>

#include <zlib.h>

#include "eval/ruler.h"

namespace cf::eval {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw std::runtime_error(where + ": " + what);
}

// The whole file, gunzipped when it is gzip (zlib reads plain files as they are).
std::string read_file(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("cannot open dataset file " + path);
  std::string out;
  char buf[1 << 16];
  int got = 0;
  while ((got = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(got));
  int err = Z_OK;
  const std::string msg = got < 0 ? gzerror(f, &err) : "";
  gzclose(f);
  if (got < 0) throw std::runtime_error(path + ": cannot read (" + msg + ")");
  return out;
}

const json& field(const json& obj, const char* key, const std::string& where) {
  if (!obj.is_object()) fail(where, "expected a JSON object");
  auto it = obj.find(key);
  if (it == obj.end()) fail(where, std::string("missing field \"") + key + "\"");
  return *it;
}

std::string string_field(const json& obj, const char* key, const std::string& where) {
  const json& v = field(obj, key, where);
  if (!v.is_string()) fail(where, std::string("field \"") + key + "\" must be a string");
  return v.get<std::string>();
}

// A string or an array of strings.
std::vector<std::string> answers_field(const json& obj, const char* key, const std::string& where) {
  const json& v = field(obj, key, where);
  if (v.is_string()) return {v.get<std::string>()};
  if (!v.is_array()) fail(where, std::string("field \"") + key + "\" must be a string or an array of strings");
  std::vector<std::string> out;
  for (const auto& a : v) {
    if (!a.is_string()) fail(where, std::string("field \"") + key + "\" must hold strings only");
    out.push_back(a.get<std::string>());
  }
  return out;
}

// [{title?, text}] -> passages
std::vector<Passage> passages_field(const json& obj, const char* key, const std::string& where) {
  const json& v = field(obj, key, where);
  if (!v.is_array()) fail(where, std::string("field \"") + key + "\" must be an array of {title, text}");
  std::vector<Passage> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string w = where + ", " + key + "[" + std::to_string(i) + "]";
    Passage p;
    if (v[i].is_object() && v[i].contains("title")) p.title = string_field(v[i], "title", w);
    p.text = string_field(v[i], "text", w);
    out.push_back(std::move(p));
  }
  return out;
}

size_t line_of_byte(const std::string& text, size_t byte) {
  size_t line = 1;
  for (size_t i = 0; i < byte && i < text.size(); ++i) line += text[i] == '\n';
  return line;
}

// Calls parse_line(object, "path:line") for every non-blank line.
template <typename F>
void for_each_jsonl(const std::string& path, F&& parse_line) {
  std::istringstream in(read_file(path));  // the largest file is a few MB
  std::string line;
  size_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n);
    json j;
    try {
      j = json::parse(line);
    } catch (const json::parse_error& e) {
      fail(where, std::string("malformed JSON: ") + e.what());
    }
    if (!j.is_object()) fail(where, "expected one JSON object per line");
    parse_line(j, where);
  }
}

void require_examples(const Dataset& d) {
  if (d.examples.empty()) throw std::runtime_error("dataset " + d.path + " has no examples");
}

bool usable_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

// Starting points for the searches: the executable's folder, then the working directory.
std::vector<fs::path> search_starts() {
  std::vector<fs::path> starts;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) starts.push_back(exe.parent_path());
  fs::path cwd = fs::current_path(ec);
  if (!ec) starts.push_back(cwd);
  return starts;
}

// The shape musique_s, user JSONL and NQ share: question, answers and a passage list under
// `passages_key`.
QaExample qa_example(const json& j, const std::string& where, const char* passages_key, std::string id) {
  QaExample ex;
  ex.id = std::move(id);
  ex.question = string_field(j, "question", where);
  ex.answers = answers_field(j, "answers", where);
  ex.passages = passages_field(j, passages_key, where);
  return ex;
}

}  // namespace

Dataset load_musique_json(const std::string& path, const std::string& name) {
  const std::string text = read_file(path);
  json all;
  try {
    all = json::parse(text);
  } catch (const json::parse_error& e) {
    fail(path + ":" + std::to_string(line_of_byte(text, e.byte)), std::string("malformed JSON: ") + e.what());
  }
  if (!all.is_array()) fail(path, "expected one JSON array of examples");
  Dataset d{name, path, {}};
  for (size_t i = 0; i < all.size(); ++i) {
    const std::string where = path + ", example " + std::to_string(i);
    const bool has_id = all[i].is_object() && all[i].contains("id") && all[i]["id"].is_string();
    d.examples.push_back(qa_example(all[i], where, "ctxs", has_id ? all[i]["id"].get<std::string>() : std::to_string(i)));
  }
  require_examples(d);
  return d;
}

Dataset load_hotpotqa_jsonl(const std::string& path, const std::string& name) {
  Dataset d{name, path, {}};
  for_each_jsonl(path, [&](const json& j, const std::string& where) {
    QaExample ex;
    ex.id = j.contains("_id") && j["_id"].is_string() ? j["_id"].get<std::string>() : std::to_string(d.examples.size());
    ex.question = string_field(j, "question", where);
    ex.answers = {string_field(j, "answer", where)};
    const json& ctx = field(j, "context", where);
    if (!ctx.is_array()) fail(where, "field \"context\" must be an array of [title, [sentences]]");
    for (size_t i = 0; i < ctx.size(); ++i) {
      const json& c = ctx[i];
      if (!c.is_array() || c.size() != 2 || !c[0].is_string() || !c[1].is_array())
        fail(where, "context[" + std::to_string(i) + "] must be [title, [sentences]]");
      Passage p{c[0].get<std::string>(), {}};
      for (const auto& s : c[1]) {
        if (!s.is_string()) fail(where, "context[" + std::to_string(i) + "] has a sentence that is not a string");
        p.text += s.get<std::string>();  // sentences carry their own leading spaces
      }
      ex.passages.push_back(std::move(p));
    }
    d.examples.push_back(std::move(ex));
  });
  require_examples(d);
  return d;
}

Dataset load_user_jsonl(const std::string& path, const std::string& name) {
  Dataset d{name, path, {}};
  for_each_jsonl(path, [&](const json& j, const std::string& where) {
    std::string id = j.contains("id") ? (j["id"].is_string() ? j["id"].get<std::string>() : j["id"].dump())
                                      : std::to_string(d.examples.size());
    d.examples.push_back(qa_example(j, where, "passages", std::move(id)));
    if (d.examples.back().passages.empty()) fail(where, "an example needs at least one passage");
  });
  require_examples(d);
  return d;
}

uint64_t SeededRng::next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

size_t SeededRng::below(size_t n) {
  if (n == 0) throw std::invalid_argument("SeededRng::below(0)");
  return static_cast<size_t>(next() % n);  // the bias is below 2^-40 for our n
}

Dataset load_nq_oracle(const std::string& path, const std::string& name, uint64_t seed, size_t distractors) {
  Dataset d{name, path, {}};
  for_each_jsonl(path, [&](const json& j, const std::string& where) {
    d.examples.push_back(qa_example(j, where, "ctxs", std::to_string(d.examples.size())));
    if (d.examples.back().passages.empty()) fail(where, "an example needs at least one passage in \"ctxs\"");
  });
  require_examples(d);
  // Distractors come from the other examples' first (gold) passages, as read.
  std::vector<Passage> pool;
  std::vector<bool> oracle;
  for (const auto& ex : d.examples) {
    pool.push_back(ex.passages.front());
    oracle.push_back(ex.passages.size() == 1);
  }
  for (size_t i = 0; i < d.examples.size(); ++i) {
    if (!oracle[i] || distractors == 0) continue;
    QaExample& ex = d.examples[i];
    const Passage gold = ex.passages.front();
    SeededRng rng(seed, i);
    std::vector<Passage> chosen;
    std::vector<bool> used(pool.size(), false);
    used[i] = true;
    // Rejection sampling: the pool is large (2655) and few passages are rejected.
    for (size_t tries = 0; chosen.size() < distractors && tries < 100 * distractors; ++tries) {
      const size_t k = rng.below(pool.size());
      if (used[k]) continue;
      used[k] = true;
      const Passage& p = pool[k];
      bool answer_bearing = p.title == gold.title;
      for (const auto& a : ex.answers) answer_bearing = answer_bearing || (!a.empty() && p.text.find(a) != std::string::npos);
      if (!answer_bearing) chosen.push_back(p);
    }
    chosen.insert(chosen.begin() + static_cast<long>(rng.below(chosen.size() + 1)), gold);
    ex.passages = std::move(chosen);
  }
  return d;
}

Dataset load_kv_retrieval(const std::string& path, const std::string& name, size_t pairs_per_chunk) {
  if (pairs_per_chunk == 0) throw std::invalid_argument("load_kv_retrieval: pairs_per_chunk must be positive");
  Dataset d{name, path, {}};
  for_each_jsonl(path, [&](const json& j, const std::string& where) {
    const json& records = field(j, "ordered_kv_records", where);
    if (!records.is_array() || records.empty()) fail(where, "field \"ordered_kv_records\" must be a non-empty array");
    QaExample ex;
    ex.id = std::to_string(d.examples.size());
    const std::string key = string_field(j, "key", where);
    ex.answers = {string_field(j, "value", where)};
    ex.question = "What is the value of the key \"" + key + "\" in the key-value pairs above? Answer with the value only.";
    Passage p;
    for (size_t i = 0; i < records.size(); ++i) {
      const json& kv = records[i];
      if (!kv.is_array() || kv.size() != 2 || !kv[0].is_string() || !kv[1].is_string())
        fail(where, "ordered_kv_records[" + std::to_string(i) + "] must be [key, value]");
      if (!p.text.empty()) p.text += "\n";
      // Appended piece by piece: GCC 12 warns (-Wrestrict, falsely) on "\"" + std::string.
      p.text.append("\"").append(kv[0].get_ref<const std::string&>()).append("\": \"");
      p.text.append(kv[1].get_ref<const std::string&>()).append("\"");
      if ((i + 1) % pairs_per_chunk == 0 || i + 1 == records.size()) ex.passages.push_back(std::exchange(p, {}));
    }
    d.examples.push_back(std::move(ex));
  });
  require_examples(d);
  return d;
}

Dataset load_rgb(const std::string& path, const std::string& name, uint64_t seed) {
  Dataset d{name, path, {}};
  for_each_jsonl(path, [&](const json& j, const std::string& where) {
    QaExample ex;
    const size_t index = d.examples.size();
    ex.id = j.contains("id") ? (j["id"].is_string() ? j["id"].get<std::string>() : j["id"].dump()) : std::to_string(index);
    ex.question = string_field(j, "query", where);
    const json& answer = field(j, "answer", where);
    // A string, or a list whose items are strings or lists of alternative strings.
    std::function<void(const json&)> collect = [&](const json& a) {
      if (a.is_string()) {
        ex.answers.push_back(a.get<std::string>());
      } else if (a.is_array()) {
        for (const auto& x : a) collect(x);
      } else {
        fail(where, "field \"answer\" must hold strings or lists of strings");
      }
    };
    collect(answer);
    if (ex.answers.empty()) fail(where, "field \"answer\" is empty");
    for (const char* key : {"positive", "negative"}) {
      const json& docs = field(j, key, where);
      if (!docs.is_array()) fail(where, std::string("field \"") + key + "\" must be an array of strings");
      for (const auto& doc : docs) {
        if (!doc.is_string()) fail(where, std::string("field \"") + key + "\" must hold strings only");
        ex.passages.push_back({"", doc.get<std::string>()});
      }
    }
    if (ex.passages.empty()) fail(where, "an example needs at least one passage");
    SeededRng rng(seed, index);
    rng.shuffle(ex.passages);
    d.examples.push_back(std::move(ex));
  });
  require_examples(d);
  return d;
}

Dataset load_dataset_file(const std::string& path, uint64_t seed) {
  const std::string text = read_file(path);  // checks that it opens; gunzips
  fs::path named(path);
  if (named.extension() == ".gz") named = named.stem();  // x.jsonl.gz -> x
  const std::string stem = named.stem().string();
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') return load_musique_json(path, stem);
  // JSON Lines: the first non-blank line tells the schemas apart.
  const size_t line_end = first == std::string::npos ? first : text.find('\n', first);
  const json head = first == std::string::npos
                        ? json()
                        : json::parse(text.substr(first, line_end == std::string::npos ? line_end : line_end - first),
                                      nullptr, /*allow_exceptions=*/false);
  if (head.is_object()) {
    if (head.contains("context") && head.contains("answer")) return load_hotpotqa_jsonl(path, stem);
    if (head.contains("ordered_kv_records")) return load_kv_retrieval(path, stem);
    if (head.contains("query") && head.contains("positive")) return load_rgb(path, stem, seed);
    if (head.contains("ctxs") && head.contains("question")) return load_nq_oracle(path, stem, seed);
  }
  return load_user_jsonl(path, stem);
}

std::optional<std::string> find_repo_root() {
  for (fs::path p : search_starts()) {
    for (; !p.empty(); p = p.parent_path()) {
      std::error_code ec;
      if (fs::exists(p / "CMakeLists.txt", ec) && usable_dir(p / "src" / "eval")) return p.string();
      if (p == p.root_path()) break;
    }
  }
  return std::nullopt;
}

std::optional<std::string> default_data_dir() {
  if (const char* env = std::getenv("CHUNKFUSE_DATA_DIR"); env && *env) return std::string(env);
  if (auto root = find_repo_root()) {
    fs::path d = fs::path(*root).parent_path() / "shared" / "datasets";
    if (usable_dir(d)) return d.lexically_normal().string();
  }
  return std::nullopt;
}

Dataset load_dataset(const std::string& name_or_file, const std::string& data_dir, uint64_t seed,
                     const Tokenizer* tokenizer) {
  std::error_code ec;
  if (fs::is_regular_file(name_or_file, ec)) return load_dataset_file(name_or_file, seed);
  if (name_or_file.starts_with("ruler:")) {
    RulerOptions ro = parse_ruler_name(name_or_file);
    ro.seed = seed;
    if (!tokenizer) throw std::runtime_error("dataset '" + name_or_file + "' is generated and needs the model's tokenizer");
    return generate_ruler(*tokenizer, ro);
  }
  struct Known {
    const char* name;
    const char* file;
    const char* canonical;
  };
  static const Known kKnown[] = {{"musique_s", "musique_s.json", "musique_s"},
                                 {"musique", "musique_s.json", "musique_s"},
                                 {"hotpotqa", "hotpotqa_dev200.jsonl", "hotpotqa_dev200"},
                                 {"hotpotqa_dev200", "hotpotqa_dev200.jsonl", "hotpotqa_dev200"},
                                 {"nq", "nq_open_oracle.jsonl.gz", "nq_open_oracle"},
                                 {"nq_open_oracle", "nq_open_oracle.jsonl.gz", "nq_open_oracle"},
                                 {"kv_retrieval", "kv_retrieval_75keys.jsonl.gz", "kv_retrieval_75keys"},
                                 {"kv_retrieval_75keys", "kv_retrieval_75keys.jsonl.gz", "kv_retrieval_75keys"},
                                 {"rgb", "rgb_en_fact.jsonl", "rgb_en_fact"},
                                 {"rgb_en_fact", "rgb_en_fact.jsonl", "rgb_en_fact"}};
  const Known* known = nullptr;
  for (const auto& k : kKnown)
    if (name_or_file == k.name) known = &k;
  if (!known)
    throw std::runtime_error("dataset '" + name_or_file +
                             "' is neither a file nor a known name (musique_s, hotpotqa, nq_open_oracle, kv_retrieval, "
                             "rgb_en_fact, ruler:TASK:LENGTH)");
  std::string dir = data_dir;
  if (dir.empty()) {
    auto d = default_data_dir();
    if (!d)
      throw std::runtime_error("no dataset folder found (looked for ../shared/datasets beside the repository); pass "
                               "--data-dir DIR or set CHUNKFUSE_DATA_DIR");
    dir = *d;
  }
  const fs::path file = fs::path(dir) / known->file;
  if (!fs::is_regular_file(file, ec))
    throw std::runtime_error("dataset file " + file.string() + " not found (pass --data-dir DIR)");
  const std::string canonical = known->canonical;
  if (canonical == "musique_s") return load_musique_json(file.string(), canonical);
  if (canonical == "hotpotqa_dev200") return load_hotpotqa_jsonl(file.string(), canonical);
  if (canonical == "nq_open_oracle") return load_nq_oracle(file.string(), canonical, seed);
  if (canonical == "kv_retrieval_75keys") return load_kv_retrieval(file.string(), canonical);
  return load_rgb(file.string(), canonical, seed);
}

}  // namespace cf::eval
