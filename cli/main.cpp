// microtrain: the command-line entry point. Each sub-command lives in cli/cmd_*.cpp.
#include <cstdio>
#include <exception>
#include <memory>

#include "cli/commands.h"
#include "distributed/world.h"
#include "kernels/openmp_wait.h"

int main(int argc, char** argv) {
    // Threads that spin only briefly at a barrier, then sleep (kernels/openmp_wait.h): before
    // anything, since it may execute this binary again with the policy in its environment.
    mt::choose_openmp_wait_policy(argv);
    // Under mpirun: this process becomes one rank of the job (distributed/world.h); otherwise one
    // rank.
    std::unique_ptr<mt::World> world;
    try {
        world = mt::World::join(&argc, &argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "microtrain: error: %s\n", e.what());
        return 2;
    }
    CLI::App app{
        "microtrain: a GPT-2 microtrainer with hand-written kernels, and a harness that "
        "finds why a training step is slow"};
    app.require_subcommand(1);
    int exit_code = 0;
    mt::register_train_command(app, exit_code);
    mt::register_step_command(app, exit_code);
    mt::register_validate_command(app, exit_code);
    mt::register_run_command(app, exit_code);
    mt::register_compare_command(app, exit_code);
    mt::register_export_command(app, exit_code);
    mt::register_sample_command(app, exit_code);
    mt::register_write_tokens_command(app, exit_code);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "microtrain: error: %s\n", e.what());
        return 1;
    }
    return exit_code;
}
