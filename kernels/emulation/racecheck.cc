// Order-dependence check: the same launch sequence under two schedules, results compared.
#include <string>

#include "kernels/emulation/emulator.h"

namespace ff_emu {

RaceCheckResult racecheck(const std::function<void()>& run,
                          const std::function<std::vector<std::uint8_t>()>& snapshot) {
  struct RestoreSchedule {
    Schedule saved = schedule();
    ~RestoreSchedule() { set_schedule(saved); }
  } restore;
  set_schedule(Schedule::kForward);
  run();
  const std::vector<std::uint8_t> forward = snapshot();
  set_schedule(Schedule::kReverse);
  run();
  const std::vector<std::uint8_t> reverse = snapshot();

  RaceCheckResult result;
  result.snapshot_bytes = forward.size();
  if (forward.size() != reverse.size()) {
    result.order_dependent = true;
    result.first_difference = std::min(forward.size(), reverse.size());
    result.message = "the snapshots differ in size: " + std::to_string(forward.size()) +
                     " bytes forward, " + std::to_string(reverse.size()) + " reverse";
    return result;
  }
  for (std::size_t i = 0; i < forward.size(); ++i) {
    if (forward[i] != reverse[i]) {
      result.order_dependent = true;
      result.first_difference = i;
      result.message =
          "results depend on the order threads or blocks run between barriers: byte " +
          std::to_string(i) + " of " + std::to_string(forward.size()) + " is " +
          std::to_string(forward[i]) + " forward, " + std::to_string(reverse[i]) +
          " reverse (a missing __syncthreads / __syncwarp, or an order-dependent combine)";
      return result;
    }
  }
  result.message = "the same " + std::to_string(forward.size()) + " bytes under both schedules";
  return result;
}

}  // namespace ff_emu
