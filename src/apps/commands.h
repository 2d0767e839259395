// Subcommands of the `chunkfuse` binary; each lives in its own cmd_<name>.cpp and adds
// itself to the CLI11 app. The callback runs the command and returns the exit code.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>

namespace cf::apps {
using CommandRunner = std::function<int()>;
// Each registers its subcommand and sets `run` to be called when it is chosen.
void add_info_command(CLI::App& app, CommandRunner& run);
void add_generate_command(CLI::App& app, CommandRunner& run);
void add_perf_command(CLI::App& app, CommandRunner& run);
void add_ask_command(CLI::App& app, CommandRunner& run);
void add_chunks_command(CLI::App& app, CommandRunner& run);
void add_bench_command(CLI::App& app, CommandRunner& run);
void add_deviation_command(CLI::App& app, CommandRunner& run);
void add_profile_command(CLI::App& app, CommandRunner& run);
void add_calibrate_command(CLI::App& app, CommandRunner& run);
void add_serve_command(CLI::App& app, CommandRunner& run);
}  // namespace cf::apps
