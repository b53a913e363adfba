// A start-up check of the engine's speed against what its hardware should reach
// (Engine::speed_check, which the CPU ops' report answers).
#pragma once

#include <string>

namespace fastformer::engine {

struct SpeedCheck {
  bool ran = false;      ///< false where the engine has no such check
  bool warning = false;  ///< below the floor: `message` names the likely causes
  std::string message;   ///< one line for the log
};

}  // namespace fastformer::engine
