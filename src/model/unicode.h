// Code point utilities for the tokenizers: UTF-8 decoding/encoding, general-category
// flags (from the generated unicode_tables.cpp), and GPT-2's byte <-> printable code point
// mapping used by byte-level BPE vocabularies.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cf::unicode {

// Bit flags of a code point; values match tools/gen_unicode_tables.py.
enum Flag : uint16_t {
  kUndefined = 1 << 0,    // Cn
  kNumber = 1 << 1,       // \p{N}
  kLetter = 1 << 2,       // \p{L}
  kSeparator = 1 << 3,    // \p{Z}
  kMark = 1 << 4,         // \p{M}
  kPunctuation = 1 << 5,  // \p{P}
  kSymbol = 1 << 6,       // \p{S}
  kControl = 1 << 7,      // \p{C} except Cn
  kWhitespace = 1 << 8,   // White_Space property (\s)
};

uint16_t flags(uint32_t cp);  // 0 for values beyond U+10FFFF
inline bool is_letter(uint32_t cp) { return flags(cp) & kLetter; }
inline bool is_number(uint32_t cp) { return flags(cp) & kNumber; }
inline bool is_whitespace(uint32_t cp) { return flags(cp) & kWhitespace; }

constexpr uint32_t kReplacement = 0xFFFD;

// Decodes UTF-8; each byte of an invalid or truncated sequence becomes U+FFFD (as
// llama.cpp does, so token ids agree on malformed input).
std::vector<uint32_t> decode_utf8(std::string_view text);
// One code point at `pos` (< text.size()); `*len` receives the bytes consumed (1 for
// a malformed sequence, which decodes as U+FFFD).
uint32_t decode_one(std::string_view text, size_t pos, size_t* len);
void append_utf8(std::string& out, uint32_t cp);
std::string encode_utf8(const uint32_t* cps, size_t n);
// Length of the UTF-8 sequence a lead byte announces (1 for continuation/invalid bytes).
size_t utf8_sequence_length(uint8_t lead);

// GPT-2 byte-level alphabet: every byte maps to one printable code point.
uint32_t byte_to_codepoint(uint8_t b);
// -1 when the code point is not in the byte alphabet.
int codepoint_to_byte(uint32_t cp);
// Bytes -> their code points encoded as UTF-8 (what byte-level vocab entries look like).
std::string bytes_to_bpe_text(std::string_view bytes);

namespace detail {
struct FlagRange {
  uint32_t first;
  uint16_t flags;
};
extern const FlagRange kFlagRanges[];
extern const size_t kFlagRangeCount;
}  // namespace detail

}  // namespace cf::unicode
