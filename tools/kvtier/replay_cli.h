// tools/kvtier/replay_cli.h — the command-line flags of `kvtier replay` (with --tp's) and
// `kvtier demo`.
//
// Thread safety: called once from main while the command line is parsed.
#pragma once

#include <CLI/CLI.hpp>

#include "demo.h"
#include "replay.h"
#include "replay_tp.h"

namespace kvtier::tools {

// Adds the subcommands; the options are filled when the app parses.
CLI::App* AddReplayCommand(CLI::App& app, ReplayOptions* options);
CLI::App* AddDemoCommand(CLI::App& app, DemoOptions* options);

// Adds --tp, --tp-equal-bytes and --tp-timeout (and the hidden follower flags) to `replay`.
void AddTpReplayFlags(CLI::App* replay, TpReplayArgs* args);

}  // namespace kvtier::tools
