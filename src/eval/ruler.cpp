#include "eval/ruler.h"

#include <algorithm>
#include <array>
#include <set>
#include <stdexcept>
#include <string_view>
#include <utility>

#include "base/enum_names.h"
#include "model/tokenizer.h"

namespace cf::eval {
namespace {

constexpr EnumName<RulerTask> kTaskNames[] = {{RulerTask::niah_single, "niah_single"},
                                              {RulerTask::niah_multikey, "niah_multikey"},
                                              {RulerTask::niah_multivalue, "niah_multivalue"},
                                              {RulerTask::variable_tracking, "variable_tracking"}};
constexpr size_t kMinLength = 256;

// Word lists of the filler. No digits and no "VAR": the needles are the only numbers.
constexpr std::array<std::string_view, 20> kSubjects = {
    "The best startups", "Most founders", "A good essay", "Every programmer", "The early web",
    "A careful reader", "Small teams", "Old institutions", "The typical investor", "Curious students",
    "A new language", "Most big companies", "The average critic", "Good design", "Ambitious people",
    "The first version", "A patient writer", "Open source projects", "Many cities", "The right question"};
constexpr std::array<std::string_view, 20> kVerbs = {
    "tend to overlook", "quietly reward", "rarely explain", "slowly discover", "often underestimate",
    "seldom forget", "learn to distrust", "eventually depend on", "keep returning to", "are shaped by",
    "try to imitate", "gradually abandon", "are surprised by", "cannot ignore", "usually misjudge",
    "come to value", "argue about", "make room for", "stumble upon", "pay dearly for"};
constexpr std::array<std::string_view, 20> kObjects = {
    "the cost of waiting", "small, patient improvements", "the habits of their users", "ideas that seem trivial",
    "the advice of outsiders", "problems nobody has named", "the work they enjoy", "the shape of the market",
    "simple tools", "their own first drafts", "the opinions of peers", "unfashionable questions",
    "the limits of planning", "what customers actually do", "long walks and quiet mornings",
    "the value of good taste", "the rules of thumb they inherited", "unexpected conversations",
    "the slow pace of change", "the stories they tell themselves"};
constexpr std::array<std::string_view, 20> kEndings = {
    "in the long run", "when nobody is watching", "more often than people admit", "for reasons that are hard to see",
    "once the excitement fades", "without noticing it", "in almost every field", "after the first few years",
    "long before it is obvious", "as the world changes around them", "in ways that surprise them",
    "when the stakes are low", "despite their best intentions", "whenever they are busy",
    "at the worst possible moment", "if they are honest", "more than they expect", "by accident",
    "in hindsight", "for a while"};
constexpr std::array<std::string_view, 24> kAdjectives = {
    "quiet", "fearless", "amber", "brittle", "curious", "distant", "electric", "frozen", "gentle", "hollow",
    "ivory", "jagged", "lucky", "mellow", "nimble", "orange", "polished", "restless", "silent", "tender",
    "velvet", "wistful", "zealous", "crimson"};
constexpr std::array<std::string_view, 24> kNouns = {
    "harbor", "harmony", "lantern", "meadow", "orchard", "pebble", "quarry", "river", "saddle", "thimble",
    "umbrella", "valley", "walnut", "yarrow", "anchor", "beacon", "canyon", "dolphin", "ember", "falcon",
    "glacier", "horizon", "island", "juniper"};

template <size_t N>
std::string_view pick(const std::array<std::string_view, N>& words, SeededRng& rng) {
  return words[rng.below(N)];
}

std::string filler_sentence(SeededRng& rng) {
  std::string s;
  s += pick(kSubjects, rng);
  s += ' ';
  s += pick(kVerbs, rng);
  s += ' ';
  s += pick(kObjects, rng);
  s += ' ';
  s += pick(kEndings, rng);
  s += '.';
  return s;
}

std::string number_with_digits(SeededRng& rng, int digits) {
  size_t lo = 1;
  for (int i = 1; i < digits; ++i) lo *= 10;
  return std::to_string(lo + rng.below(9 * lo));
}

std::string magic_key(SeededRng& rng) { return std::string(pick(kAdjectives, rng)) + "-" + std::string(pick(kNouns, rng)); }

std::string variable_name(SeededRng& rng) {
  std::string v(5, 'A');
  for (char& c : v) c = static_cast<char>('A' + rng.below(26));
  return v;
}

// `count` distinct values from `make`.
template <typename F>
std::vector<std::string> distinct(size_t count, F&& make) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  while (out.size() < count) {
    std::string v = make();
    if (seen.insert(v).second) out.push_back(std::move(v));
  }
  return out;
}

std::string needle(const std::string& key, const std::string& value) {
  return "One of the special magic numbers for " + key + " is: " + value + ".";
}

struct Sentences {
  std::vector<std::string> text;
  std::vector<size_t> tokens;  // each as it tokenizes after a space, inside a chunk
};

size_t tokens_after_space(const Tokenizer& tok, const std::string& s) {
  return tok.encode(" " + s, /*add_special=*/false, /*parse_special=*/false).size();
}

QaExample make_example(const Tokenizer& tok, const RulerOptions& opt, size_t index) {
  SeededRng rng(opt.seed, index);
  QaExample ex;
  ex.id = std::to_string(index);
  std::vector<std::string> needles;  // in the order they must appear
  switch (opt.task) {
    case RulerTask::niah_single: {
      const std::string key = magic_key(rng), value = number_with_digits(rng, 7);
      needles = {needle(key, value)};
      ex.answers = {value};
      ex.question = "Some special magic numbers are hidden within the text above. What is the special magic number "
                    "for " + key + " mentioned in the provided text?";
      break;
    }
    case RulerTask::niah_multikey: {
      const auto keys = distinct(kRulerNeedles, [&] { return magic_key(rng); });
      const auto values = distinct(kRulerNeedles, [&] { return number_with_digits(rng, 7); });
      for (size_t i = 0; i < kRulerNeedles; ++i) needles.push_back(needle(keys[i], values[i]));
      const size_t asked = rng.below(kRulerNeedles);
      ex.answers = {values[asked]};
      ex.question = "Some special magic numbers are hidden within the text above. What is the special magic number "
                    "for " + keys[asked] + " mentioned in the provided text?";
      rng.shuffle(needles);  // the asked needle is not always the first
      break;
    }
    case RulerTask::niah_multivalue: {
      const std::string key = magic_key(rng);
      const auto values = distinct(kRulerNeedles, [&] { return number_with_digits(rng, 7); });
      for (const auto& v : values) needles.push_back(needle(key, v));
      ex.answers = values;
      ex.all_answers_required = true;
      ex.question = "Some special magic numbers are hidden within the text above. What are all the special magic "
                    "numbers for " + key + " mentioned in the provided text?";
      break;
    }
    case RulerTask::variable_tracking: {
      const auto vars = distinct(kRulerChainHops + 1, [&] { return variable_name(rng); });
      const std::string value = number_with_digits(rng, 5);
      needles.push_back("VAR " + vars[0] + " = " + value + ".");
      for (size_t i = 1; i < vars.size(); ++i) needles.push_back("VAR " + vars[i] + " = VAR " + vars[i - 1] + ".");
      ex.answers = vars;
      ex.all_answers_required = true;
      ex.question = "Memorize and track the chain of variable assignments hidden in the text above. Find all "
                    "variables that are assigned the value " + value + " in the text above.";
      break;
    }
  }

  // Filler up to the budget: the context minus the needles and one separator token a chunk.
  const size_t separators = (opt.context_tokens + opt.chunk_tokens - 1) / opt.chunk_tokens;
  size_t needle_tokens = 0;
  std::vector<size_t> needle_costs;
  for (const auto& n : needles) needle_tokens += needle_costs.emplace_back(tokens_after_space(tok, n));
  if (needle_tokens + separators >= opt.context_tokens)
    throw std::invalid_argument("RULER: context of " + std::to_string(opt.context_tokens) + " tokens is too short");
  const size_t budget = opt.context_tokens - needle_tokens - separators;
  Sentences all;
  size_t used = 0;
  for (;;) {
    std::string s = filler_sentence(rng);
    const size_t cost = tokens_after_space(tok, s);
    if (used + cost > budget) break;
    used += cost;
    all.text.push_back(std::move(s));
    all.tokens.push_back(cost);
  }
  // Needles at seeded positions, kept in their order; inserted last-first so that earlier
  // positions stay valid.
  std::vector<size_t> at(needles.size());
  for (auto& p : at) p = rng.below(all.text.size() + 1);
  std::sort(at.begin(), at.end());
  for (size_t k = needles.size(); k-- > 0;) {
    all.text.insert(all.text.begin() + static_cast<long>(at[k]), needles[k]);
    all.tokens.insert(all.tokens.begin() + static_cast<long>(at[k]), needle_costs[k]);
  }

  // Sentences to chunks of at most chunk_tokens (counting the separator).
  Passage cur;
  size_t cur_tokens = 0;
  for (size_t i = 0; i < all.text.size(); ++i) {
    if (!cur.text.empty() && cur_tokens + all.tokens[i] + 1 > opt.chunk_tokens) {
      ex.passages.push_back(std::exchange(cur, {}));
      cur_tokens = 0;
    }
    if (!cur.text.empty()) cur.text += ' ';
    cur.text += all.text[i];
    cur_tokens += all.tokens[i];
  }
  if (!cur.text.empty()) ex.passages.push_back(std::move(cur));
  return ex;
}

}  // namespace

const char* ruler_task_name(RulerTask task) { return enum_name(kTaskNames, task); }

RulerOptions parse_ruler_name(const std::string& name) {
  std::string tasks;
  for (const auto& t : kTaskNames) tasks += (tasks.empty() ? "" : ", ") + std::string(t.name);
  const std::string usage = "expected ruler:TASK:LENGTH with TASK one of " + tasks + " and LENGTH in tokens (>= " +
                            std::to_string(kMinLength) + "), e.g. ruler:niah_single:4096";
  const size_t first = name.find(':'), second = name.find(':', first + 1);
  if (name.substr(0, first) != "ruler" || first == std::string::npos || second == std::string::npos)
    throw std::invalid_argument("'" + name + "': " + usage);
  const std::string task = name.substr(first + 1, second - first - 1), length = name.substr(second + 1);
  RulerOptions opt;
  if (!parse_enum_name(kTaskNames, task, opt.task))
    throw std::invalid_argument("'" + name + "': unknown task '" + task + "'; " + usage);
  size_t used = 0;
  unsigned long n = 0;
  try {
    n = std::stoul(length, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != length.size() || n < kMinLength)
    throw std::invalid_argument("'" + name + "': bad length '" + length + "'; " + usage);
  opt.context_tokens = n;
  return opt;
}

std::string ruler_name(const RulerOptions& opt) {
  return std::string("ruler:") + ruler_task_name(opt.task) + ":" + std::to_string(opt.context_tokens);
}

Dataset generate_ruler(const Tokenizer& tokenizer, const RulerOptions& opt) {
  if (opt.chunk_tokens < 64) throw std::invalid_argument("RULER: chunk_tokens must be at least 64");
  if (opt.examples == 0) throw std::invalid_argument("RULER: at least one example");
  Dataset d{ruler_name(opt), "(generated, seed " + std::to_string(opt.seed) + ")", {}};
  for (size_t i = 0; i < opt.examples; ++i) d.examples.push_back(make_example(tokenizer, opt, i));
  return d;
}

}  // namespace cf::eval
