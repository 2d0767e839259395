// An enum's names as one table read both ways (the name of a value, the value of a name), so
// that the names and the list of values cannot drift apart as a switch and a loop could.
#pragma once
#include <cstddef>
#include <string_view>

namespace cf {

template <class E>
struct EnumName {
  E value;
  const char* name;
};

// The name of `v` in `table`; `unknown` for a value the table lacks.
template <class E, size_t N>
constexpr const char* enum_name(const EnumName<E> (&table)[N], E v, const char* unknown = "?") {
  for (const EnumName<E>& e : table)
    if (e.value == v) return e.name;
  return unknown;
}

// Sets `out` to the value named `s`; false (out untouched) when no entry has that name.
template <class E, size_t N>
constexpr bool parse_enum_name(const EnumName<E> (&table)[N], std::string_view s, E& out) {
  for (const EnumName<E>& e : table)
    if (s == e.name) {
      out = e.value;
      return true;
    }
  return false;
}

}  // namespace cf
