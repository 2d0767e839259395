#include "fusion/selector.h"

#include <cmath>
#include <stdexcept>

namespace cf {

size_t recompute_budget(double ratio, size_t n) {
  if (!(ratio >= 0.0 && ratio <= 1.0)) throw std::invalid_argument("ratio must be in [0, 1]");
  return std::min(n, static_cast<size_t>(std::floor(ratio * static_cast<double>(n) + 1e-9)));
}

nlohmann::json MethodParam::to_json() const {
  nlohmann::json j{{"name", name}, {"type", type}, {"default", default_value}, {"help", help}};
  if (!values.empty()) j["values"] = values;
  return j;
}

}  // namespace cf
