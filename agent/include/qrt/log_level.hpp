#pragma once
// The levels of qrt::log (qrt/log.hpp), alone so that the config
// (agent.log_level, qrt/config.hpp) can name them without pulling in the
// logger.  Their config spelling lives with the config (enum_names).

namespace qrt {

enum class log_level { trace, debug, info, warn, error, critical, off };

}  // namespace qrt
