// `chunkfuse info MODEL`: what a GGUF file contains (header, architecture, tokenizer,
// metadata, tensor summary), read with the validating reader so a damaged file is
// reported instead of half-printed.
#include <cinttypes>
#include <cstdio>
#include <exception>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <string>

#include "apps/commands.h"
#include "base/progress.h"
#include "model/gguf.h"

namespace cf::apps {
namespace {

struct InfoOptions {
  std::string model;
  bool list_tensors = false;
  bool show_all = false;
};

constexpr size_t kShortArrayItems = 8;
constexpr size_t kShortValueChars = 160;

std::string_view value_type_name(const GgufValue& v) {
  switch (v.type) {
    case GgufValueType::UINT8: return "u8";
    case GgufValueType::INT8: return "i8";
    case GgufValueType::UINT16: return "u16";
    case GgufValueType::INT16: return "i16";
    case GgufValueType::UINT32: return "u32";
    case GgufValueType::INT32: return "i32";
    case GgufValueType::FLOAT32: return "f32";
    case GgufValueType::BOOL: return "bool";
    case GgufValueType::STRING: return "str";
    case GgufValueType::ARRAY: return "arr";
    case GgufValueType::UINT64: return "u64";
    case GgufValueType::INT64: return "i64";
    case GgufValueType::FLOAT64: return "f64";
  }
  return "?";
}


std::string human_count(uint64_t n) {
  char buf[64];
  if (n >= 1000000000) std::snprintf(buf, sizeof buf, "%.2f B", static_cast<double>(n) / 1e9);
  else if (n >= 1000000) std::snprintf(buf, sizeof buf, "%.2f M", static_cast<double>(n) / 1e6);
  else if (n >= 1000) std::snprintf(buf, sizeof buf, "%.2f K", static_cast<double>(n) / 1e3);
  else std::snprintf(buf, sizeof buf, "%" PRIu64, n);
  return buf;
}

// Cuts a rendering to `max_chars` (at a UTF-8 character boundary) and says so.
std::string abbreviate(std::string s, size_t max_chars) {
  if (s.size() <= max_chars) return s;
  const size_t total = s.size();
  size_t cut = max_chars;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  s.resize(cut);
  return s + "... (" + std::to_string(total) + " chars)";
}

std::string render(const GgufValue& v, bool show_all) {
  if (show_all) return GgufFile::to_string(v, std::numeric_limits<size_t>::max());
  return abbreviate(GgufFile::to_string(v, kShortArrayItems), kShortValueChars);
}

// The chat-template family by its markers; enough to tell a user what the file holds.
std::string chat_family(std::string_view tmpl) {
  if (tmpl.find("<|im_start|>") != std::string_view::npos) return "ChatML";
  if (tmpl.find("<|start_header_id|>") != std::string_view::npos) return "Llama 3";
  if (tmpl.find("[INST]") != std::string_view::npos) return "Mistral / Llama 2 [INST]";
  if (tmpl.find("<start_of_turn>") != std::string_view::npos) return "Gemma";
  return "present (family not recognised)";
}

std::string dims_string(const GgufTensor& t) {
  std::string s = "{";
  for (size_t i = 0; i < t.dims.size(); ++i) s += (i ? ", " : "") + std::to_string(t.dims[i]);
  return s + "}";
}

void print_info(const GgufFile& f, const InfoOptions& opt, std::ostream& out) {
  char line[512];
  out << "file:          " << f.path() << "\n";
  out << "size:          " << f.file_size() << " bytes (" << format_bytes(static_cast<double>(f.file_size())) << ")\n";
  out << "GGUF version:  " << f.version() << "\n";
  out << "alignment:     " << f.alignment() << " (tensor data starts at byte " << f.data_offset() << ")\n";

  const std::string arch(f.get_string("general.architecture").value_or(""));
  out << "architecture:  " << (arch.empty() ? "(not set)" : arch) << "\n";
  if (auto name = f.get_string("general.name")) out << "name:          " << *name << "\n";
  if (!arch.empty()) {
    const std::string prefix = arch + ".";
    for (const auto& [key, value] : f.metadata())
      if (key.compare(0, prefix.size(), prefix) == 0)
        out << "  " << key.substr(prefix.size()) << " = " << render(value, opt.show_all) << "\n";
  }

  if (auto model = f.get_string("tokenizer.ggml.model")) {
    out << "tokenizer:     " << *model;
    if (auto pre = f.get_string("tokenizer.ggml.pre")) out << ", pre-tokenizer " << *pre;
    if (const GgufValue* tokens = f.find("tokenizer.ggml.tokens"); tokens && tokens->array)
      out << ", " << tokens->array->size() << " tokens";
    if (const GgufValue* merges = f.find("tokenizer.ggml.merges"); merges && merges->array)
      out << ", " << merges->array->size() << " merges";
    out << "\n";
  } else {
    out << "tokenizer:     (none)\n";
  }
  if (const GgufValue* tmpl = f.find("tokenizer.chat_template"); tmpl && tmpl->type == GgufValueType::STRING) {
    const auto text = std::get<std::string_view>(tmpl->scalar);
    out << "chat template: " << chat_family(text) << "; first line: "
        << abbreviate(std::string(text.substr(0, text.find('\n'))), 100) << "\n";
  } else {
    out << "chat template: (none)\n";
  }

  out << "\nmetadata (" << f.metadata().size() << " keys):\n";
  for (const auto& [key, value] : f.metadata()) {
    std::string type(value_type_name(value));
    if (value.type == GgufValueType::ARRAY && value.array) {
      GgufValue elem{value.array->elem_type, {}, nullptr};
      type += "[" + std::string(value_type_name(elem)) + " x " + std::to_string(value.array->size()) + "]";
    }
    std::snprintf(line, sizeof line, "  %-40s %-18s ", key.c_str(), type.c_str());
    out << line << render(value, opt.show_all) << "\n";
  }

  // Tensor summary by type.
  struct TypeTotals {
    uint64_t count = 0, elements = 0, bytes = 0;
  };
  std::map<std::string, TypeTotals> by_type;
  uint64_t params = 0, tensor_bytes = 0;
  for (const auto& t : f.tensors()) {
    auto& tt = by_type[std::string(ggml_type_name(t.type))];
    ++tt.count;
    tt.elements += t.n_elements;
    tt.bytes += t.n_bytes;
    params += t.n_elements;
    tensor_bytes += t.n_bytes;
  }
  out << "\ntensors:       " << f.tensors().size() << "\n";
  std::snprintf(line, sizeof line, "  %-6s %7s %16s %16s\n", "type", "count", "elements", "bytes");
  out << line;
  for (const auto& [name, tt] : by_type) {
    std::snprintf(line, sizeof line, "  %-6s %7" PRIu64 " %16" PRIu64 " %16" PRIu64 "  (%s)\n", name.c_str(), tt.count,
                  tt.elements, tt.bytes, format_bytes(static_cast<double>(tt.bytes)).c_str());
    out << line;
  }
  out << "parameters:    " << params << " (" << human_count(params) << ")\n";
  out << "tensor bytes:  " << tensor_bytes << " (" << format_bytes(static_cast<double>(tensor_bytes)) << ")\n";

  if (opt.list_tensors) {
    out << "\n";
    std::snprintf(line, sizeof line, "  %-36s %-6s %-24s %12s %12s\n", "name", "type", "dims", "bytes", "offset");
    out << line;
    for (const auto& t : f.tensors()) {
      std::snprintf(line, sizeof line, "  %-36s %-6s %-24s %12" PRIu64 " %12" PRIu64 "\n", t.name.c_str(),
                    std::string(ggml_type_name(t.type)).c_str(), dims_string(t).c_str(), t.n_bytes, t.file_offset);
      out << line;
    }
  }
}

int run_info(const InfoOptions& opt) {
  try {
    auto file = GgufFile::open(opt.model);
    print_info(*file, opt, std::cout);
    std::cout.flush();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "chunkfuse info: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace

void add_info_command(CLI::App& app, CommandRunner& run) {
  auto opt = std::make_shared<InfoOptions>();
  CLI::App* sub = app.add_subcommand("info", "Show what a GGUF model file contains (header, metadata, tensors)");
  sub->add_option("MODEL", opt->model, "Path of the GGUF file")->required();
  sub->add_flag("--tensors", opt->list_tensors, "List every tensor (name, type, dims, bytes, offset)");
  sub->add_flag("--all", opt->show_all, "Show metadata values in full (no abbreviation of long arrays/strings)");
  sub->callback([&run, opt] { run = [opt] { return run_info(*opt); }; });
}

}  // namespace cf::apps
