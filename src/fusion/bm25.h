// Okapi BM25 over a small in-memory corpus: FusionRAG's offline "top-n similar chunks of
// each chunk" (§3.1). The paper uses a dense embedding (BGE-M3); we have no embedding model
// offline, so similarity is lexical BM25 (the issue allows either; listed as a deviation in
// select_fusionrag.cpp).
//
// Terms are lowercase words, not the model's token ids: BPE ids split one word into
// case- and space-dependent pieces (" Paris" and "Paris" are different ids), which BM25
// would treat as unrelated terms. A word is a maximal run of ASCII letters and digits plus
// every byte >= 0x80 (so UTF-8 letters stay inside words, unchanged); ASCII letters are
// lowercased; everything else separates words.
//
//   idf(t)      = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))          (non-negative variant)
//   score(D, Q) = sum over DISTINCT terms t of Q of
//                 idf(t) * tf(t,D) * (k1 + 1) / (tf(t,D) + k1 * (1 - b + b * |D| / avgdl))
// with k1 = 1.2, b = 0.75. A chunk's neighbours are the documents scoring highest with the
// chunk's own text as the query, itself excluded, ties to the lower index, and only
// documents with a positive score (no shared term: not a neighbour).
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace cf {

std::vector<std::string> bm25_terms(std::string_view text);

struct Bm25Params {
  double k1 = 1.2;
  double b = 0.75;
};

class Bm25Index {
 public:
  explicit Bm25Index(const std::vector<std::vector<std::string>>& docs = {}, Bm25Params p = {});

  // Kept up to date instead of rebuilt (the knowledge base's retrieval, issue 59): add returns
  // the new document's slot (a freed one first); remove takes the document out, given the
  // terms it was added with. Slots of the constructor's documents are their indices; scores()
  // and top() are by slot, and a removed slot scores 0. Cost: the document's own postings.
  size_t add(const std::vector<std::string>& terms);
  void remove(size_t doc, const std::vector<std::string>& terms);
  // Every document with a positive score, by slot (unordered); touches only the query's postings.
  std::vector<std::pair<size_t, double>> positive_scores(const std::vector<std::string>& query) const;

  size_t size() const { return live_; }      // documents (removed ones not counted)
  size_t slots() const { return doc_len_.size(); }
  double average_length() const { return avgdl_; }
  double idf(const std::string& term) const;  // of a term absent from the corpus: idf with df = 0
  double score(const std::vector<std::string>& query, size_t doc) const;
  std::vector<double> scores(const std::vector<std::string>& query) const;  // every document
  // The n best documents with a positive score, best first (ties: lower index), skipping
  // `exclude` (pass size() to skip none).
  std::vector<std::pair<size_t, double>> top(const std::vector<std::string>& query, size_t n, size_t exclude) const;
  // Each document's top-n with its own terms as the query, itself excluded.
  std::vector<std::vector<size_t>> neighbours(const std::vector<std::vector<std::string>>& docs, size_t n) const;

 private:
  struct Posting {
    size_t doc;
    double tf;
  };
  double idf_of_df(size_t df) const;
  // Calls add(doc, term score) for each distinct query term and each document that has it:
  // the one BM25 sum behind scores() and positive_scores().
  template <class Add>
  void add_term_scores(const std::vector<std::string>& query, Add add) const;
  Bm25Params p_;
  void update_average();
  std::unordered_map<std::string, std::vector<Posting>> postings_;
  std::vector<double> doc_len_;  // by slot
  std::vector<size_t> free_;     // removed slots, reused by add
  size_t live_ = 0;
  double total_len_ = 0;
  double avgdl_ = 0;
};

}  // namespace cf
