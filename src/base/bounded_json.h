// JSON from outside the process (request bodies, uploaded .jsonl lines, cache-file and
// Redis manifests) parsed with a nesting bound (issue 29, item 1). nlohmann::json parses and
// frees any depth without recursion, but copying, comparing or printing a value recurses once
// per level: an 8 MiB body of "[[[[..." is millions of levels and overflows the stack the
// first time anything copies it. The bound is checked on the text before nlohmann sees it,
// so nothing downstream ever holds a deep value.
#pragma once
#include <cstddef>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>

namespace cf {

// Deep enough for every document this project reads (the deepest, a QCFuse profile or a
// request's fusion options, nests 4-5 levels); shallow enough that a recursive copy is cheap.
inline constexpr int kMaxJsonDepth = 64;

struct JsonTooDeep : std::invalid_argument {
  explicit JsonTooDeep(int limit);
  int limit;
};

// The deepest nesting of arrays and objects in `text`, brackets inside strings not counted;
// stops counting at limit + 1. Exact for valid JSON; for invalid text it is a bound that
// the parser's own rejection makes moot.
int json_nesting_depth(std::string_view text, int limit = kMaxJsonDepth);

// nlohmann::json::parse(text, nullptr, allow_exceptions) with the depth bound: throws
// JsonTooDeep when `text` nests deeper than `max_depth` (whatever allow_exceptions says),
// then parses. With allow_exceptions false an invalid text gives a discarded value.
nlohmann::json parse_json_bounded(std::string_view text, bool allow_exceptions = true,
                                  int max_depth = kMaxJsonDepth);

// A value for an error message: compact JSON cut to `max_chars` (with "..."), so that a
// message never echoes megabytes of a request back.
std::string json_excerpt(const nlohmann::json& value, size_t max_chars = 80);

}  // namespace cf
