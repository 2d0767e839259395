// Splitting a document into chunks for the knowledge base (issue 12, item 1): by paragraph
// (blank-line separated), consecutive paragraphs merged while the chunk stays within
// `max_tokens`; a paragraph longer than that is cut at sentence ends, and a sentence longer
// than that at spaces (a word longer than the budget stays whole). Token counts add the
// counts of the pieces, which can differ from the joined text's count by a token or two at
// each seam; the knowledge base measures each chunk exactly afterwards.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace cf {

using TokenCounter = std::function<size_t(std::string_view)>;

std::vector<std::string> split_into_chunks(std::string_view text, size_t max_tokens, const TokenCounter& count);

// The first sentence (at most max_chars bytes, cut at a UTF-8 boundary with "…"): the chunk
// list's summary.
std::string first_sentence(std::string_view text, size_t max_chars = 160);

}  // namespace cf
