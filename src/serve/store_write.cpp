#include "serve/store_write.h"

#include <cerrno>
#include <system_error>

namespace cf {

RequestError store_write_error(const std::string& what, const std::exception& e) {
  const auto* sys = dynamic_cast<const std::system_error*>(&e);
  const int code = sys && sys->code().category() == std::generic_category() ? sys->code().value() : 0;
  if (code == ENOSPC || code == EDQUOT)
    return RequestError(507, "insufficient_storage",
                        "the disk holding the store is full: " + what + " could not be saved, nothing was changed (" +
                            e.what() + "); free space or lower --disk-budget, then retry");
  return RequestError(503, "server_error",
                      what + " could not be saved, nothing was changed (" + std::string(e.what()) + "); retry later");
}

}  // namespace cf
