#include "model/unicode.h"

#include <algorithm>
#include <array>

namespace cf::unicode {

namespace {

constexpr uint32_t kMaxCodepoint = 0x110000;
constexpr uint32_t kFlatLimit = 0x10000;  // the BMP gets a flat table: one load per lookup

uint16_t flags_by_search(uint32_t cp) {
  const auto* begin = detail::kFlagRanges;
  const auto* end = detail::kFlagRanges + detail::kFlagRangeCount;
  auto it = std::upper_bound(begin, end, cp,
                             [](uint32_t v, const detail::FlagRange& r) { return v < r.first; });
  return (it == begin) ? 0 : (it - 1)->flags;
}

const std::vector<uint16_t>& bmp_table() {
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t(kFlatLimit);
    for (size_t i = 0; i < detail::kFlagRangeCount; ++i) {
      uint32_t lo = detail::kFlagRanges[i].first;
      uint32_t hi = (i + 1 < detail::kFlagRangeCount) ? detail::kFlagRanges[i + 1].first
                                                      : kMaxCodepoint;
      for (uint32_t cp = lo; cp < std::min(hi, kFlatLimit); ++cp) t[cp] = detail::kFlagRanges[i].flags;
    }
    return t;
  }();
  return table;
}

struct ByteMap {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 512> from_cp{};  // all mapped code points are below 0x144
};

// GPT-2's bytes_to_unicode: printable Latin-1 bytes keep their value, the others are
// shifted to U+0100 upwards in byte order.
const ByteMap& byte_map() {
  static const ByteMap map = [] {
    ByteMap m;
    m.from_cp.fill(-1);
    auto keeps_value = [](int b) {
      return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      uint32_t cp = keeps_value(b) ? static_cast<uint32_t>(b) : next++;
      m.to_cp[b] = cp;
      m.from_cp[cp] = static_cast<int16_t>(b);
    }
    return m;
  }();
  return map;
}

}  // namespace

uint16_t flags(uint32_t cp) {
  if (cp < kFlatLimit) return bmp_table()[cp];
  if (cp >= kMaxCodepoint) return 0;
  return flags_by_search(cp);
}

size_t utf8_sequence_length(uint8_t lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

uint32_t decode_one(std::string_view text, size_t pos, size_t* len) {
  const uint8_t b0 = static_cast<uint8_t>(text[pos]);
  *len = 1;
  if (b0 < 0x80) return b0;
  size_t n = 0;
  uint32_t cp = 0;
  if ((b0 & 0xE0) == 0xC0) {
    n = 2;
    cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3;
    cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4;
    cp = b0 & 0x07;
  }
  if (n == 0 || pos + n > text.size()) return kReplacement;
  for (size_t k = 1; k < n; ++k) {
    const uint8_t b = static_cast<uint8_t>(text[pos + k]);
    if ((b & 0xC0) != 0x80) return kReplacement;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp > 0x10FFFF) return kReplacement;
  *len = n;
  return cp;
}

std::vector<uint32_t> decode_utf8(std::string_view text) {
  std::vector<uint32_t> out;
  out.reserve(text.size());
  for (size_t i = 0, len = 0; i < text.size(); i += len) {
    const uint8_t b = static_cast<uint8_t>(text[i]);
    if (b < 0x80) {  // fast path for ASCII
      out.push_back(b);
      len = 1;
      continue;
    }
    out.push_back(decode_one(text, i, &len));
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string encode_utf8(const uint32_t* cps, size_t n) {
  std::string out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) append_utf8(out, cps[i]);
  return out;
}

uint32_t byte_to_codepoint(uint8_t b) { return byte_map().to_cp[b]; }

int codepoint_to_byte(uint32_t cp) {
  return cp < byte_map().from_cp.size() ? byte_map().from_cp[cp] : -1;
}

std::string bytes_to_bpe_text(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) append_utf8(out, byte_to_codepoint(static_cast<uint8_t>(c)));
  return out;
}

}  // namespace cf::unicode
