// Dataset loaders: the three formats from small files written here, errors that name the
// line, name resolution, and the real files in ../shared/datasets.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <fstream>

#include "eval/datasets.h"

namespace cf::eval {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("cf_eval_ds_" + std::to_string(::getpid()) + "_" +
                                         std::to_string(reinterpret_cast<uintptr_t>(this)));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string write(const std::string& name, const std::string& text) const {
    const auto p = path_ / name;
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Datasets, MusiqueArray) {
  TempDir t;
  const auto p = t.write("m.json", R"([
 {"ctxs": [{"title": "A", "text": "alpha"}, {"title": "B", "text": "beta"}], "question": "q1?", "answers": ["x", "y"]},
 {"ctxs": [{"text": "untitled"}], "question": "q2?", "answers": ["z"]}
])");
  const Dataset d = load_dataset_file(p);  // recognised by content
  EXPECT_EQ(d.name, "m");
  ASSERT_EQ(d.examples.size(), 2u);
  EXPECT_EQ(d.examples[0].id, "0");
  EXPECT_EQ(d.examples[0].question, "q1?");
  EXPECT_EQ(d.examples[0].answers, (std::vector<std::string>{"x", "y"}));
  ASSERT_EQ(d.examples[0].passages.size(), 2u);
  EXPECT_EQ(d.examples[0].passages[1].title, "B");  // retrieval order kept
  EXPECT_EQ(d.examples[0].passages[1].text, "beta");
  EXPECT_EQ(d.examples[1].id, "1");
  EXPECT_EQ(d.examples[1].passages[0].title, "");
}

TEST(Datasets, HotpotPassageIsTitlePlusJoinedSentences) {
  TempDir t;
  const auto p = t.write("h.jsonl",
                         R"({"_id": "abc", "question": "Who?", "answer": "Jeff", "type": "bridge", "supporting_facts": [["T1", 0]], "context": [["T1", ["First one.", " Second one."]], ["T2", ["Other."]]]})"
                         "\n\n");
  const Dataset d = load_dataset_file(p);
  ASSERT_EQ(d.examples.size(), 1u);
  EXPECT_EQ(d.examples[0].id, "abc");
  EXPECT_EQ(d.examples[0].answers, std::vector<std::string>{"Jeff"});
  ASSERT_EQ(d.examples[0].passages.size(), 2u);
  EXPECT_EQ(d.examples[0].passages[0].title, "T1");
  EXPECT_EQ(d.examples[0].passages[0].text, "First one. Second one.");
}

TEST(Datasets, UserJsonl) {
  TempDir t;
  const auto p = t.write("u.jsonl",
                         R"({"question": "Q?", "answers": ["a1"], "passages": [{"title": "t", "text": "x"}, {"text": "y"}]})"
                         "\n"
                         R"({"id": 7, "question": "R?", "answers": "single", "passages": [{"title": "t2", "text": "z"}]})"
                         "\n");
  const Dataset d = load_dataset_file(p);
  ASSERT_EQ(d.examples.size(), 2u);
  EXPECT_EQ(d.examples[0].id, "0");
  EXPECT_EQ(d.examples[0].passages.size(), 2u);
  EXPECT_EQ(d.examples[1].id, "7");
  EXPECT_EQ(d.examples[1].answers, std::vector<std::string>{"single"});
  EXPECT_EQ(load_dataset(p).examples.size(), 2u);  // a path works where a name does
}

TEST(Datasets, ErrorsNameTheLineAndTheProblem) {
  TempDir t;
  const std::string ok = R"({"question": "Q?", "answers": ["a"], "passages": [{"text": "x"}]})";
  const auto bad_json = t.write("b1.jsonl", ok + "\n" + ok + "\n{\"question\": \"Q\", \n");
  EXPECT_THAT(error_of([&] { load_user_jsonl(bad_json, "b1"); }), ::testing::HasSubstr("b1.jsonl:3: malformed JSON"));
  const auto missing = t.write("b2.jsonl", ok + "\n" + R"({"question": "Q?", "passages": []})" + "\n");
  EXPECT_THAT(error_of([&] { load_user_jsonl(missing, "b2"); }),
              ::testing::AllOf(::testing::HasSubstr("b2.jsonl:2"), ::testing::HasSubstr("missing field \"answers\"")));
  const auto wrong_type = t.write("b3.jsonl", R"({"question": "Q?", "answers": ["a"], "passages": [{"text": 5}]})");
  EXPECT_THAT(error_of([&] { load_user_jsonl(wrong_type, "b3"); }),
              ::testing::AllOf(::testing::HasSubstr("b3.jsonl:1"), ::testing::HasSubstr("passages[0]"),
                               ::testing::HasSubstr("\"text\" must be a string")));
  const auto not_object = t.write("b4.jsonl", "[1, 2]\n");
  EXPECT_THAT(error_of([&] { load_user_jsonl(not_object, "b4"); }), ::testing::HasSubstr("b4.jsonl:1"));
  const auto bad_array = t.write("m.json", "[\n {\"ctxs\": [], \"question\": \"q\", \"answers\": []},\n {\"ctxs\": [}\n]");
  EXPECT_THAT(error_of([&] { load_musique_json(bad_array); }), ::testing::HasSubstr("m.json:3: malformed JSON"));
  const auto bad_example = t.write("m2.json", R"([{"ctxs": [], "question": "q", "answers": []}, {"ctxs": []}])");
  EXPECT_THAT(error_of([&] { load_musique_json(bad_example); }),
              ::testing::AllOf(::testing::HasSubstr("example 1"), ::testing::HasSubstr("\"question\"")));
  const auto bad_hotpot = t.write("h.jsonl", R"({"_id": "x", "question": "q", "answer": "a", "context": [["T", "not a list"]]})");
  EXPECT_THAT(error_of([&] { load_hotpotqa_jsonl(bad_hotpot); }),
              ::testing::AllOf(::testing::HasSubstr("h.jsonl:1"), ::testing::HasSubstr("context[0]")));
  const auto empty = t.write("e.jsonl", "\n\n");
  EXPECT_THAT(error_of([&] { load_user_jsonl(empty, "e"); }), ::testing::HasSubstr("no examples"));
  EXPECT_THAT(error_of([&] { load_dataset_file(t.str() + "/missing.jsonl"); }), ::testing::HasSubstr("cannot open"));
}

TEST(Datasets, NamesResolveAgainstTheDataDir) {
  TempDir t;
  t.write("musique_s.json", R"([{"ctxs": [{"title": "A", "text": "a"}], "question": "q", "answers": ["x"]}])");
  const Dataset d = load_dataset("musique_s", t.str());
  EXPECT_EQ(d.name, "musique_s");
  EXPECT_EQ(d.examples.size(), 1u);
  EXPECT_THAT(error_of([&] { load_dataset("hotpotqa", t.str()); }), ::testing::HasSubstr("--data-dir"));
  EXPECT_THAT(error_of([&] { load_dataset("no_such_set", t.str()); }), ::testing::HasSubstr("known name"));
}

// CI has ../shared beside the repository: its absence is a failure, not a skip.
TEST(Datasets, SharedDatasetsLoad) {
  const auto dir = default_data_dir();
  ASSERT_TRUE(dir.has_value()) << "../shared/datasets not found beside the repository";
  const Dataset m = load_dataset("musique_s");
  EXPECT_EQ(m.name, "musique_s");
  ASSERT_EQ(m.examples.size(), 150u);
  for (const auto& ex : m.examples) {
    EXPECT_EQ(ex.passages.size(), 10u);
    EXPECT_FALSE(ex.answers.empty());
  }
  EXPECT_EQ(m.examples[0].question, "Where was the author of Hannibal and Scipio educated at?");
  EXPECT_EQ(m.examples[0].answers, std::vector<std::string>{"Exeter College"});
  const Dataset h = load_dataset("hotpotqa");
  EXPECT_EQ(h.name, "hotpotqa_dev200");
  ASSERT_EQ(h.examples.size(), 200u);
  EXPECT_EQ(h.examples[0].answers, std::vector<std::string>{"Rush"});
  ASSERT_EQ(h.examples[0].passages.size(), 10u);
  EXPECT_EQ(h.examples[0].passages[0].title, "Jeff Porcaro");
  EXPECT_THAT(h.examples[0].passages[0].text,
              ::testing::HasSubstr("record producer. In a career that spanned more than 20 years"));
}

}  // namespace
}  // namespace cf::eval
