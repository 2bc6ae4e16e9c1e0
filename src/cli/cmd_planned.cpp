#include <cstdio>

#include "cli/command.h"
#include "core/error.h"

namespace gpulab::cli {

void add_planned_command(CLI::App& app, Runner& run, const std::string& name,
                         const std::string& summary) {
  auto* sub = app.add_subcommand(name, summary + " [not built yet]");
  sub->allow_extras();
  sub->callback([&run, name] {
    run = [name] {
      std::fprintf(stderr, "gpulab: `%s` is not built yet in this version; see docs/ and the issue tracker.\n",
                   name.c_str());
      return static_cast<int>(core::kExitBadInput);
    };
  });
}

}  // namespace gpulab::cli
