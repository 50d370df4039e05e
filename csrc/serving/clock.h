// Timeouts of any size as the steady clock's durations and deadlines, saturated: a
// client may ask for a timeout (Triton's `timeout` parameter, gRPC's grpc-timeout of
// up to 99999999 hours) that the clock's 64-bit nanoseconds cannot count; such a wait
// is one without end in practice, not an overflow into the past.
#pragma once

#include <chrono>

namespace paddle_ipu {
namespace serving {

using SteadyClock = std::chrono::steady_clock;

// `seconds` (> 0) as a duration; at most half of what the clock counts (146 years),
// so that adding it to now() never overflows. Zero or less (or NaN): zero.
inline SteadyClock::duration SteadyDuration(double seconds) {
  constexpr SteadyClock::duration kLongest = SteadyClock::duration::max() / 2;
  if (!(seconds > 0)) return SteadyClock::duration::zero();
  if (seconds >= std::chrono::duration<double>(kLongest).count()) return kLongest;
  return std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(seconds));
}

// The time `seconds` from now, saturated as SteadyDuration.
inline SteadyClock::time_point DeadlineAfter(double seconds) {
  return SteadyClock::now() + SteadyDuration(seconds);
}

}  // namespace serving
}  // namespace paddle_ipu
