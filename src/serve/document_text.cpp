#include "serve/document_text.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <vector>

#include "base/bounded_json.h"
#include "serve/request.h"

namespace cf {

namespace {

RequestError bad(const std::string& msg) { return invalid_request(msg, "file"); }

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

// Text formats must be UTF-8 without NUL bytes: anything else is a binary file misnamed.
void check_text(std::string_view bytes) {
  if (bytes.find('\0') != std::string_view::npos || !valid_utf8(bytes))
    throw bad("the file is not UTF-8 text (a binary file?)");
}

// One CSV record's fields (RFC 4180 quoting: "" inside quotes is a quote).
std::vector<std::string> csv_fields(std::string_view line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        out.back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        out.back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.emplace_back();
    } else if (c != '\r') {
      out.back() += c;
    }
  }
  return out;
}

std::vector<std::string_view> lines_of(std::string_view s) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t nl = s.find('\n', start);
    if (nl == std::string_view::npos) nl = s.size();
    out.push_back(s.substr(start, nl - start));
    start = nl + 1;
  }
  return out;
}

// The extracted text, refused with 413 once it would pass the cap (issue 29, item 2): a CSV
// repeats its header in every row, so a 4 MB column name over two million one-byte rows
// would otherwise ask for terabytes; every format gets the same bound as pdftotext's output.
class CappedText {
 public:
  explicit CappedText(size_t cap) : cap_(cap) {}
  void append(std::string_view s) {
    if (s.size() > cap_ - out_.size())
      throw invalid_request("the document's text is larger than " + std::to_string(cap_ >> 20) + " MiB", "file", 413);
    out_ += s;
  }
  std::string take() { return std::move(out_); }

 private:
  size_t cap_;
  std::string out_;
};

std::string csv_text(std::string_view bytes, size_t cap) {
  std::vector<std::string> header;
  CappedText out(cap);
  for (auto line : lines_of(bytes)) {
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    auto fields = csv_fields(line);
    if (header.empty()) {
      header = std::move(fields);
      continue;
    }
    for (size_t i = 0; i < fields.size(); ++i) {
      if (i > 0) out.append("; ");
      out.append(i < header.size() ? header[i] : "column " + std::to_string(i + 1));
      out.append(": ");
      out.append(fields[i]);
    }
    out.append("\n\n");
  }
  return out.take();
}

std::string jsonl_text(std::string_view bytes, size_t cap) {
  CappedText out(cap);
  size_t n = 0;
  for (auto line : lines_of(bytes)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    nlohmann::json j;
    try {
      j = parse_json_bounded(line, /*allow_exceptions=*/false);
    } catch (const JsonTooDeep& e) {  // issue 29, item 1: j.dump() below would recurse per level
      throw bad("line " + std::to_string(n) + " nests deeper than " + std::to_string(e.limit) + " levels");
    }
    if (j.is_discarded()) throw bad("line " + std::to_string(n) + " is not JSON");
    std::string para;
    if (j.is_object()) {
      for (const char* key : {"title", "text", "content"})
        if (j.contains(key) && j[key].is_string()) {
          if (!para.empty()) para += '\n';
          para += j[key].get<std::string>();
        }
    } else if (j.is_string()) {
      para = j.get<std::string>();
    }
    if (para.empty()) para = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    out.append(para);
    out.append("\n\n");
  }
  return out.take();
}

std::string temp_dir() {
  const char* t = std::getenv("TMPDIR");
  return t && *t ? t : "/tmp";
}

}  // namespace

bool valid_utf8(std::string_view s) {
  try {
    (void)nlohmann::json(std::string(s)).dump();  // nlohmann's strict UTF-8 check
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

std::string document_format(std::string_view file_name) {
  const size_t dot = file_name.rfind('.');
  if (dot == std::string_view::npos) return "";
  const std::string ext = lower(file_name.substr(dot + 1));
  if (ext == "txt" || ext == "text") return "txt";
  if (ext == "md" || ext == "markdown") return "md";
  if (ext == "csv" || ext == "jsonl" || ext == "pdf") return ext;
  return "";
}

std::string extract_document_text(const std::string& format, std::string_view bytes, const ExtractOptions& opt) {
  if (bytes.empty()) throw bad("the file is empty");
  if (format == "pdf") return pdf_to_text(bytes, opt);
  if (format != "txt" && format != "md" && format != "csv" && format != "jsonl")
    throw invalid_request("unknown document format '" + format + "' (known: .txt, .md, .csv, .jsonl, .pdf)", "name", 415);
  check_text(bytes);
  if (format == "csv") return csv_text(bytes, opt.max_text_bytes);
  if (format == "jsonl") return jsonl_text(bytes, opt.max_text_bytes);
  CappedText out(opt.max_text_bytes);
  out.append(bytes);
  return out.take();
}

namespace {

// The upload in a private temp file (pdftotext reads a path); removed when this goes.
struct PdfFile {
  std::string path = temp_dir() + "/chunkfuse-upload-XXXXXX";
  explicit PdfFile(std::string_view pdf) {
    const int fd = mkstemp(path.data());
    if (fd < 0) throw std::runtime_error("cannot create a temporary file for the PDF");
    for (size_t off = 0; off < pdf.size();) {
      const ssize_t w = write(fd, pdf.data() + off, pdf.size() - off);
      if (w <= 0) {
        close(fd);
        unlink(path.c_str());
        throw std::runtime_error("cannot write the PDF to a temporary file");
      }
      off += static_cast<size_t>(w);
    }
    close(fd);
  }
  ~PdfFile() { unlink(path.c_str()); }
};

// pdftotext on `path`, its stdout on the returned read end, under RLIMIT_CPU and RLIMIT_AS
// (set in the child between fork and exec: only async-signal-safe calls there). An exec that
// fails (no pdftotext) is told through a close-on-exec pipe: 503.
int spawn_pdftotext(const ExtractOptions& opt, const std::string& path, pid_t& pid) {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    throw std::runtime_error("pipe failed");
  }
  std::vector<std::string> args{opt.pdftotext, "-q", "-enc", "UTF-8", path, "-"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const rlim_t cpu = static_cast<rlim_t>((opt.pdf_timeout_ms + 999) / 1000);
  const rlimit cpu_limit{cpu, cpu + 1}, as_limit{opt.pdf_memory_bytes, opt.pdf_memory_bytes};
  pid = fork();
  if (pid == 0) {
    const int null_in = open("/dev/null", O_RDONLY), null_out = open("/dev/null", O_WRONLY);
    dup2(null_in, STDIN_FILENO);
    dup2(out[1], STDOUT_FILENO);
    dup2(null_out, STDERR_FILENO);
    setrlimit(RLIMIT_CPU, &cpu_limit);
    if (opt.pdf_memory_bytes > 0) setrlimit(RLIMIT_AS, &as_limit);
    execvp(argv[0], argv.data());
    const int e = errno;
    (void)!write(err[1], &e, sizeof e);
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  int exec_errno = 0;
  const bool exec_failed = pid > 0 && read(err[0], &exec_errno, sizeof exec_errno) == sizeof exec_errno;
  close(err[0]);
  if (pid < 0 || exec_failed) {
    close(out[0]);
    if (pid > 0) waitpid(pid, nullptr, 0);
    if (pid < 0) throw RequestError(503, "server_error", "cannot start `pdftotext` (fork failed); retry later", "file");
    throw RequestError(503, "server_error", "PDF support needs `pdftotext` (Debian package poppler-utils)", "file");
  }
  return out[0];
}

// What the reader's limits are, for the messages.
std::string pdf_limits(const ExtractOptions& opt) {
  std::string s = std::to_string((opt.pdf_timeout_ms + 999) / 1000) + " s";
  if (opt.pdf_memory_bytes > 0) s += ", " + std::to_string(opt.pdf_memory_bytes >> 20) + " MiB of memory";
  return s;
}

}  // namespace

// pdftotext with a wall-clock deadline, RLIMIT_CPU and RLIMIT_AS, its output capped at
// max_text_bytes (killed past it); the knowledge base caps how many run at once (issue 59).
std::string pdf_to_text(std::string_view pdf, const ExtractOptions& opt) {
  if (pdf.substr(0, 5) != "%PDF-") throw bad("the file is not a PDF (it does not start with %PDF-)");
  const PdfFile file(pdf);
  pid_t pid = 0;
  const int out = spawn_pdftotext(opt, file.path, pid);
  std::string text;
  bool timed_out = false, too_big = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(opt.pdf_timeout_ms);
  char buf[65536];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{out, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;  // timeout rechecked above (EINTR too)
    const ssize_t n = read(out, buf, sizeof buf);
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > opt.max_text_bytes) {
      too_big = true;
      break;
    }
  }
  close(out);
  if (timed_out || too_big) kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  if (timed_out) throw bad("the PDF took too long to read (over " + std::to_string(opt.pdf_timeout_ms / 1000) + " s)");
  if (too_big) throw invalid_request("the PDF's text is too large", "file", 413);
  if (WIFSIGNALED(status))  // SIGXCPU past the CPU limit, SIGABRT/SIGSEGV when memory ran out
    throw invalid_request("reading the PDF needed more than the reader's limits (" + pdf_limits(opt) + "; pdftotext got signal " +
                           std::to_string(WTERMSIG(status)) + ")", "file", 413);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw bad("the PDF could not be read (damaged or encrypted, or past the reader's limits: " + pdf_limits(opt) + ")");
  // pdftotext separates pages with form feeds: make them paragraph breaks.
  std::replace(text.begin(), text.end(), '\f', '\n');
  if (!valid_utf8(text)) throw bad("the PDF's text is not valid UTF-8");
  return text;
}

}  // namespace cf
