#include "eval/bench_request.h"

#include <algorithm>
#include <stdexcept>

#include "runtime/generate.h"

namespace cf::eval {

std::vector<std::vector<TokenId>> split_tokens(const std::vector<TokenId>& tokens, size_t n) {
  if (n == 0) throw std::invalid_argument("split_tokens: the chunk size must be positive");
  std::vector<std::vector<TokenId>> out;
  for (size_t at = 0; at < tokens.size(); at += n)
    out.emplace_back(tokens.begin() + static_cast<long>(at), tokens.begin() + static_cast<long>(std::min(tokens.size(), at + n)));
  return out;
}

RagRequest build_example_request(const Model& model, const QaExample& example, const RagPromptOptions& prompt,
                                 size_t chunk_tokens) {
  if (chunk_tokens == 0) return build_rag_request(model, example.passages, example.question, prompt);
  RagRequest r = build_rag_request(model, {}, example.question, prompt);  // S and U only
  std::string context;
  for (const auto& p : example.passages) context += passage_text(p, prompt);
  r.chunks = split_tokens(model.tokenizer().encode(context, /*add_special=*/false, /*parse_special=*/false), chunk_tokens);
  return r;
}

RagRequest build_example_request_filled(const Model& model, const Dataset& dataset, size_t index,
                                        const RagPromptOptions& prompt, size_t chunk_tokens, size_t n_chunks) {
  if (n_chunks == 0) throw std::invalid_argument("chunks per request must be positive");
  if (index >= dataset.examples.size()) throw std::invalid_argument("example index out of range");
  QaExample ex = dataset.examples[index];
  RagRequest r = build_example_request(model, ex, prompt, chunk_tokens);
  for (size_t d = 1; r.chunks.size() < n_chunks && d < dataset.examples.size(); ++d) {
    const QaExample& other = dataset.examples[(index + d) % dataset.examples.size()];
    ex.passages.insert(ex.passages.end(), other.passages.begin(), other.passages.end());
    r = build_example_request(model, ex, prompt, chunk_tokens);
  }
  if (r.chunks.size() < n_chunks)
    throw std::invalid_argument("the dataset holds fewer than " + std::to_string(n_chunks) + " chunks");
  r.chunks.resize(n_chunks);
  return r;
}

std::vector<CorpusChunk> dataset_knowledge_base(const Model& model, const Dataset& dataset,
                                                const RagPromptOptions& prompt, size_t chunk_tokens) {
  std::vector<CorpusChunk> kb;
  for (const QaExample& ex : dataset.examples)
    for (auto& c : build_example_request(model, ex, prompt, chunk_tokens).chunks)
      kb.push_back({model.tokenizer().decode(c, false), std::move(c)});
  return kb;
}

DecodedAnswer decode_answer(Forward& fwd, FusionResult& r, const std::vector<TokenId>& prompt, int max_tokens) {
  Generator gen(fwd);
  GenerateOptions opt;
  opt.max_tokens = max_tokens;
  opt.sampling.temperature = 0;  // greedy
  opt.stop = {"\n"};
  GenerateResult g = gen.continue_from(r.cache, r.logits, r.next_position, prompt, opt);
  return {g.text, g.tokens.size(), g.decode_tokens_per_s(), g.stop_reason};
}

}  // namespace cf::eval
