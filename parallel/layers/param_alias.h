// Activation slots (several micro-batches in flight, parallel/models/*): a
// slot's copy of a layer holds Parameters that alias slot 0's, so the
// optimizer sees one set. Header-only; thread-safe on distinct Parameters.
#pragma once

#include <vector>

#include "parallel/layers/parameter.h"
#include "runtime/error.h"

namespace tessera::parallel::layers {

// Points copy[k] at base[k]'s value, gradient and place in the optimizer's
// buffers. Throws when a base Parameter is not bound yet.
inline void alias_parameters(const std::vector<Parameter*>& base, const std::vector<Parameter*>& copy) {
  TESSERA_CHECK(base.size() == copy.size(), "alias_parameters: ", base.size(), " vs ", copy.size(), " parameters");
  for (size_t k = 0; k < base.size(); ++k) {
    TESSERA_CHECK(base[k]->value != nullptr, "activation slots need bound parameters (", base[k]->name, ")");
    copy[k]->value = base[k]->value;
    copy[k]->grad = base[k]->grad;
    copy[k]->offset = base[k]->offset;
    copy[k]->index = base[k]->index;
  }
}

}  // namespace tessera::parallel::layers
