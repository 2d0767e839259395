// libFuzzer target over the request contract without generation (issue 59): a body goes
// through everything the server does to a completion before the scheduler runs it:
// parse_body, parse_completion (the first byte picks chat or completions), validate_request,
// the documents tokenized as chunks and the prompt laid out with the real SmolLM2 tokenizer
// and chat template, CRAFT's request order and plan_request. Any exception but RequestError
// (the 4xx every refusal is), a sanitizer report or a crash is a finding. No forward pass
// runs, so it searches thousands of inputs a second where http_request_fuzz (the whole
// server, generation included) gets through about one. Seeds and dictionary: http_request's.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "base/paths.h"
#include "fusion/rag_prompt.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "serve/api_json.h"
#include "serve/prompt_layout.h"
#include "serve/request_plan.h"

namespace {

struct Model {
  std::unique_ptr<cf::GgufFile> file;
  std::unique_ptr<cf::Tokenizer> tok;
  cf::ChatTemplate tmpl;
  cf::PlanLimits limits;
};

const Model& model() {
  static const Model m = [] {
    const char* e = std::getenv("CHUNKFUSE_FUZZ_MODEL");
    const std::string path = e && *e ? std::string(e) : cf::cache_root() + "/models/" + cf::kTestModelFile;
    auto file = cf::GgufFile::open(path);  // throws (the run fails loudly) when missing
    auto tok = cf::Tokenizer::from_gguf(*file);
    cf::ChatTemplate tmpl = cf::ChatTemplate::from_gguf(*file);
    cf::PlanLimits limits;
    limits.context_length = 2048;
    limits.max_prompt_tokens = 512;
    limits.max_documents = 8;
    limits.chat_stops = cf::default_chat_stops(tmpl);
    return Model{std::move(file), std::move(tok), std::move(tmpl), std::move(limits)};
  }();
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Model& m = model();
  const bool chat = data[0] % 2 == 0;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    const cf::api::ParsedCompletion pc = cf::api::parse_completion(cf::api::parse_body(body), chat);
    const cf::CompletionRequest& req = pc.request;
    cf::validate_request(req, m.limits);
    cf::PromptLayout layout;
    for (const auto& d : req.documents) {  // registered ids are the engine's: inline texts only
      if (d.text.empty()) continue;
      layout.chunks.push_back(m.tok->encode(cf::document_chunk_text(d.text), false, false));
      layout.chunk_ids.push_back(std::to_string(layout.chunk_ids.size()));
    }
    cf::lay_out_prompt(*m.tok, m.tmpl, req, nullptr, layout);
    cf::check_prompt_fits(layout.tokens(), m.limits, req.chat);
    const cf::RequestPlan plan = cf::plan_request(req, layout, cf::request_order(layout.chunks.size()), m.limits, 1);
    if (plan.prompt_tokens + 1 > m.limits.max_prompt_tokens) std::abort();  // plan_request must refuse it (413)
  } catch (const cf::RequestError& e) {
    if (e.status < 400 || e.status >= 500) std::abort();  // a refusal is a 4xx
  }
  return 0;
}
