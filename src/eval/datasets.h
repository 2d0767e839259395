// QA datasets for the benchmark (issue 4, item 2): each example is a question, its gold
// answers and its retrieved passages in retrieval order; each passage becomes one chunk.
//
//   musique_s        <data-dir>/musique_s.json: one JSON array of {ctxs:[{title,text}], question, answers}
//   hotpotqa         <data-dir>/hotpotqa_dev200.jsonl: official HotpotQA schema; a passage is the
//   (hotpotqa_dev200) context entry's title + its sentences joined as given; answers = [answer]
//   any file         the formats above (recognised by content), or a user's JSON Lines
//                    {question, answers:[str], passages:[{title,text}], id?}
//
// Malformed input throws std::runtime_error naming the file and the line (JSON Lines) or
// the line/example (JSON array).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "fusion/rag_prompt.h"

namespace cf::eval {

struct QaExample {
  std::string id;  // the dataset's id, else the example's index (0-based)
  std::string question;
  std::vector<std::string> answers;
  std::vector<Passage> passages;
};

struct Dataset {
  std::string name;  // musique_s, hotpotqa_dev200, or the file's stem
  std::string path;
  std::vector<QaExample> examples;
};

Dataset load_musique_json(const std::string& path, const std::string& name = "musique_s");
Dataset load_hotpotqa_jsonl(const std::string& path, const std::string& name = "hotpotqa_dev200");
Dataset load_user_jsonl(const std::string& path, const std::string& name);
// A file in any of the formats above, chosen by its content.
Dataset load_dataset_file(const std::string& path);

// ../shared/datasets beside the repository root, found by walking up from the running
// executable and from the working directory; nullopt when there is none.
std::optional<std::string> default_data_dir();
// The repository root (a folder with CMakeLists.txt and src/eval/), found the same way.
std::optional<std::string> find_repo_root();

// `name_or_file`: an existing file, else a known name resolved against `data_dir` (empty:
// default_data_dir(), else an error telling the user to pass --data-dir).
Dataset load_dataset(const std::string& name_or_file, const std::string& data_dir = "");

}  // namespace cf::eval
