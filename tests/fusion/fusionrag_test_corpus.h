// A tiny knowledge base for the FusionRAG tests: three related passages (so BM25 finds
// neighbours) and one unrelated one.
#pragma once
#include <vector>

#include "fusion/rag_prompt.h"

namespace cf::test {

inline std::vector<Passage> fusionrag_corpus() {
  return {
      {"Marie Curie", "Marie Curie was a physicist and chemist who pioneered research on radioactivity. She won "
                      "Nobel Prizes in physics and chemistry."},
      {"Warsaw", "Warsaw is the capital of Poland. Marie Curie was born in Warsaw in 1867."},
      {"Nobel Prize", "The Nobel Prize in chemistry was awarded to Marie Curie in 1911 for radium."},
      {"Basalt", "Basalt is a volcanic rock that forms from lava cooling quickly."},
  };
}

}  // namespace cf::test
