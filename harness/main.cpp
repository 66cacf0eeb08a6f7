// Entry point of the `shardcheck` executable.
#include "harness/cli.hpp"

int main(int argc, char** argv) {
  return shardcheck::harness::run_cli(argc, argv);
}
