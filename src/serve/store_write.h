// A store write the server could not make (issue 59, full disk), as the client's answer. Every
// file the server keeps beside its caches (serve-chunks.json, knowledge-base.json) is written
// before the change it records is made in memory (write, then commit), so a refused write
// changes nothing and the client can simply send the request again.
#pragma once
#include <exception>
#include <string>

#include "serve/request.h"

namespace cf {

// 507 insufficient_storage ("the disk holding the store is full") when `e` is a write that
// failed with ENOSPC or EDQUOT (kv/store_paths.h keeps errno), else 503 server_error (another
// I/O fault: retry later). `what` names the file, e.g. "the chunk index".
RequestError store_write_error(const std::string& what, const std::exception& e);

}  // namespace cf
