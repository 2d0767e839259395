// chunkfuse: the command line. Each subcommand lives in its own cmd_<name>.cpp.
#include <cstdio>
#include <exception>

#include "apps/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"chunkfuse: a RAG inference engine that reuses the KV caches of retrieved chunks"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "chunkfuse 0.1.0");
  cf::apps::CommandRunner run;
  cf::apps::add_info_command(app, run);
  cf::apps::add_generate_command(app, run);
  cf::apps::add_perf_command(app, run);
  cf::apps::add_ask_command(app, run);
  cf::apps::add_chunks_command(app, run);
  cf::apps::add_bench_command(app, run);
  cf::apps::add_deviation_command(app, run);
  cf::apps::add_profile_command(app, run);
  cf::apps::add_calibrate_command(app, run);
  cf::apps::add_serve_command(app, run);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return run ? run() : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "chunkfuse: %s\n", e.what());
    return 1;
  }
}
