// The request the benchmark builds for one example (issue 4, item 2: passage-as-chunk or
// fixed-size re-chunking). Retrieval order is kept either way.
//
//   chunk_tokens == 0   one chunk per passage (build_rag_request: each passage tokenized on
//                       its own, as a deployment caches it)
//   chunk_tokens == N   the passages' texts (passage_text: title line, text, separator)
//                       concatenated in retrieval order, tokenized once, and cut every N
//                       tokens; the last chunk holds the rest. Boundaries are at token
//                       level, so a chunk may start mid-word or mid-passage, as in the
//                       papers' fixed-size chunking.
// The system prefix S and question suffix U are the same in both layouts.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "eval/datasets.h"
#include "fusion/executor.h"
#include "fusion/fusionrag_enrich.h"
#include "fusion/rag_prompt.h"

namespace cf::eval {

// Consecutive pieces of `n` tokens (the last may be shorter); none when `tokens` is empty.
// Throws std::invalid_argument when n is 0.
std::vector<std::vector<TokenId>> split_tokens(const std::vector<TokenId>& tokens, size_t n);

RagRequest build_example_request(const Model& model, const QaExample& example, const RagPromptOptions& prompt,
                                 size_t chunk_tokens = 0);

// Exactly `n_chunks` chunks for example `index` (the paper's 20 chunks a request, §4.1): its
// passages, then those of the following examples (wrapping around) as distractors, until
// the layout above yields n_chunks; the rest is cut off. Throws std::invalid_argument when
// the whole dataset is too short or n_chunks is 0.
RagRequest build_example_request_filled(const Model& model, const Dataset& dataset, size_t index,
                                        const RagPromptOptions& prompt, size_t chunk_tokens, size_t n_chunks);
// The answer of a fused (or full) prefill as the benchmark decodes it: greedy, to the first
// newline or max_tokens (the bench and `chunkfuse calibrate` compare answers decoded alike).
struct DecodedAnswer {
  std::string answer;
  size_t tokens = 0;
  double decode_tok_s = 0;
  std::string stop_reason;
};
DecodedAnswer decode_answer(Forward& fwd, FusionResult& r, const std::vector<TokenId>& prompt, int max_tokens);

// FusionRAG's knowledge base for a dataset (§3.1): every chunk of every example, also
// beyond a --limit, so a chunk's neighbours come from the whole corpus as in the paper's
// offline stage, not only from the passages retrieved with it.
std::vector<CorpusChunk> dataset_knowledge_base(const Model& model, const Dataset& dataset,
                                                const RagPromptOptions& prompt, size_t chunk_tokens = 0);

}  // namespace cf::eval
