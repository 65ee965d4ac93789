// Activation slots (several micro-batches in flight, parallel/models/*): a
// slot's copy of a layer holds Parameters that alias slot 0's, so the
// optimizer sees one set. Header-only; thread-safe on distinct Parameters.
#pragma once

#include <memory>
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

// Slot i of a stage's activation slots, made as needed: slot 0 runs the
// model's own `blocks`; every further slot owns blocks of its own
// (make_block(l) for the l-th) whose Parameters alias slot 0's. Slot needs
// members `blocks` (std::vector<Block*>) and `own` (their owners).
template <class Slot, class Block, class MakeBlock>
Slot& activation_slot(std::vector<std::unique_ptr<Slot>>& slots, const std::vector<std::unique_ptr<Block>>& blocks,
                      int i, MakeBlock&& make_block) {
  TESSERA_CHECK(i >= 0 && i <= 1024, "activation slot ", i, " out of range");
  while (static_cast<int>(slots.size()) <= i) {
    auto s = std::make_unique<Slot>();
    if (slots.empty()) {
      for (const auto& b : blocks) s->blocks.push_back(b.get());
    } else {
      for (size_t l = 0; l < blocks.size(); ++l) {
        s->own.push_back(make_block(l));
        alias_parameters(blocks[l]->params(), s->own.back()->params());
        s->blocks.push_back(s->own.back().get());
      }
    }
    slots.push_back(std::move(s));
  }
  return *slots[static_cast<size_t>(i)];
}

}  // namespace tessera::parallel::layers
