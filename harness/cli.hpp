// The `shardcheck` command line (CLI11). Exit codes follow DESIGN.md: 0 every check passed, 1 a
// check failed, 2 unusable input (the message names what was wrong), 3 the run broke.
#pragma once

namespace shardcheck::harness {

inline constexpr int kExitOk = 0;
inline constexpr int kExitCheckFailed = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitRunBroke = 3;

int run_cli(int argc, char** argv);

}  // namespace shardcheck::harness
