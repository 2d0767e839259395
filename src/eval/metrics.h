// Answer-quality and fidelity metrics of the evaluation harness (issue 4, item 4).
//
// Quality against gold answers follows LongBench's qa_f1_score (itself SQuAD's): normalise
// both strings (lower-case, drop punctuation, drop the articles a/an/the, collapse
// whitespace), split on whitespace, token F1 from the multiset overlap; the score of a
// prediction is the maximum over its gold answers. Exact match and ROUGE-L use the same
// normalisation. Fidelity compares a method's output with full prefill's.
//
// Deviations, written down:
//  - Lower-casing is ASCII only (Python's str.lower() also folds non-ASCII letters);
//    punctuation is Python's string.punctuation (ASCII), as in SQuAD.
//  - ROUGE-L is the F1 (beta = 1) of LCS precision and recall over normalised tokens;
//    LongBench calls the `rouge` package, whose own tokeniser differs slightly.
//  - fidelity_f1: two answers that are both empty after normalisation are identical, so
//    they score 1 (LongBench's F1 gives 0 when nothing overlaps, including empty vs empty).
#pragma once
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cf::eval {

std::string normalize_answer(std::string_view s);
std::vector<std::string> normalized_tokens(std::string_view s);

// Token F1 of one prediction against one reference (0 when either has no tokens).
double token_f1(std::string_view prediction, std::string_view reference);
// LongBench qa_f1: max token F1 over the gold answers (0 with no gold answers).
double qa_f1(std::string_view prediction, const std::vector<std::string>& gold);
// 1 if the normalised prediction equals some normalised gold answer.
double exact_match(std::string_view prediction, const std::vector<std::string>& gold);
// ROUGE-L F1 over normalised tokens (0 when either is empty); max over gold answers.
double rouge_l(std::string_view prediction, std::string_view reference);
double rouge_l(std::string_view prediction, const std::vector<std::string>& gold);

// RULER's string match (its evaluate.py): case-insensitive (ASCII) substring containment of
// the raw strings, no other normalisation. string_match_all: the fraction of the gold
// strings contained in the prediction (every one is required); string_match_part: 1 if any
// gold string is contained (alternatives). 0 with no gold strings.
double string_match_all(std::string_view prediction, const std::vector<std::string>& gold);
double string_match_part(std::string_view prediction, const std::vector<std::string>& gold);

// Token F1 of a method's answer against full prefill's; 1 when both are empty.
double fidelity_f1(std::string_view method_answer, std::string_view full_answer);
// KL(P || Q), P = softmax(reference logits) (full prefill), Q = softmax(method logits),
// in double precision. Throws std::invalid_argument on different or zero sizes.
double kl_divergence_from_logits(std::span<const float> reference, std::span<const float> method);
// Whether the greedy first tokens (argmax, lowest id on ties) agree.
bool first_token_agrees(std::span<const float> reference, std::span<const float> method);

}  // namespace cf::eval
