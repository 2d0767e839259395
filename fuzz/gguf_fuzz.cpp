// libFuzzer target for the GGUF reader: any input must either parse into a file whose
// every accessor is safe, or throw GgufError. The hyperparameters of a known architecture
// (llama, qwen2, qwen3, gemma3 with its window pattern) must be read or refused with a
// std::runtime_error. Crashes, sanitizer reports, other exception
// types and out-of-memory are all findings.
#include <cstddef>
#include <cstdint>
#include <string>

#include "model/arch.h"
#include "model/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<cf::GgufFile> file;
  try {
    file = cf::GgufFile::from_bytes(data, size, "fuzz.gguf");
  } catch (const cf::GgufError&) {
    return 0;
  }
  // Touch the first and last byte of every tensor: ASan flags any range the validation
  // let through that is not inside the image.
  volatile uint8_t sink = 0;
  for (const auto& t : file->tensors()) {
    sink = sink ^ t.data[0] ^ t.data[t.n_bytes - 1];
    (void)t.rows();
  }
  size_t rendered = 0;
  for (const auto& [key, value] : file->metadata()) rendered += cf::GgufFile::to_string(value).size() + key.size();
  (void)rendered;
  // The typed getters must either answer or throw GgufError, never anything else.
  for (const auto& [key, value] : file->metadata()) {
    try { (void)file->get_int(key); } catch (const cf::GgufError&) {}
    try { (void)file->get_float(key); } catch (const cf::GgufError&) {}
    try { (void)file->get_string(key); } catch (const cf::GgufError&) {}
    try { (void)file->get_bool(key); } catch (const cf::GgufError&) {}
    try { (void)file->get_string_array(key); } catch (const cf::GgufError&) {}
    try { (void)file->get_int_array(key); } catch (const cf::GgufError&) {}
    try { (void)file->get_float_array(key); } catch (const cf::GgufError&) {}
  }
  try {
    if (auto arch = file->get_string("general.architecture"))
      if (const cf::ArchDefinition* def = cf::find_arch(*arch)) (void)cf::read_hparams(*file, *def);
  } catch (const std::runtime_error&) {
  }
  return 0;
}
