// Plain text out of an uploaded document (issue 12, item 1), by its file name's extension:
//   .txt .md  the text itself (UTF-8)
//   .csv      one paragraph per row, "header: value; ..." so that BM25 sees the column names
//   .jsonl    one paragraph per line: its "title" and "text" (or "content") fields, else the line
//   .pdf      Debian's poppler-utils `pdftotext` run as a subprocess (never a hand-written PDF
//             parser) under a wall-clock deadline, RLIMIT_CPU and RLIMIT_AS, its output capped
//             (issue 59); a file that does not start with "%PDF-" is refused.
// Paragraphs are separated by a blank line (what chunking.h splits on). Every refusal is a
// RequestError 400 (415 for an unknown format, 413 for text past max_text_bytes, in any
// format) with a message fit for the page.
#pragma once
#include <string>
#include <string_view>

namespace cf {

struct ExtractOptions {
  int pdf_timeout_ms = 15000;                   // wall clock, and RLIMIT_CPU (rounded up to seconds)
  size_t pdf_memory_bytes = size_t{512} << 20;  // pdftotext's RLIMIT_AS (0: none)
  size_t max_text_bytes = size_t{16} << 20;  // extracted text beyond this is refused (413), every format
  std::string pdftotext = "pdftotext";      // program name or path
};

// "txt" | "md" | "csv" | "jsonl" | "pdf" from the name; "" when unknown.
std::string document_format(std::string_view file_name);

std::string extract_document_text(const std::string& format, std::string_view bytes, const ExtractOptions& opt = {});

// Text out of a PDF by `pdftotext` (throws RequestError: 400 unreadable or too slow, 413 past its
// output cap or killed past its CPU or memory limit, 503 when the program is missing).
std::string pdf_to_text(std::string_view pdf_bytes, const ExtractOptions& opt);

bool valid_utf8(std::string_view s);

}  // namespace cf
