#pragma once
// Delayed scaling's end-of-step update (the recipe TransformerEngine calls DelayedScaling): every FP8
// tensor of a step was cast with a scale derived from earlier steps' amaxes and recorded its own amax
// while it was cast; after the optimizer step all of them move on at once, in one pass over E entries:
//
//   history[e] = [amax[e], history[e][0 .. L-2]]           the newest amax first, the oldest dropped
//   used       = max over history[e]  (or history[e][0] with most_recent)
//   scale[e]   = fp8_max[e] / used / 2^margin              unchanged when used is 0 or not finite
//   amax[e]    = 0                                         ready for the next step's casts
//
// A step the trainer skips (a non-finite gradient norm, `skip_if_nonfinite`) pushes nothing: its amaxes
// are dropped and every scale stays. A non-finite amax of one entry is dropped the same way (that entry's
// history and scale stay), so a NaN never reaches a scale. All tensors live on one device and the update
// reads nothing back to the host, so a CUDA graph or a deferred step can run it.
//
// Clipping: a cast with a delayed scale saturates every |x| * scale beyond fp8_max, so a step whose amax
// outgrew the history clipped that tensor's largest values. The update can count those entries: an entry
// counts when the step is applied, its amax is finite and its history held an amax before the step (its
// casts used the history's scale, not current scaling), and amax * scale > fp8_max (in double).
#include <cstdint>

#include "framework/tensor/tensor.h"

namespace cpf::raw {

// How the scale of an entry is derived from its amax history.
enum class AmaxCompute { max, most_recent };

// history (E, L) f32, amax (E) f32, scale (E) f32, fp8_max (E) f32 (448 for E4M3 entries, 57344 for
// E5M2), all contiguous on one device, updated in place as above. margin in [0, 64]. skip_if_nonfinite:
// undefined, or a one-element f32/f64 tensor on that device (the step's gradient sum of squares).
// clipped: undefined, or a () f32 tensor on that device to which the number of clipped entries is added.
void fp8_update_scales(const Tensor& history, const Tensor& amax, const Tensor& scale, const Tensor& fp8_max,
                       int64_t margin, AmaxCompute compute, const Tensor& skip_if_nonfinite = Tensor(),
                       const Tensor& clipped = Tensor());

}  // namespace cpf::raw
