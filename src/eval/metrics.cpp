#include "eval/metrics.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <stdexcept>
#include <unordered_map>

#include "runtime/sampler.h"

namespace cf::eval {
namespace {

bool is_ascii_punct(unsigned char c) {  // Python's string.punctuation
  return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
}
// Python's str.split() whitespace, ASCII part.
bool is_space(unsigned char c) { return c == ' ' || (c >= 9 && c <= 13) || (c >= 28 && c <= 31); }
// The regex \w, with every non-ASCII byte counted as part of a word (letters, mostly).
bool is_word(unsigned char c) { return std::isalnum(c) || c == '_' || c >= 0x80; }

std::vector<std::string> split_ws(std::string_view s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && is_space(s[i])) ++i;
    size_t j = i;
    while (j < s.size() && !is_space(s[j])) ++j;
    if (j > i) out.emplace_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

// re.sub(r'\b(a|an|the)\b', ' ', s)
std::string remove_articles(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    if (i == 0 || !is_word(s[i - 1])) {
      size_t len = 0;
      for (std::string_view art : {"a", "an", "the"}) {
        if (s.compare(i, art.size(), art) == 0 && (i + art.size() == s.size() || !is_word(s[i + art.size()]))) {
          len = art.size();
          break;
        }
      }
      if (len) {
        out += ' ';
        i += len;
        continue;
      }
    }
    out += s[i++];
  }
  return out;
}

double f1_of_tokens(const std::vector<std::string>& pred, const std::vector<std::string>& ref) {
  std::unordered_map<std::string, int> counts;
  for (const auto& t : ref) ++counts[t];
  size_t same = 0;
  for (const auto& t : pred) {
    auto it = counts.find(t);
    if (it != counts.end() && it->second > 0) {
      --it->second;
      ++same;
    }
  }
  if (same == 0) return 0.0;
  const double precision = static_cast<double>(same) / pred.size();
  const double recall = static_cast<double>(same) / ref.size();
  return 2 * precision * recall / (precision + recall);
}

size_t lcs_length(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  std::vector<size_t> prev(b.size() + 1, 0), cur(b.size() + 1, 0);
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = a[i - 1] == b[j - 1] ? prev[j - 1] + 1 : std::max(prev[j], cur[j - 1]);
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// How many gold strings the prediction contains, case-insensitively.
size_t contained_count(std::string_view prediction, const std::vector<std::string>& gold) {
  const std::string pred = ascii_lower(prediction);
  size_t n = 0;
  for (const auto& g : gold) n += pred.find(ascii_lower(g)) != std::string::npos;
  return n;
}

size_t argmax_index(std::span<const float> x) {
  size_t best = 0;
  for (size_t i = 1; i < x.size(); ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

}  // namespace

std::string normalize_answer(std::string_view s) {
  std::string t;
  t.reserve(s.size());
  for (unsigned char c : s) {
    if (is_ascii_punct(c)) continue;
    t += static_cast<char>(c < 0x80 ? std::tolower(c) : c);
  }
  std::string out;
  for (const auto& w : split_ws(remove_articles(t))) {
    if (!out.empty()) out += ' ';
    out += w;
  }
  return out;
}

std::vector<std::string> normalized_tokens(std::string_view s) { return split_ws(normalize_answer(s)); }

double token_f1(std::string_view prediction, std::string_view reference) {
  return f1_of_tokens(normalized_tokens(prediction), normalized_tokens(reference));
}

double qa_f1(std::string_view prediction, const std::vector<std::string>& gold) {
  const auto pred = normalized_tokens(prediction);
  double best = 0;
  for (const auto& g : gold) best = std::max(best, f1_of_tokens(pred, normalized_tokens(g)));
  return best;
}

double exact_match(std::string_view prediction, const std::vector<std::string>& gold) {
  const std::string pred = normalize_answer(prediction);
  for (const auto& g : gold)
    if (normalize_answer(g) == pred) return 1.0;
  return 0.0;
}

double rouge_l(std::string_view prediction, std::string_view reference) {
  const auto p = normalized_tokens(prediction), r = normalized_tokens(reference);
  if (p.empty() || r.empty()) return 0.0;
  const size_t lcs = lcs_length(p, r);
  if (lcs == 0) return 0.0;
  const double precision = static_cast<double>(lcs) / p.size(), recall = static_cast<double>(lcs) / r.size();
  return 2 * precision * recall / (precision + recall);
}

double rouge_l(std::string_view prediction, const std::vector<std::string>& gold) {
  double best = 0;
  for (const auto& g : gold) best = std::max(best, rouge_l(prediction, g));
  return best;
}

double string_match_all(std::string_view prediction, const std::vector<std::string>& gold) {
  if (gold.empty()) return 0.0;
  return static_cast<double>(contained_count(prediction, gold)) / static_cast<double>(gold.size());
}

double string_match_part(std::string_view prediction, const std::vector<std::string>& gold) {
  return contained_count(prediction, gold) > 0 ? 1.0 : 0.0;
}

double fidelity_f1(std::string_view method_answer, std::string_view full_answer) {
  const auto m = normalized_tokens(method_answer), f = normalized_tokens(full_answer);
  if (m.empty() && f.empty()) return 1.0;
  return f1_of_tokens(m, f);
}

double kl_divergence_from_logits(std::span<const float> reference, std::span<const float> method) {
  if (reference.size() != method.size() || reference.empty())
    throw std::invalid_argument("kl_divergence_from_logits: distributions of different or zero size");
  const auto lp = log_softmax(reference), lq = log_softmax(method);
  double kl = 0;
  for (size_t i = 0; i < lp.size(); ++i) {
    const double p = std::exp(lp[i]);
    if (p > 0) kl += p * (lp[i] - lq[i]);
  }
  return std::max(0.0, kl);  // rounding can leave a tiny negative for identical inputs
}

bool first_token_agrees(std::span<const float> reference, std::span<const float> method) {
  if (reference.size() != method.size() || reference.empty())
    throw std::invalid_argument("first_token_agrees: distributions of different or zero size");
  return argmax_index(reference) == argmax_index(method);
}

}  // namespace cf::eval
