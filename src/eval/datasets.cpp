#include "eval/datasets.h"

#include <cctype>
#include <cstdlib>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace cf::eval {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw std::runtime_error(where + ": " + what);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open dataset file " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
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
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open dataset file " + path);
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
    QaExample ex;
    ex.id = all[i].is_object() && all[i].contains("id") && all[i]["id"].is_string() ? all[i]["id"].get<std::string>()
                                                                                    : std::to_string(i);
    ex.question = string_field(all[i], "question", where);
    ex.answers = answers_field(all[i], "answers", where);
    ex.passages = passages_field(all[i], "ctxs", where);
    d.examples.push_back(std::move(ex));
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
    QaExample ex;
    ex.id = j.contains("id") ? (j["id"].is_string() ? j["id"].get<std::string>() : j["id"].dump())
                             : std::to_string(d.examples.size());
    ex.question = string_field(j, "question", where);
    ex.answers = answers_field(j, "answers", where);
    ex.passages = passages_field(j, "passages", where);
    if (ex.passages.empty()) fail(where, "an example needs at least one passage");
    d.examples.push_back(std::move(ex));
  });
  require_examples(d);
  return d;
}

Dataset load_dataset_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open dataset file " + path);
  unsigned char magic[2] = {0, 0};
  in.read(reinterpret_cast<char*>(magic), 2);
  if (magic[0] == 0x1f && magic[1] == 0x8b)
    throw std::runtime_error(path + ": gzip files are not read directly; decompress it first (gunzip -k)");
  in.seekg(0);
  std::string stem = fs::path(path).stem().string();
  char c = 0;
  while (in.get(c) && std::isspace(static_cast<unsigned char>(c))) {
  }
  if (c == '[') return load_musique_json(path, stem);
  // JSON Lines: the first non-blank line tells HotpotQA's schema from the user format.
  in.seekg(0);
  std::string line;
  while (std::getline(in, line) && line.find_first_not_of(" \t\r") == std::string::npos) {
  }
  json first = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (first.is_object() && first.contains("context") && first.contains("answer"))
    return load_hotpotqa_jsonl(path, stem);
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

Dataset load_dataset(const std::string& name_or_file, const std::string& data_dir) {
  std::error_code ec;
  if (fs::is_regular_file(name_or_file, ec)) return load_dataset_file(name_or_file);
  struct Known {
    const char* name;
    const char* file;
    const char* canonical;
  };
  static const Known kKnown[] = {{"musique_s", "musique_s.json", "musique_s"},
                                 {"musique", "musique_s.json", "musique_s"},
                                 {"hotpotqa", "hotpotqa_dev200.jsonl", "hotpotqa_dev200"},
                                 {"hotpotqa_dev200", "hotpotqa_dev200.jsonl", "hotpotqa_dev200"}};
  const Known* known = nullptr;
  for (const auto& k : kKnown)
    if (name_or_file == k.name) known = &k;
  if (!known)
    throw std::runtime_error("dataset '" + name_or_file +
                             "' is neither a file nor a known name (musique_s, hotpotqa)");
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
  if (std::string(known->file).ends_with(".json")) return load_musique_json(file.string(), known->canonical);
  return load_hotpotqa_jsonl(file.string(), known->canonical);
}

}  // namespace cf::eval
