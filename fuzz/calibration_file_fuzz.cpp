// Fuzz target for the auto policy's calibration files (issue 26, fusion/auto_quality.h): the
// engine reads <cache>/calibrations/<fingerprint>.auto.json at start-up, a file anyone may
// have damaged or edited by hand. Each input must parse or be refused with
// std::invalid_argument naming the field (or, before it, as not JSON or too deep); any other
// exception, a crash or a sanitizer report is a finding. A file that parses must survive what
// the engine does with it (a policy per target and request size, every step it names
// predicted) and writing and reading again.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string_view>

#include "base/bounded_json.h"
#include "fusion/auto_quality.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  nlohmann::json j;
  try {
    j = cf::parse_json_bounded(text);
  } catch (const nlohmann::json::exception&) {  // not JSON (the engine: "not a calibration file")
    return 0;
  } catch (const cf::JsonTooDeep&) {
    return 0;
  }
  cf::autoq::AutoCalibration cal;
  try {
    cal = cf::autoq::AutoCalibration::parse(j, "fuzz");
  } catch (const std::invalid_argument&) {
    return 0;
  }
  for (double q : {0.01, 0.5, 0.9, 1.0})
    for (size_t tokens : {size_t{0}, size_t{3000}, SIZE_MAX}) {
      const cf::autoq::AutoPolicy& p = cal.policy_for(q, tokens);
      for (size_t k : p.steps) (void)cal.predict(k, {});
    }
  const cf::autoq::AutoCalibration again = cf::autoq::AutoCalibration::parse(cal.to_json(), "again");
  if (again.size_classes.size() != cal.size_classes.size() || again.steps.size() != cal.steps.size()) std::abort();
  return 0;
}
