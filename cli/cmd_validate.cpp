// `microtrain validate FILE [--set key=value]...`: parses and checks an experiment without
// running it, then prints the base config and what each variant changes. Exit 0 when valid,
// 2 with the SpecError message (FILE:LINE:COL: key ...: expected ..., got ...; fix) otherwise.
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "checkpoint/pretrained.h"
#include "cli/commands.h"
#include "engine/data.h"
#include "experiment/spec.h"

namespace mt {
namespace {

// model.init_from of the base and of each variant that changes it: what will be loaded (the
// spec has read and checked its headers already; this reads them again to describe them).
void print_starting_points(const ExperimentSpec& spec) {
    std::set<std::string> shown;
    auto show = [&](const RunConfig& c) {
        if (c.init_from.empty() || !shown.insert(c.init_from).second) return;
        std::printf("\nmodel.init_from %s:\n  %s\n", c.init_from.c_str(),
                    inspect_pretrained(c.init_from).describe().c_str());
    };
    show(spec.base);
    for (const RunConfig& v : spec.variants) show(v);
}

struct ValidateArgs {
    std::string file;
    std::vector<std::string> overrides;
};

const char* backend_name(BackendChoice b) {
    switch (b) {
        case BackendChoice::cpu:
            return "cpu";
        case BackendChoice::cuda:
            return "cuda";
        case BackendChoice::auto_:
            return "auto";
    }
    return "?";
}

// Where a config would run here: auto means cuda when a device answers.
bool runs_on_cuda_here(const RunConfig& c, bool have_cuda) {
    return c.backend == BackendChoice::cuda || (c.backend == BackendChoice::auto_ && have_cuda);
}

// Reads every distinct data file the variants name, as the loader will: tokens >= vocab_size, a
// malformed header, invalid UTF-8, a FIFO or a file too short for one batch fail here, before
// the experiment runs. Returns 2 (with the message) on the first bad one, else 0.
// data.val_path is read the same way (check_data_sources).
int check_data_files(const ExperimentSpec& spec) {
    std::set<std::tuple<DataSource, std::string, std::string, int, int, int>> seen;
    for (const RunConfig& v : spec.variants) {
        const DataConfig& d = v.data;
        if (d.source == DataSource::synthetic ||
            !seen.insert(
                     {d.source, d.path, d.val_path, v.model.vocab_size, d.batch_size, d.seq_len})
                 .second)
            continue;
        try {
            check_data_sources(d, v.model.vocab_size);
        } catch (const DataError& e) {
            std::fprintf(stderr, "microtrain validate: %s: variant '%s': %s\n",
                         spec.source_path.c_str(), v.variant.c_str(), e.what());
            return 2;
        }
    }
    return 0;
}

int run_validate(const ValidateArgs& a) {
    ExperimentSpec spec;
    try {
        spec = load_experiment(a.file, a.overrides);
    } catch (const SpecError& e) {
        std::fprintf(stderr, "microtrain validate: %s\n", e.what());
        return 2;
    }
    if (int rc = check_data_files(spec); rc != 0) return rc;
    std::string why_no_cuda;
    const bool have_cuda = cuda_available(&why_no_cuda);

    std::printf("%s: experiment '%s', %zu variant%s, baseline '%s'\n", a.file.c_str(),
                spec.name.c_str(), spec.variants.size(), spec.variants.size() == 1 ? "" : "s",
                spec.baseline.c_str());
    const std::string tolerance =
        spec.loss_tolerance
            ? std::to_string(*spec.loss_tolerance) + " (relative, mean and final loss)"
            : std::string("from the baseline's step-to-step loss spread");
    std::printf("compare: loss_tolerance %s   min_effect %g   report: out_dir %s\n",
                tolerance.c_str(), spec.min_effect, spec.out_dir.c_str());
    for (const auto& o : a.overrides) std::printf("--set %s\n", o.c_str());

    // The base config is what every variant starts from; the variants list only what they change:
    // the baseline against the base config, every other variant against the baseline (what the
    // report compares it with).
    const RunConfig& first = spec.base;
    std::printf("\nbase config:\n");
    for (const auto& [key, value] : flatten(spec.base))
        std::printf("  %-24s %s\n", key.c_str(), value.empty() ? "-" : value.c_str());

    print_starting_points(spec);

    std::printf("\nvariants:\n");
    int multi_knob = 0;
    for (const auto& v : spec.variants) {
        std::string line = "  " + v.variant;
        if (v.variant == spec.baseline) line += " (baseline)";
        std::printf("%s\n", line.c_str());
        if (v.variant == spec.baseline) {
            for (const auto& [key, value] : spec.baseline_changes)
                std::printf("      %s = %s\n", key.c_str(), value.c_str());
            std::printf("      %s: every other variant is compared with it\n",
                        spec.baseline_changes.empty() ? "the base config, unchanged"
                                                      : "the base config with the above");
        } else if (v.changed.empty()) {
            std::printf(
                "      the baseline's config, unchanged: an A/A check (its time call measures the "
                "machine alone)\n");
        } else {
            for (const auto& [key, value] : v.changed)
                std::printf("      %s = %s\n", key.c_str(), value.c_str());
            if (v.changed.size() > 1) {
                std::printf("      changes %zu knobs: effect cannot be attributed to one\n",
                            v.changed.size());
                ++multi_knob;
            }
        }
        const std::vector<std::string> needs = cuda_only_features(v);
        const bool on_cuda = runs_on_cuda_here(v, have_cuda);
        if (!needs.empty() && (!on_cuda || !have_cuda)) {
            std::string list;
            for (const auto& n : needs) list += (list.empty() ? "" : ", ") + n;
            std::string reason;
            if (v.backend == BackendChoice::cpu)
                reason = "backend is cpu";
            else
                reason = "no CUDA device here (see below)";
            std::printf("      note: needs a GPU (%s); %s: it cannot run here as configured\n",
                        list.c_str(), reason.c_str());
        }
    }
    const char* here = runs_on_cuda_here(first, have_cuda) ? "cuda" : "cpu";
    if (first.backend == BackendChoice::cuda && !have_cuda)
        std::printf("\nbackend cuda: no CUDA device on this machine (%s)\n", why_no_cuda.c_str());
    else
        std::printf("\nbackend %s -> %s on this machine%s\n", backend_name(first.backend), here,
                    have_cuda ? "" : (" (" + why_no_cuda + ")").c_str());
    if (multi_knob == 0)
        std::printf("OK: %s is valid; every variant changes at most one knob\n", a.file.c_str());
    else
        std::printf("OK: %s is valid; %d variant%s change%s more than one knob\n", a.file.c_str(),
                    multi_knob, multi_knob == 1 ? "" : "s", multi_knob == 1 ? "s" : "");
    return 0;
}

}  // namespace

void register_validate_command(CLI::App& app, int& exit_code) {
    auto args = std::make_shared<ValidateArgs>();
    CLI::App* cmd = app.add_subcommand(
        "validate", "Check an experiment file without running it; print each variant's config");
    cmd->add_option("file", args->file, "Experiment YAML file")->required();
    add_set_option(cmd, args->overrides,
                   "Override a config key before the variants apply, e.g. --set run.seed=7 "
                   "(repeatable)");
    cmd->callback([args, &exit_code] { exit_code = run_validate(*args); });
}

}  // namespace mt
