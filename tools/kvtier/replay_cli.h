// tools/kvtier/replay_cli.h — the command-line flags of `kvtier replay` and `kvtier demo`.
//
// Thread safety: called once from main while the command line is parsed.
#pragma once

#include <CLI/CLI.hpp>

#include "demo.h"
#include "replay.h"

namespace kvtier::tools {

// Adds the subcommands; the options are filled when the app parses.
CLI::App* AddReplayCommand(CLI::App& app, ReplayOptions* options);
CLI::App* AddDemoCommand(CLI::App& app, DemoOptions* options);

}  // namespace kvtier::tools
