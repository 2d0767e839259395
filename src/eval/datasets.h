// QA datasets for the benchmark (issue 4, item 2): each example is a question, its gold
// answers and its retrieved passages in retrieval order; each passage becomes one chunk
// (unless the runner re-chunks, see bench_request.h).
//
//   musique_s        <data-dir>/musique_s.json: one JSON array of {ctxs:[{title,text}], question, answers}
//   hotpotqa         <data-dir>/hotpotqa_dev200.jsonl: official HotpotQA schema; a passage is the
//   (hotpotqa_dev200) context entry's title + its sentences joined as given; answers = [answer]
//   nq_open_oracle   <data-dir>/nq_open_oracle.jsonl.gz: {question, answers, ctxs:[gold]}; the
//   (nq)             gold passage plus kNqDistractors gold passages of other examples, drawn
//                    with the seed, at a seeded position (see load_nq_oracle)
//   kv_retrieval     <data-dir>/kv_retrieval_75keys.jsonl.gz: {ordered_kv_records, key, value};
//   (kv_retrieval_75keys) the records as passages of kKvPairsPerChunk pairs (see load_kv_retrieval)
//   rgb_en_fact      <data-dir>/rgb_en_fact.jsonl: RGB {query, answer, positive, negative}; the
//   (rgb)            positive + negative passages in a seeded order (CC BY-NC-SA 4.0: evaluation only)
//   ruler:TASK:LEN   generated, not read: RULER-style synthetic tasks (ruler.h); needs a tokenizer
//   any file         the formats above (recognised by content), or a user's JSON Lines
//                    {question, answers:[str], passages:[{title,text}], id?}
// Files may be gzip-compressed (read through zlib).
//
// Malformed input throws std::runtime_error naming the file and the line (JSON Lines) or
// the line/example (JSON array).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fusion/rag_prompt.h"

namespace cf {
class Tokenizer;
}

namespace cf::eval {

struct QaExample {
  std::string id;  // the dataset's id, else the example's index (0-based)
  std::string question;
  std::vector<std::string> answers;
  std::vector<Passage> passages;
  // false: the answers are alternatives (any one is right); true: every one must appear in
  // the prediction (RULER multi-value and variable tracking). Decides the string-match score.
  bool all_answers_required = false;
};

struct Dataset {
  std::string name;  // musique_s, hotpotqa_dev200, or the file's stem
  std::string path;
  std::vector<QaExample> examples;
};

Dataset load_musique_json(const std::string& path, const std::string& name = "musique_s");
Dataset load_hotpotqa_jsonl(const std::string& path, const std::string& name = "hotpotqa_dev200");
Dataset load_user_jsonl(const std::string& path, const std::string& name);

// Lost-in-the-middle's NQ-open oracle file, {question, answers, ctxs:[{title,text}]}. An
// example with a single passage (the oracle file) gets `distractors` more: gold passages of
// other examples, drawn without replacement with a generator seeded by (seed, example
// index), skipping ones with the same title or containing a gold answer; the gold passage
// goes to a seeded position among them. An example with several ctxs keeps them as given.
inline constexpr size_t kNqDistractors = 9;
Dataset load_nq_oracle(const std::string& path, const std::string& name = "nq_open_oracle", uint64_t seed = 0,
                       size_t distractors = kNqDistractors);

// Lost-in-the-middle's key-value retrieval. The records, in their given order, become
// passages of `pairs_per_chunk` lines `"<key>": "<value>"` (no title); the question asks for
// the value of `key`; the gold answer is `value` (scored by string match). 75 pairs / 5 per
// chunk = 15 chunks of about 250 tokens with SmolLM2's tokenizer.
inline constexpr size_t kKvPairsPerChunk = 5;
Dataset load_kv_retrieval(const std::string& path, const std::string& name = "kv_retrieval_75keys",
                          size_t pairs_per_chunk = kKvPairsPerChunk);

// RGB (English, counterfactual split): question = query, passages = positive + negative
// (untitled) shuffled with a generator seeded by (seed, example index), as RGB shuffles its
// documents; answers = answer (a string, or RGB's list of lists of alternatives, flattened).
// positive_wrong and fakeanswer are not used. Licence CC BY-NC-SA 4.0: evaluation only.
Dataset load_rgb(const std::string& path, const std::string& name = "rgb_en_fact", uint64_t seed = 0);

// A file in any of the formats above, chosen by its content (gzip or plain).
Dataset load_dataset_file(const std::string& path, uint64_t seed = 0);

// ../shared/datasets beside the repository root, found by walking up from the running
// executable and from the working directory; nullopt when there is none.
std::optional<std::string> default_data_dir();
// The repository root (a folder with CMakeLists.txt and src/eval/), found the same way.
std::optional<std::string> find_repo_root();

// `name_or_file`: an existing file, else a known name resolved against `data_dir` (empty:
// default_data_dir(), else an error telling the user to pass --data-dir), else a RULER name
// (ruler:TASK:LENGTH, generated with `tokenizer`, which it then requires). `seed` drives the
// sampling of nq_open_oracle, rgb_en_fact and RULER.
Dataset load_dataset(const std::string& name_or_file, const std::string& data_dir = "", uint64_t seed = 0,
                     const Tokenizer* tokenizer = nullptr);

// splitmix64: the one seeded generator of the loaders and the RULER generator; its output
// is the same on every platform (std:: distributions are not).
class SeededRng {
 public:
  explicit SeededRng(uint64_t seed) : state_(seed) {}
  SeededRng(uint64_t seed, uint64_t stream) : state_(seed * 0x9E3779B97F4A7C15ull ^ (stream + 0x632BE59BD9B4E019ull)) {}
  uint64_t next();
  size_t below(size_t n);  // uniform in [0, n), n > 0
  template <typename T>
  void shuffle(std::vector<T>& v) {  // Fisher-Yates
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(i)]);
  }

 private:
  uint64_t state_;
};

}  // namespace cf::eval
