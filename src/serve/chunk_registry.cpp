#include "serve/chunk_registry.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <system_error>

#include "base/bounded_json.h"

#include "kv/store_paths.h"
#include "serve/request.h"
#include "serve/prompt_layout.h"
#include "serve/store_write.h"

namespace cf {

namespace {

namespace fs = std::filesystem;

// The texts of the index at `path`; std::runtime_error saying why when it is not one (not a
// regular file, unreadable, not JSON, another shape).
std::vector<std::string> read_index_texts(const std::string& path) {
  if (!is_real_file(path)) throw std::runtime_error("not a regular file (a link or a folder)");
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) throw std::runtime_error("cannot read it");
  const nlohmann::json j = parse_json_bounded(text.str());
  if (!j.is_object() || !j.contains("chunks") || !j["chunks"].is_array())
    throw std::runtime_error("not a chunk index (no \"chunks\" list)");
  std::vector<std::string> texts;
  for (const auto& t : j["chunks"]) {
    if (!t.is_string()) throw std::runtime_error("a chunk that is not a string");
    texts.push_back(t.get<std::string>());
  }
  return texts;
}

// <path>.damaged-<UTC time>: each damaged index is kept for inspection, none replaces another.
std::string damaged_name(const std::string& path) {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &utc);
  return path + ".damaged-" + stamp;
}

// Moves a damaged index aside (the link itself, never its target) and says so on stderr.
void set_aside(const std::string& path, const std::string& why) {
  const std::string aside = damaged_name(path);
  std::error_code ec;
  fs::rename(path, aside, ec);
  const std::string where = ec ? "it stays (could not move it: " + ec.message() + ")" : "moved aside to " + aside;
  std::fprintf(stderr,
               "chunkfuse serve: warning: chunk index %s is damaged (%s); %s, starting with no registered chunks "
               "(their caches stay in the store: registering a text again finds its cache)\n",
               path.c_str(), why.c_str(), where.c_str());
}

}  // namespace

ChunkRegistry::ChunkRegistry(std::string index_path, ChunkOf chunk_of, size_t budget_bytes)
    : path_(std::move(index_path)),
      chunk_of_(std::move(chunk_of)),
      journal_path_(path_ + ".journal"),
      budget_bytes_(budget_bytes) {
  std::error_code ec;
  if (fs::exists(fs::symlink_status(path_, ec))) {
    std::vector<std::string> texts;
    try {
      texts = read_index_texts(path_);
      index_bytes_now_ = static_cast<size_t>(fs::file_size(path_, ec));
    } catch (const std::exception& e) {  // a damaged index never stops start-up (issue 59)
      set_aside(path_, e.what());
    }
    for (const auto& text : texts) {
      RegisteredChunk c = chunk_of_(text);  // id recomputed: another model gives other ids
      keep_locked(std::move(c));
    }
  }
  read_journal();
}

// The journal's complete lines after the index; then, when there was one, the index rewritten
// with everything and the journal removed (or, if that write fails, the journal cut back to
// its last complete line, so the next append starts a line of its own).
void ChunkRegistry::read_journal() {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(journal_path_, ec))) return;
  size_t good = 0;  // bytes of complete, valid lines
  try {
    if (!is_real_file(journal_path_)) throw std::runtime_error("not a regular file (a link or a folder)");
    std::ifstream in(journal_path_, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!in && !in.eof()) throw std::runtime_error("cannot read it");
    const std::string text = ss.str();
    for (size_t at = 0;;) {
      const size_t nl = text.find('\n', at);
      if (nl == std::string::npos) break;  // a torn last line (or none): left out
      const nlohmann::json j = parse_json_bounded(std::string_view(text).substr(at, nl - at));
      if (!j.is_string()) throw std::runtime_error("a journal line that is not a string");
      RegisteredChunk c = chunk_of_(j.get<std::string>());
      keep_locked(std::move(c));
      good = at = nl + 1;
    }
  } catch (const std::exception& e) {
    set_aside(journal_path_, std::string(e.what()) + "; the lines before it are kept");
    good = 0;
  }
  std::map<std::string, const std::string*> all;
  for (const auto& [id, c] : chunks_) all[id] = &c.text;
  try {
    save_locked(all);  // no other thread yet
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chunkfuse serve: warning: chunk index %s could not be rewritten (%s); its journal stays\n",
                 path_.c_str(), e.what());
    if (fs::exists(fs::symlink_status(journal_path_, ec)) && ::truncate(journal_path_.c_str(), static_cast<off_t>(good)) == 0)
      journal_bytes_ = good;
  }
}

std::optional<RegisteredChunk> ChunkRegistry::find(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = chunks_.find(id);
  if (it == chunks_.end()) return std::nullopt;
  return it->second;
}

void ChunkRegistry::lay_out_documents(const std::vector<DocumentRef>& documents, PromptLayout& l) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < documents.size(); ++i) {
    const DocumentRef& d = documents[i];
    if (!d.id.empty() && !d.text.empty())
      throw invalid_request("documents[" + std::to_string(i) + "] gives both text and id; give one", "documents");
    if (!d.id.empty()) {
      auto it = chunks_.find(d.id);
      if (it == chunks_.end())
        throw RequestError(404, "not_found_error", "unknown chunk id \"" + d.id + "\" (register it with POST /v1/chunks)",
                           "documents");
      l.chunks.push_back(it->second.tokens);
      l.chunk_ids.push_back(d.id);
    } else {
      if (d.text.empty())
        throw invalid_request("documents[" + std::to_string(i) + "] is empty", "documents");
      RegisteredChunk c = chunk_of_(d.text);
      l.chunks.push_back(std::move(c.tokens));
      l.chunk_ids.push_back(std::move(c.id));
    }
  }
}

// Write, then commit (issue 59): the index is written as it will be after the change, and the
// change is made in memory only once the file is in place; a failed write (a full disk) is
// RequestError 507/503 with nothing changed.
void ChunkRegistry::add(std::vector<RegisteredChunk> chunks) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string lines;  // the new texts, one JSON string a line
  std::map<std::string, const std::string*> fresh;
  for (const auto& c : chunks)
    if (!chunks_.count(c.id) && fresh.emplace(c.id, &c.text).second) lines += nlohmann::json(c.text).dump() + "\n";
  if (fresh.empty()) return;  // all registered already: nothing changes, nothing is written
  size_t more = 0;
  auto is_new = [&](const RegisteredChunk& c) {  // each new id once: its first occurrence
    auto it = fresh.find(c.id);
    return it != fresh.end() && it->second == &c.text;
  };
  for (const auto& c : chunks)
    if (is_new(c)) more += bytes_of(c);
  if (budget_bytes_ && bytes_ + more > budget_bytes_)
    throw invalid_request("the registered chunks would take " + std::to_string(bytes_ + more) + " bytes, over this server's " +
                              std::to_string(budget_bytes_) + " (serve --registry-budget; DELETE /v1/chunks/{id} frees room)",
                          "input", 409);
  bool appended = false;
  if (journal_bytes_ + lines.size() <= index_bytes_now_) {
    try {
      append_locked(lines);
      appended = true;
    } catch (const std::exception&) {  // a link at the journal's name, a fault: the whole index below
    }
  }
  if (!appended) {
    std::map<std::string, const std::string*> next = fresh;  // id -> text, the index after the change
    for (const auto& [id, c] : chunks_) next[id] = &c.text;
    save_locked(next);
  }
  for (auto& c : chunks)
    if (is_new(c)) keep_locked(std::move(c));
  ++version_;
}

bool ChunkRegistry::remove(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = chunks_.find(id);
  if (it == chunks_.end()) return false;
  std::map<std::string, const std::string*> next;
  for (const auto& [other, c] : chunks_)
    if (other != id) next[other] = &c.text;
  save_locked(next);
  bytes_ -= bytes_of(it->second);
  chunks_.erase(it);
  ++version_;
  return true;
}

void ChunkRegistry::keep_locked(RegisteredChunk c) {
  auto [it, fresh] = chunks_.try_emplace(c.id);
  if (!fresh) bytes_ -= bytes_of(it->second);
  bytes_ += bytes_of(c);
  it->second = std::move(c);
}

size_t ChunkRegistry::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

std::vector<std::string> ChunkRegistry::texts() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  out.reserve(chunks_.size());
  for (const auto& [id, c] : chunks_) out.push_back(c.text);
  return out;
}

void ChunkRegistry::save_locked(const std::map<std::string, const std::string*>& texts_by_id) {
  nlohmann::json texts = nlohmann::json::array();
  for (const auto& [id, text] : texts_by_id) texts.push_back(*text);
  // Document texts: a fresh 0600 temp file (O_EXCL|O_NOFOLLOW, never a planted link), fsync,
  // rename; the store's one atomic writer (issue 29 item 11).
  try {
    index_bytes_now_ = write_private_file_atomic(path_, nlohmann::json{{"version", 1}, {"chunks", texts}}.dump());
    index_bytes_ += index_bytes_now_;
    ++index_writes_;
  } catch (const std::exception& e) {
    throw store_write_error("the chunk index", e);
  }
  // The index holds everything now: the journal (or a link planted at its name) goes.
  std::error_code ec;
  if (fs::remove(journal_path_, ec) || !ec) journal_bytes_ = 0;
  else if (::truncate(journal_path_.c_str(), 0) == 0) journal_bytes_ = 0;
  else std::fprintf(stderr, "chunkfuse serve: warning: cannot remove %s: %s\n", journal_path_.c_str(), ec.message().c_str());
}

// O_APPEND to a private regular file (never through a link), then fsync; on any failure the
// file is cut back to its size before, so a refused registration leaves no line behind.
void ChunkRegistry::append_locked(const std::string& lines) {
  const int fd = ::open(journal_path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
                        kPrivateFileMode);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "cannot open " + journal_path_);
  struct stat st {};
  int code = 0;
  std::string what;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    code = errno ? errno : EINVAL;
    what = "not a regular file";
  }
  const bool created = code == 0 && st.st_size == 0;
  size_t left = lines.size();
  for (const char* p = lines.data(); code == 0 && left > 0;) {
    errno = 0;
    const ssize_t w = ::write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) code = errno ? errno : EIO, what = "write";
    else p += w, left -= static_cast<size_t>(w);
  }
  if (code == 0 && ::fsync(fd) != 0) code = errno, what = "fsync";
  if (code != 0 && S_ISREG(st.st_mode)) (void)::ftruncate(fd, st.st_size);
  ::close(fd);
  if (code != 0) throw std::system_error(code, std::generic_category(), "appending to " + journal_path_ + ": " + what);
  if (created) {  // a new name is durable once its directory entry is
    const int dfd = ::open(fs::path(journal_path_).parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }
  journal_bytes_ = static_cast<size_t>(st.st_size) + lines.size();
  index_bytes_ += lines.size();
  ++index_writes_;
}

}  // namespace cf
