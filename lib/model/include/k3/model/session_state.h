// Recurrent-state checkpoints of a Session: the whole sequence state
// at one position, so that restoring it and feeding the tail is bit-identical
// to feeding the whole prompt.
//
// A checkpoint owns a copy of every KDA layer's recurrent state and conv
// windows (fixed size, ~475 MB for the real model) and shares the MLA latent
// cache rows (append-only, 55 KB per token for the real model) in immutable
// segments: two checkpoints of one conversation hold the same segments for
// their common prefix, and only the rows past the previous checkpoint are
// copied when a new one is made. Checkpoints are immutable once made and may
// be read from several threads; making and restoring them is a Session call
// (not thread-safe, like the Session).
//
// Failures: RestoreCheckpoint throws k3::Error kInvalidArgument naming what
// differs (fingerprint or layout) before any state moves.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "k3/core/default_init.h"
#include "k3/model/config.h"
#include "k3/model/model.h"

namespace k3::model {

// Sizes of a Session's state for one config, in floats.
struct StateLayout {
  int64_t kda_layers = 0;  // layers with KDA attention
  int64_t mla_layers = 0;  // layers with MLA attention
  int64_t kda_heads = 0, kda_head_dim = 0, kda_proj = 0, conv_kernel = 0;
  int64_t kv_lora = 0, qk_rope = 0;

  static StateLayout For(const ModelConfig& config);
  // One KDA layer: S [H][hd][hd], then the q, k, v conv windows [P][K].
  uint64_t kda_state_floats() const { return static_cast<uint64_t>(kda_heads * kda_head_dim * kda_head_dim); }
  uint64_t conv_floats() const { return static_cast<uint64_t>(kda_proj * conv_kernel); }
  uint64_t kda_layer_floats() const { return kda_state_floats() + 3 * conv_floats(); }
  uint64_t kda_bytes() const { return 4 * kda_layer_floats() * static_cast<uint64_t>(kda_layers); }
  // One MLA row: the normalised latent then the raw rope part.
  uint64_t mla_row_floats() const { return static_cast<uint64_t>(kv_lora + qk_rope); }
  uint64_t mla_bytes_per_token() const {
    return 4 * mla_row_floats() * static_cast<uint64_t>(mla_layers);
  }
  bool operator==(const StateLayout&) const = default;
};

// Everything that changes the numbers a Session produces. Two sessions with
// equal fingerprints produce bit-identical outputs for the same ids.
struct StateFingerprint {
  // XXH3-128 (hex) of config.json, every shard's name, size and tensor table,
  // the resident weight formats and the f32 norm/bias vectors, and the layer
  // count actually run: a different model, seed, bits per class, container
  // downcast or K3_LAYERS gives a different value.
  std::string model;
  // The run choices, readable: "idot=1 chunk=32 topp=0 isa=avx512".
  std::string options;
  bool operator==(const StateFingerprint&) const = default;
};

// Immutable MLA cache rows of every MLA layer for positions [begin, end).
struct MlaSegment {
  int64_t begin = 0;
  int64_t end = 0;
  std::vector<int32_t> ids;  // [end - begin]: the ids fed at those positions
  // [mla layer][end - begin][kv_lora + qk_rope]. Default-initialising: resize()
  // leaves the floats unwritten for the copy or read that fills them (a loaded
  // checkpoint writes each byte once).
  DefaultInitVector<float> rows;
  uint64_t bytes() const { return rows.size() * sizeof(float); }
};

struct SessionCheckpoint {
  StateFingerprint fingerprint;
  StateLayout layout;
  int64_t position = 0;
  std::vector<int32_t> ids;  // [position]: every id fed, in order
  // Every KDA layer in layer order, each layout.kda_layer_floats() long;
  // default-initialising like MlaSegment::rows.
  DefaultInitVector<float> kda;
  // Contiguous segments covering [0, position), in order; shared.
  std::vector<std::shared_ptr<const MlaSegment>> mla;

  uint64_t kda_bytes() const { return kda.size() * sizeof(float); }
  uint64_t mla_bytes() const;  // sum over the referenced segments
  // Row `row` of MLA layer `mla_layer` (0-based among MLA layers).
  const float* MlaRow(int64_t mla_layer, int64_t row) const;
};

// The fingerprint of `model` run with `options` on the kernels active now.
// `model_id`, when given, is a previously computed .model of the same Model
// (hashing the tensor tables of the real model takes tens of ms).
StateFingerprint ComputeFingerprint(const Model& model, const RunOptions& options,
                                    const std::string* model_id = nullptr);

}  // namespace k3::model
