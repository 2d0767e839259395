#include "fusion/bm25.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_set>

namespace cf {
namespace {
bool is_word_byte(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80;
}
std::vector<std::string> distinct(const std::vector<std::string>& terms) {
  std::vector<std::string> out;
  std::unordered_set<std::string> seen;
  for (const auto& t : terms)
    if (seen.insert(t).second) out.push_back(t);
  return out;
}
}  // namespace

std::vector<std::string> bm25_terms(std::string_view text) {
  std::vector<std::string> terms;
  std::string cur;
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (is_word_byte(c)) {
      cur.push_back(c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : ch);
    } else if (!cur.empty()) {
      terms.push_back(std::move(cur));
      cur.clear();
    }
  }
  if (!cur.empty()) terms.push_back(std::move(cur));
  return terms;
}

Bm25Index::Bm25Index(const std::vector<std::vector<std::string>>& docs, Bm25Params p) : p_(p) {
  doc_len_.reserve(docs.size());
  for (const auto& d : docs) add(d);
}

void Bm25Index::update_average() { avgdl_ = live_ == 0 ? 0 : total_len_ / static_cast<double>(live_); }

size_t Bm25Index::add(const std::vector<std::string>& terms) {
  size_t d = doc_len_.size();
  if (!free_.empty()) {
    d = free_.back();
    free_.pop_back();
  } else {
    doc_len_.push_back(0);
  }
  std::unordered_map<std::string, double> tf;
  for (const auto& t : terms) tf[t] += 1;
  for (auto& [term, count] : tf) postings_[term].push_back({d, count});
  doc_len_[d] = static_cast<double>(terms.size());
  total_len_ += doc_len_[d];
  ++live_;
  update_average();
  return d;
}

void Bm25Index::remove(size_t doc, const std::vector<std::string>& terms) {
  for (const auto& term : distinct(terms)) {
    auto it = postings_.find(term);
    if (it == postings_.end()) continue;
    auto& list = it->second;
    list.erase(std::remove_if(list.begin(), list.end(), [&](const Posting& p) { return p.doc == doc; }), list.end());
    if (list.empty()) postings_.erase(it);
  }
  total_len_ -= doc_len_.at(doc);
  doc_len_[doc] = 0;
  free_.push_back(doc);
  --live_;
  if (live_ == 0) total_len_ = 0;  // no rounding left behind
  update_average();
}

template <class Add>
void Bm25Index::add_term_scores(const std::vector<std::string>& query, Add add) const {
  if (avgdl_ <= 0) return;
  for (const auto& term : distinct(query)) {
    auto it = postings_.find(term);
    if (it == postings_.end()) continue;
    const double w = idf_of_df(it->second.size());
    for (const Posting& post : it->second) {
      const double norm = p_.k1 * (1 - p_.b + p_.b * doc_len_[post.doc] / avgdl_);
      add(post.doc, w * post.tf * (p_.k1 + 1) / (post.tf + norm));
    }
  }
}

std::vector<std::pair<size_t, double>> Bm25Index::positive_scores(const std::vector<std::string>& query) const {
  std::unordered_map<size_t, double> s;
  add_term_scores(query, [&](size_t doc, double v) { s[doc] += v; });
  std::vector<std::pair<size_t, double>> out;
  for (const auto& [d, v] : s)
    if (v > 0) out.emplace_back(d, v);
  return out;
}

double Bm25Index::idf_of_df(size_t df) const {
  const double n = static_cast<double>(size()), f = static_cast<double>(df);
  return std::log(1.0 + (n - f + 0.5) / (f + 0.5));
}

double Bm25Index::idf(const std::string& term) const {
  auto it = postings_.find(term);
  return idf_of_df(it == postings_.end() ? 0 : it->second.size());
}

std::vector<double> Bm25Index::scores(const std::vector<std::string>& query) const {
  std::vector<double> s(slots(), 0.0);
  add_term_scores(query, [&](size_t doc, double v) { s[doc] += v; });
  return s;
}

double Bm25Index::score(const std::vector<std::string>& query, size_t doc) const { return scores(query).at(doc); }

std::vector<std::pair<size_t, double>> Bm25Index::top(const std::vector<std::string>& query, size_t n,
                                                      size_t exclude) const {
  const std::vector<double> s = scores(query);
  std::vector<size_t> idx;
  for (size_t d = 0; d < s.size(); ++d)
    if (d != exclude && s[d] > 0) idx.push_back(d);
  const size_t k = std::min(n, idx.size());
  std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end(),
                    [&](size_t a, size_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); });
  std::vector<std::pair<size_t, double>> out;
  for (size_t i = 0; i < k; ++i) out.emplace_back(idx[i], s[idx[i]]);
  return out;
}

std::vector<std::vector<size_t>> Bm25Index::neighbours(const std::vector<std::vector<std::string>>& docs,
                                                       size_t n) const {
  std::vector<std::vector<size_t>> out(docs.size());
  for (size_t d = 0; d < docs.size(); ++d)
    for (const auto& [doc, s] : top(docs[d], n, d)) out[d].push_back(doc);
  return out;
}

}  // namespace cf
