// tessera_tools: every `tessera` subcommand (launcher/front_end.h).
#include "launcher/bench_cli.h"
#include "launcher/ckpt_cli.h"
#include "launcher/front_end.h"
#include "launcher/plan_cli.h"
#include "launcher/run_cli.h"

int main(int argc, char** argv) {
  using namespace tessera::launcher;
  return front_end_main(argc, argv, {&add_run_command, &add_bench_command, &add_plan_command, &add_ckpt_command});
}
