// kvouter: the command line (SPEC §4). Subcommands: run, compare, demo, roofline, make-case, export,
// sweep, sweep-merge, tune; each in its own file under experiments/cli/.
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "cli/cli.h"
#include "kvouter/errors.h"
#include "registry.h"

using namespace kvouter;
using namespace kvouter::cli;

int main(int argc, char** argv) {
  kx::register_all_backends();
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    main_help();
    return args.empty() ? kExitBadInput : 0;
  }
  const std::string cmd = args[0];
  args.erase(args.begin());
  const bool wants_help = std::find(args.begin(), args.end(), "--help") != args.end() ||
                          std::find(args.begin(), args.end(), "-h") != args.end();
  if (wants_help && cmd != "run" && command_help(cmd)) return 0;
  try {
    if (cmd == "run") {
      if (wants_help) {
        run_help();
        return 0;
      }
      return cmd_run(args);
    }
    if (cmd == "demo") return cmd_demo(args);
    if (cmd == "compare") return cmd_compare(args);
    if (cmd == "roofline") return cmd_roofline(args);
    if (cmd == "make-case") return cmd_make_case(args);
    if (cmd == "export") return cmd_export(args);
    if (cmd == "tune") return cmd_tune(args);
    if (cmd == "sweep") return cmd_sweep(args);
    if (cmd == "sweep-merge") return cmd_sweep_merge(args);
    throw UsageError("unknown command '" + cmd + "' (see kvouter --help)");
  } catch (const UsageError& e) {
    std::cerr << "kvouter: usage error: " << e.what() << std::endl;
  } catch (const InputError& e) {
    std::cerr << "kvouter: invalid input: " << e.what() << std::endl;
  } catch (const CaseFileError& e) {
    std::cerr << "kvouter: case file error: " << e.what() << std::endl;
  } catch (const BackendError& e) {
    std::cerr << "kvouter: backend error: " << e.what() << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "kvouter: error: " << e.what() << std::endl;
  }
  return kExitBadInput;
}
