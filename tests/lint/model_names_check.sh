#!/usr/bin/env bash
# The checkpoint layer knows no model (docs/checkpoint.md): fails listing
# file:line for
#  1. a Hugging Face key name or model field name (n_embd, n_head,
#     num_attention_heads, c_attn, "transformer.", q_proj, wte, ...) in any
#     source outside parallel/models/ (tests/ and docs/ may name them);
#  2. an include of parallel/models/ from a library layer (runtime/,
#     collectives/, parallel/ outside parallel/models/): only the programs
#     (launcher/, examples/) hand a model family to the layers below;
#  3. a rename outside runtime/files.cc (fs::rename, ::rename, std::rename,
#     rename(...)): every commit goes through write_file_atomic or
#     commit_directory, through FileOps, so fault injection reaches it
#     (tests/ rename files to damage them on purpose).
# Usage: model_names_check.sh [SOURCE_ROOT]   (default: the repository root)
set -uo pipefail
root="${1:-$(cd "$(dirname "$0")/../.." && pwd)}"
cd "$root" || exit 2
names='\b(n_embd|n_head|n_layer|n_positions|n_inner|n_ctx|num_attention_heads|num_key_value_heads|num_hidden_layers|hidden_size|intermediate_size|max_position_embeddings|vocab_size|rms_norm_eps|layer_norm_epsilon|tie_word_embeddings|c_attn|c_proj|c_fc|q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj|lm_head|embed_tokens|input_layernorm|post_attention_layernorm|wte|wpe|ln_f|ln_1|ln_2|GPT2LMHeadModel|LlamaForCausalLM)\b|"transformer\.|"model\.layers'
sources() { find "$@" -type f \( -name '*.cc' -o -name '*.h' -o -name '*.cpp' -o -name '*.hpp' \) 2>/dev/null | sort; }
bad=0
report() { echo "$1"; bad=1; }
while IFS= read -r f; do
  case "$f" in parallel/models/*) continue ;; esac
  # Code only: comments may cite the public sources (a preset's config.json fields).
  while IFS= read -r hit; do report "$f:$hit: model name outside parallel/models/"; done < <(sed 's://.*$::' "$f" | grep -nE "$names" | cut -c1-160)
done < <(sources runtime collectives parallel launcher examples)
while IFS= read -r f; do
  case "$f" in parallel/models/*) continue ;; esac
  while IFS= read -r hit; do report "$f:$hit: a library layer includes parallel/models/"; done < <(grep -nE '#include "parallel/models/' "$f")
done < <(sources runtime collectives parallel)
while IFS= read -r f; do
  case "$f" in runtime/files.cc | runtime/files.h) continue ;; esac
  while IFS= read -r hit; do report "$f:$hit: renames by itself (use runtime/files.h: write_file_atomic, commit_directory)"; done < <(grep -nE '(fs::|std::|::|\b)rename\(' "$f" | grep -vE '^[0-9]+:\s*//')
done < <(sources runtime collectives parallel launcher examples)
if [ "$bad" -ne 0 ]; then echo "model_names_check: FAILED"; exit 1; fi
echo "model_names_check: OK"
