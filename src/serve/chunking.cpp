#include "serve/chunking.h"

namespace cf {

namespace {

std::string_view trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  const size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

std::vector<std::string_view> paragraphs(std::string_view text) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (start < text.size()) {
    // A paragraph ends at a line holding only whitespace.
    size_t pos = start, end = text.size(), next = text.size();
    while (pos < text.size()) {
      const size_t nl = text.find('\n', pos);
      if (nl == std::string_view::npos) break;
      const size_t nl2 = text.find('\n', nl + 1);
      const std::string_view between = text.substr(nl + 1, (nl2 == std::string_view::npos ? text.size() : nl2) - nl - 1);
      if (nl2 != std::string_view::npos && trim(between).empty()) {
        end = nl;
        next = nl2 + 1;
        break;
      }
      pos = nl + 1;
    }
    const auto p = trim(text.substr(start, end - start));
    if (!p.empty()) out.push_back(p);
    start = next;
  }
  return out;
}

// Pieces of s cut after each occurrence of one of `ends` followed by whitespace.
std::vector<std::string_view> cut(std::string_view s, bool sentences) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const bool space = s[i] == ' ' || s[i] == '\n' || s[i] == '\t';
    const bool boundary = sentences ? (space && i > 0 && (s[i - 1] == '.' || s[i - 1] == '!' || s[i - 1] == '?')) : space;
    if (boundary) {
      const auto piece = trim(s.substr(start, i - start));
      if (!piece.empty()) out.push_back(piece);
      start = i + 1;
    }
  }
  const auto last = trim(s.substr(start));
  if (!last.empty()) out.push_back(last);
  return out;
}

// Greedy packing of units (with their token counts) into chunks of at most max_tokens.
struct Packer {
  size_t max_tokens;
  std::vector<std::string>& out;
  std::string cur;
  size_t cur_tokens = 0;
  void add(std::string_view unit, size_t tokens, const char* sep) {
    if (!cur.empty() && cur_tokens + tokens > max_tokens) flush();
    if (!cur.empty()) cur += sep;
    cur += unit;
    cur_tokens += tokens;
  }
  void flush() {
    if (!cur.empty()) out.push_back(std::move(cur));
    cur.clear();
    cur_tokens = 0;
  }
};

}  // namespace

std::vector<std::string> split_into_chunks(std::string_view text, size_t max_tokens, const TokenCounter& count) {
  std::vector<std::string> out;
  if (max_tokens == 0) max_tokens = 1;
  Packer pk{max_tokens, out, {}, 0};
  for (auto para : paragraphs(text)) {
    const size_t n = count(para);
    if (n <= max_tokens) {
      pk.add(para, n, "\n\n");
      continue;
    }
    pk.flush();  // a long paragraph starts its own chunks
    for (auto sentence : cut(para, true)) {
      const size_t ns = count(sentence);
      if (ns <= max_tokens) {
        pk.add(sentence, ns, " ");
        continue;
      }
      for (auto word : cut(sentence, false)) pk.add(word, count(word), " ");
    }
    pk.flush();
  }
  pk.flush();
  return out;
}

std::string first_sentence(std::string_view text, size_t max_chars) {
  text = trim(text);
  size_t end = text.size();
  for (size_t i = 0; i + 1 < text.size(); ++i) {
    const char c = text[i];
    if ((c == '.' || c == '!' || c == '?') && (text[i + 1] == ' ' || text[i + 1] == '\n')) {
      end = i + 1;
      break;
    }
    if (c == '\n' && text[i + 1] == '\n') {
      end = i;
      break;
    }
  }
  std::string s(text.substr(0, end));
  for (char& c : s)
    if (c == '\n' || c == '\t' || c == '\r') c = ' ';
  if (s.size() > max_chars) {
    size_t cutat = max_chars;
    while (cutat > 0 && (static_cast<unsigned char>(s[cutat]) & 0xC0) == 0x80) --cutat;  // not inside a character
    s = s.substr(0, cutat) + "\xE2\x80\xA6";
  }
  return s;
}

}  // namespace cf
