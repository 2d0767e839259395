#include "base/bounded_json.h"

namespace cf {

JsonTooDeep::JsonTooDeep(int limit)
    : std::invalid_argument("JSON nested deeper than " + std::to_string(limit) + " levels"), limit(limit) {}

int json_nesting_depth(std::string_view text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;  // the escaped character, a quote included, cannot end the string
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest && (deepest = depth) > limit) return deepest;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

nlohmann::json parse_json_bounded(std::string_view text, bool allow_exceptions, int max_depth) {
  if (json_nesting_depth(text, max_depth) > max_depth) throw JsonTooDeep(max_depth);
  return nlohmann::json::parse(text.begin(), text.end(), nullptr, allow_exceptions);
}

std::string json_excerpt(const nlohmann::json& value, size_t max_chars) {
  std::string s = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > max_chars) {
    // Cut on a UTF-8 character boundary so the message stays valid text.
    size_t cut = max_chars;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
    s.resize(cut);
    s += "...";
  }
  return s;
}

}  // namespace cf
