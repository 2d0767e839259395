// RULER-style synthetic tasks (issue 4, item 3; Hsieh et al., "RULER: What's the Real Context
// Size of Your Long-Context Language Models?"), generated with a seed at a chosen context
// length in tokens. The gold answer is certain and, in the multi-needle tasks, only found by
// attending across chunks, which is where fused prefill can lose it.
//
//   niah_single        one needle "One of the special magic numbers for <key> is: <7 digits>."
//   niah_multikey      four needles with different keys; the question asks for one of them
//   niah_multivalue    four needles with the same key and different values; all are asked for
//   variable_tracking  one chain "VAR A = 12345." "VAR B = VAR A." ... (4 hops, 5 variables);
//                      the question asks for every variable that holds the value
//
// The haystack is essay-like filler: sentences composed from fixed word lists with the
// example's generator (RULER uses Paul Graham's essays, which we do not have offline; its
// niah_single_1 uses one repeated sentence). Needles go to seeded sentence positions (in
// order for the chain). The sentences are grouped, in order, into chunks of at most
// `chunk_tokens` tokens, never splitting a sentence; a chunk is one untitled passage.
// Length: the sum of the chunks' tokens as build_rag_request tokenizes them (each passage +
// "\n\n") is close to and at most about `context_tokens` (RULER counts the whole prompt; we
// count the retrieved context, as ρ does); the question and template come on top.
// The question carries RULER's instruction text, since our system prefix is shared by all
// datasets. Scoring: RULER's string match (metrics.h: string_match_all / string_match_part).
// Deviation: RULER's variable tracking also uses the repeated-sentence noise; here every
// task uses the essay-like filler.
#pragma once
#include <cstdint>
#include <string>

#include "eval/datasets.h"

namespace cf {
class Tokenizer;
}

namespace cf::eval {

enum class RulerTask { niah_single, niah_multikey, niah_multivalue, variable_tracking };

struct RulerOptions {
  RulerTask task = RulerTask::niah_single;
  size_t context_tokens = 4096;
  size_t examples = 100;
  size_t chunk_tokens = 512;
  uint64_t seed = 0;
};

inline constexpr size_t kRulerNeedles = 4;    // multikey / multivalue needles
inline constexpr size_t kRulerChainHops = 4;  // variable tracking: 5 variables

const char* ruler_task_name(RulerTask task);
// "ruler:TASK:LENGTH" (TASK one of the names above, LENGTH in tokens, at least 256), e.g.
// ruler:niah_single:4096. Throws std::invalid_argument naming what is wrong.
RulerOptions parse_ruler_name(const std::string& name);
// The dataset name of these options, "ruler:TASK:LENGTH".
std::string ruler_name(const RulerOptions& opt);

// Deterministic in (tokenizer, options): the same seed gives the same examples.
Dataset generate_ruler(const Tokenizer& tokenizer, const RulerOptions& opt);

}  // namespace cf::eval
