// `microtrain run FILE [--set key=value]... [--out-dir DIR]`: runs every variant of an experiment,
// writes the run folder (report.md, report.html, results.json, steps.csv, trace.json) and prints
// the comparison table and the folder's path. The folder is created before the first variant
// runs (an unusable --out-dir fails at once) and marked PARTIAL until every file is written
// (report/run_folder.h). Stop signals (Ctrl-C, SIGTERM, SIGHUP, ...: engine/signals.h) stop
// the steps; the report of what was measured is still written, and no signal cuts it off.
// Exit codes: 0 all variants ran (or were skipped with a reason, e.g. "needs a GPU", "does not
// fit in memory"), 1 a variant failed (non-finite loss, ...) or the run folder could not be
// completed (it is marked PARTIAL), 2 the experiment file is invalid or the output directory is
// unusable, 128+n stopped by signal n (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "distributed/world.h"
#include "engine/signals.h"
#include "experiment/dist_config_check.h"
#include "experiment/runner.h"
#include "experiment/spec.h"
#include "report/comparison.h"
#include "report/recording.h"
#include "report/run_folder.h"

namespace mt {
namespace {

struct RunArgs {
    std::string file;
    std::vector<std::string> overrides;
    std::string out_dir;
    bool quiet = false;
    std::string inject_variant;
    int inject_nan_at_step = -1;
    int interrupt_at_step = -1;
    std::string fault;
    int fault_rank = -1, fault_step = -1;
};

void print_header(std::FILE* out, const ExperimentSpec& spec, const std::string& dir) {
    if (!out) return;
    std::fprintf(out, "microtrain run: experiment '%s' (%s), %zu variant(s), baseline '%s'\n",
                 spec.name.c_str(), spec.source_path.c_str(), spec.variants.size(),
                 spec.baseline.c_str());
    std::fprintf(out, "  writing to %s (marked PARTIAL until the report is written)\n",
                 dir.c_str());
    for (const RunConfig& v : spec.variants)
        if (v.changed.size() > 1)
            std::fprintf(out,
                         "  note: variant '%s' changes %zu knobs: its effect cannot be "
                         "attributed to one of them\n",
                         v.variant.c_str(), v.changed.size());
}

// Writes the run folder and prints the comparison read back from it. Returns false when the
// folder could not be completed (it is then marked PARTIAL).
bool write_and_print(const Results& results, const std::string& dir) {
    try {
        write_run_files(results, dir);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "microtrain run: could not write the whole report: %s\n", e.what());
        return false;
    }
    try {
        // From the file just written, read back through the schema once: the table printed here
        // is the one results.json holds.
        const Comparison cmp = build_comparison(read_results(dir + "/results.json"));
        std::printf("\n%s\n", render_comparison_md(cmp).c_str());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "microtrain run: could not render the comparison: %s\n", e.what());
        return false;
    }
    std::printf("run folder: %s\n  report: %s/report.md\n  charts: %s/report.html\n", dir.c_str(),
                dir.c_str(), dir.c_str());
    return true;
}

// The runner's options from the flags. `dir`: the run folder, on the rank that writes it (null on
// the others): each finished variant is written there at once (write_finished_variants).
RunnerOptions runner_options(const RunArgs& a, std::FILE* out, World& world, const std::string* dir,
                             size_t total) {
    RunnerOptions ro;
    ro.out = out;
    ro.world = &world;
    ro.inject_variant = a.inject_variant;
    ro.inject_nan_at_step = a.inject_nan_at_step;
    ro.interrupt_at_step = a.interrupt_at_step;
    ro.fault = a.fault;
    ro.fault_rank = a.fault_rank;
    ro.fault_step = a.fault_step;
    ro.handle_sigint = false;  // run_run's StopSignals covers the run and the report
    if (dir)
        ro.variant_finished = [dir, total](const Results& so_far) {
            Results finished = so_far;
            complete_results(finished);
            try {
                write_finished_variants(finished, *dir, total);
            } catch (const std::exception& e) {  // the final write tries again
                std::fprintf(stderr, "microtrain run: warning: %s\n", e.what());
            }
        };
    return ro;
}

int run_run(const RunArgs& a) {
    World& world = World::current();
    const bool leader = world.rank() == 0;  // rank 0 prints and writes the run folder
    ExperimentSpec spec;
    try {
        spec = load_experiment(a.file, a.overrides);
    } catch (const SpecError& e) {
        std::fprintf(
            stderr, "microtrain run: %s%s\n",
            world.distributed() ? ("rank " + std::to_string(world.rank()) + ": ").c_str() : "",
            e.what());
        // A file that is bad on one rank only would leave the others waiting: end the job.
        if (world.distributed()) world.abort(2);
        return 2;
    }
    if (world.distributed()) {
        try {
            if (!same_config_on_every_rank(spec, world)) return 2;
        } catch (const std::exception& e) {
            std::fprintf(stderr, "microtrain run: %s\n", e.what());
            world.abort(2);
        }
    }
    // From here to the end, a stop signal only stops the steps; the report is always written.
    StopSignals signals;
    std::string dir;
    if (leader) {
        try {
            dir = create_run_folder(spec.name, a.out_dir.empty() ? spec.out_dir : a.out_dir);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "microtrain run: %s\n", e.what());
            if (world.distributed()) world.abort(2);
            return 2;
        }
    }
    std::FILE* out = a.quiet || !leader ? nullptr : stdout;
    keep_output_from_blocking(world);
    print_header(out, spec, dir);
    if (out && world.distributed())
        std::fprintf(out,
                     "  data parallel: %d ranks (%s); data.batch_size %d is per rank, the global "
                     "batch is %d\n",
                     world.size(), world.transport().c_str(),
                     spec.variants.empty() ? 0 : spec.variants[0].data.batch_size,
                     spec.variants.empty() ? 0 : spec.variants[0].data.batch_size * world.size());
    const RunnerOptions ro =
        runner_options(a, out, world, leader ? &dir : nullptr, spec.variants.size());
    ExperimentRun ex;
    try {
        ex = run_experiment(spec, ro);
    } catch (const std::exception& e) {
        if (!world.distributed()) throw;
        // A rank failed (or timed out waiting for one that did): the others cannot go on.
        std::fprintf(stderr, "microtrain run: %s; ending the job (all ranks)\n", e.what());
        world.abort(1);
    }
    if (!leader) return ex.stop_signal ? 128 + ex.stop_signal : 0;
    signals.protect_writes();
    // Data parallel and stopped by a signal: mpirun has stopped reading our output while it
    // ends the job, so the report is written before anything more is printed (a print could
    // block until mpirun's SIGKILL).
    const bool quiet_until_written = world.distributed() && ex.stop_signal;
    if (out && !quiet_until_written) std::fprintf(out, "\nwriting the report to %s\n", dir.c_str());
    if (out) std::fflush(out);
    const bool complete = write_and_print(ex.results, dir);
    if (!ex.job_failure.empty()) {
        // Data parallel: the report holds what was measured; the other ranks wait in a
        // collective that will never complete, so the job ends here.
        std::fprintf(stderr, "microtrain run: %s; ending the job (all ranks)\n",
                     ex.job_failure.c_str());
        world.abort(1);
    }
    // A signal after the last step (or while writing) did not cut anything short, but the exit
    // code still says the process was asked to stop.
    const int sig = ex.stop_signal ? ex.stop_signal : stop_signal();
    if (sig) {
        std::fprintf(stderr, "microtrain run: %s by %s; the report covers the steps measured%s\n",
                     ex.results.interrupted ? "interrupted" : "asked to stop",
                     signal_description(sig).c_str(),
                     ex.results.interrupted ? " before it" : " (all of them)");
        return 128 + sig;
    }
    bool failed = false;
    for (const VariantResult& r : ex.results.variants)
        if (r.status == RunStatus::failed) {
            std::fprintf(stderr, "microtrain run: %s\n", r.message.c_str());
            failed = true;
        }
    return failed || !complete ? 1 : 0;
}

}  // namespace

void register_run_command(CLI::App& app, int& exit_code) {
    auto args = std::make_shared<RunArgs>();
    CLI::App* cmd = app.add_subcommand(
        "run",
        "Run an experiment (baseline + variants), time every phase, track memory, and "
        "write the run folder with the baseline-vs-variant report");
    cmd->add_option("file", args->file, "Experiment YAML file")->required();
    add_set_option(cmd, args->overrides,
                   "Override a key of the base config, e.g. --set run.measure_steps=5 "
                   "(repeatable)");
    cmd->add_option("--out-dir", args->out_dir,
                    "Directory for the run folder (default: the file's report.out_dir)");
    cmd->add_flag("--quiet,-q", args->quiet, "No progress output; only the table and the path");
    // Test hooks (hidden): simulate a non-finite loss or Ctrl-C at a step.
    cmd->add_option("--inject-variant", args->inject_variant)->group("");
    cmd->add_option("--inject-nan-at-step", args->inject_nan_at_step)->group("");
    cmd->add_option("--interrupt-at-step", args->interrupt_at_step)->group("");
    // Data-parallel faults (hidden): rank R kills itself / hangs / throws before step S.
    cmd->add_option("--inject-fault", args->fault)->group("");
    cmd->add_option("--inject-fault-rank", args->fault_rank)->group("");
    cmd->add_option("--inject-fault-step", args->fault_step)->group("");
    cmd->callback([args, &exit_code] { exit_code = run_run(*args); });
}

}  // namespace mt
