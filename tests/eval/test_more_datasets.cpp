// The loaders added for the rest of ../shared/datasets (NQ oracle with seeded distractors,
// KV retrieval, RGB) and gzip input: small files written here, then the real files (skipped,
// saying so, when ../shared/datasets is absent).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "eval/datasets.h"

namespace cf::eval {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() : path_(fs::temp_directory_path() / ("cf_eval_more_" + std::to_string(::getpid()))) {
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string write(const std::string& name, const std::string& text, bool gzip = false) const {
    const std::string p = (path_ / name).string();
    if (gzip) {
      gzFile f = gzopen(p.c_str(), "wb");
      gzwrite(f, text.data(), static_cast<unsigned>(text.size()));
      gzclose(f);
    } else {
      std::ofstream(p, std::ios::binary) << text;
    }
    return p;
  }

 private:
  fs::path path_;
};

#define REQUIRE_SHARED_DATASETS()                                                                     \
  do {                                                                                                \
    if (!default_data_dir())                                                                          \
      GTEST_SKIP() << "../shared/datasets not found beside the repository (set CHUNKFUSE_DATA_DIR); " \
                      "the real-file checks did not run";                                             \
  } while (0)

std::string joined(const QaExample& ex) {
  std::string all;
  for (const auto& p : ex.passages) all += p.title + "\n" + p.text + "\n";
  return all;
}

TEST(MoreDatasets, GzipUserFileIsReadAndNamedWithoutExtensions) {
  TempDir t;
  const auto p = t.write("mine.jsonl.gz", R"({"question": "Q?", "answers": ["a"], "passages": [{"text": "x"}]})" "\n",
                         /*gzip=*/true);
  const Dataset d = load_dataset_file(p);
  EXPECT_EQ(d.name, "mine");
  ASSERT_EQ(d.examples.size(), 1u);
  EXPECT_EQ(d.examples[0].passages[0].text, "x");
}

TEST(MoreDatasets, NqOracleDistractorsAreSeededAndAnswerFree) {
  TempDir t;
  std::string text;
  for (int i = 0; i < 30; ++i) {
    const std::string n = std::to_string(i);
    text.append(R"({"question": "q)").append(n).append(R"(?", "answers": ["ans)").append(n);
    text.append(R"("], "ctxs": [{"title": "T)").append(n).append(R"(", "text": "gold ans)").append(n);
    text.append(R"( here", "isgold": true}]})" "\n");
  }
  // Example 30 mentions example 0's answer, so it must never be example 0's distractor.
  text += R"({"question": "q30?", "answers": ["zzz"], "ctxs": [{"title": "T30", "text": "also ans0 is here"}]})" "\n";
  const auto p = t.write("nq.jsonl.gz", text, true);
  const Dataset a = load_nq_oracle(p, "nq", 1, 9), b = load_nq_oracle(p, "nq", 1, 9), c = load_nq_oracle(p, "nq", 2, 9);
  ASSERT_EQ(a.examples.size(), 31u);
  bool differs = false;
  std::set<size_t> gold_positions;
  for (size_t i = 0; i < a.examples.size(); ++i) {
    const auto& ex = a.examples[i];
    ASSERT_EQ(ex.passages.size(), 10u);
    size_t gold = 0, with_answer = 0;
    std::set<std::string> titles;
    for (size_t k = 0; k < ex.passages.size(); ++k) {
      titles.insert(ex.passages[k].title);
      if (ex.passages[k].title == std::string("T").append(std::to_string(i))) gold = k;
      with_answer += ex.passages[k].text.find(ex.answers[0]) != std::string::npos;
    }
    EXPECT_EQ(titles.size(), 10u) << "distinct passages";
    if (i < 30) {
      EXPECT_EQ(with_answer, 1u) << "only the gold passage holds the answer";
    }
    gold_positions.insert(gold);
    EXPECT_EQ(joined(ex), joined(b.examples[i])) << "same seed, same example";
    differs = differs || joined(ex) != joined(c.examples[i]);
  }
  EXPECT_TRUE(differs) << "another seed draws other distractors";
  EXPECT_GE(gold_positions.size(), 4u) << "the gold passage moves";
  EXPECT_EQ(load_dataset_file(p, 1).examples[3].passages.size(), 10u);  // recognised by content
}

TEST(MoreDatasets, KvRecordsBecomeChunksOfFivePairs) {
  TempDir t;
  std::string recs;
  for (int i = 0; i < 12; ++i) {
    const std::string n = std::to_string(i);
    recs.append(i ? ", " : "").append(R"(["k)").append(n).append(R"(", "v)").append(n).append(R"("])");
  }
  const auto p = t.write("kv.jsonl", std::string(R"({"ordered_kv_records": [)").append(recs).append(R"(], "key": "k7", "value": "v7"})" "\n"));
  const Dataset d = load_dataset_file(p);
  ASSERT_EQ(d.examples.size(), 1u);
  const auto& ex = d.examples[0];
  ASSERT_EQ(ex.passages.size(), 3u);  // 5 + 5 + 2
  EXPECT_EQ(ex.passages[0].text, "\"k0\": \"v0\"\n\"k1\": \"v1\"\n\"k2\": \"v2\"\n\"k3\": \"v3\"\n\"k4\": \"v4\"");
  EXPECT_EQ(ex.passages[2].text, "\"k10\": \"v10\"\n\"k11\": \"v11\"");
  EXPECT_EQ(ex.answers, std::vector<std::string>{"v7"});
  EXPECT_THAT(ex.question, ::testing::HasSubstr("\"k7\""));
  EXPECT_FALSE(ex.all_answers_required);
}

TEST(MoreDatasets, RgbPassagesAreShuffledPositivesAndNegatives) {
  TempDir t;
  const auto p = t.write("rgb.jsonl",
                         R"({"id": 4, "query": "Where?", "answer": [["Tampa", "Tampa Bay"]], "fakeanswer": "X", "positive_wrong": ["w"], "positive": ["p1", "p2"], "negative": ["n1", "n2", "n3"]})" "\n"
                         R"({"id": 5, "query": "Who?", "answer": "Ann", "positive": ["p"], "negative": []})" "\n");
  const Dataset d = load_dataset_file(p, 3);
  ASSERT_EQ(d.examples.size(), 2u);
  EXPECT_EQ(d.examples[0].id, "4");
  EXPECT_EQ(d.examples[0].question, "Where?");
  EXPECT_EQ(d.examples[0].answers, (std::vector<std::string>{"Tampa", "Tampa Bay"}));
  std::multiset<std::string> texts;
  for (const auto& q : d.examples[0].passages) texts.insert(q.text);
  EXPECT_EQ(texts, (std::multiset<std::string>{"n1", "n2", "n3", "p1", "p2"}));  // positive_wrong not used
  EXPECT_EQ(d.examples[1].answers, std::vector<std::string>{"Ann"});
  EXPECT_EQ(joined(load_rgb(p, "r", 3).examples[0]), joined(d.examples[0]));
}

TEST(MoreDatasets, SharedFilesLoad) {
  REQUIRE_SHARED_DATASETS();
  const Dataset nq = load_dataset("nq_open_oracle");
  EXPECT_EQ(nq.name, "nq_open_oracle");
  ASSERT_EQ(nq.examples.size(), 2655u);
  EXPECT_EQ(nq.examples[0].question, "who got the first nobel prize in physics");
  EXPECT_EQ(nq.examples[0].answers, std::vector<std::string>{"Wilhelm Conrad Röntgen"});
  size_t gold_found = 0;
  for (const auto& ex : nq.examples) {
    ASSERT_EQ(ex.passages.size(), 10u);
    for (const auto& p : ex.passages) gold_found += p.title == "List of Nobel laureates in Physics" && &ex == &nq.examples[0];
  }
  EXPECT_GE(gold_found, 1u);

  const Dataset kv = load_dataset("kv_retrieval");
  EXPECT_EQ(kv.name, "kv_retrieval_75keys");
  ASSERT_EQ(kv.examples.size(), 500u);
  EXPECT_EQ(kv.examples[0].answers, std::vector<std::string>{"bb3ba2a5-7de8-434b-a86e-a88bb9fa7289"});
  ASSERT_EQ(kv.examples[0].passages.size(), 15u);
  EXPECT_THAT(kv.examples[0].question, ::testing::HasSubstr("2a8d601d-1d69-4e64-9f90-8ad825a74195"));
  // The asked pair (record 18) is the fourth line of the fourth chunk.
  EXPECT_THAT(kv.examples[0].passages[3].text,
              ::testing::HasSubstr("\"2a8d601d-1d69-4e64-9f90-8ad825a74195\": \"bb3ba2a5-7de8-434b-a86e-a88bb9fa7289\""));

  const Dataset rgb = load_dataset("rgb");
  EXPECT_EQ(rgb.name, "rgb_en_fact");
  ASSERT_EQ(rgb.examples.size(), 100u);
  EXPECT_EQ(rgb.examples[0].question, "Super Bowl 2021 location");
  EXPECT_EQ(rgb.examples[0].answers, std::vector<std::string>{"Tampa, Florida"});
  EXPECT_EQ(rgb.examples[0].passages.size(), 10u);  // 3 positive + 7 negative
  EXPECT_THAT(joined(rgb.examples[0]), ::testing::HasSubstr("Raymond James Stadium in Tampa, Florida"));
}

}  // namespace
}  // namespace cf::eval
