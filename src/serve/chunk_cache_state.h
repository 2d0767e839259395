// Where a knowledge-base chunk's cache is and which methods' offline work it carries (issue 12,
// item 1: "cache state (memory, disk, variants, anchors)"), for GET /v1/knowledge/chunks:
//   memory   in the chunk store's memory tier
//   disk     its cache file exists
//   remote   in the Redis tier (null: no remote tier configured, or Redis did not answer)
//   variants Cache-Craft after-prefix variants listed in its PIC entry (select_cachecraft.cpp)
//   anchors  QCFuse's anchor ranking is stored with it (qcfuse_anchors.cpp), made by the
//            first qcfuse request that used the chunk
// Read without loading the cache (memory copy, else the file's header and metadata).
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace cf {

class ChunkStore;

nlohmann::json chunk_cache_state(const ChunkStore& store, const std::string& cache_id);

}  // namespace cf
