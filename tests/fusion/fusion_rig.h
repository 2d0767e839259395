// What most fusion tests start from: a forward pass over one model, an in-memory chunk store
// for it and an executor over both.
#pragma once
#include "../runtime/model_fixture.h"
#include "fusion/executor.h"
#include "kv/chunk_store.h"
#include "model/model.h"
#include "runtime/forward.h"

namespace cf::test {

inline ChunkStore memory_store(const Model& m) {
  ChunkStoreOptions o;
  o.model = StoreModel{m.fingerprint(), m.hparams()};
  return ChunkStore(o);
}

// Built in place: the executor keeps references to the forward pass and the store. A test
// names the parts it uses with `auto& [m, fwd, store, ex] = rig;`.
struct FusionRig {
  explicit FusionRig(const Model& model)
      : m(model), fwd(model, shared_pool()), store(memory_store(model)), ex(fwd, store) {}
  FusionRig(const FusionRig&) = delete;
  FusionRig& operator=(const FusionRig&) = delete;

  const Model& m;
  Forward fwd;
  ChunkStore store;
  FusionExecutor ex;
};

}  // namespace cf::test
