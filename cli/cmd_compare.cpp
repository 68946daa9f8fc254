// `microtrain compare A/results.json B/results.json`: the comparison table for two earlier runs
// (other machines, commits or configs). A's baseline variant is the baseline; every measured
// variant of B is compared against it, "what it changed" being the config difference.
// Exit codes: 0 printed, 2 a file is unreadable, not a results.json, or of another schema.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "report/comparison.h"

namespace mt {
namespace {

struct CompareArgs {
    std::string a, b;
    std::string a_variant, b_variant;
};

int run_compare(const CompareArgs& args) {
    try {
        const Results a = read_results(args.a);
        const Results b = read_results(args.b);
        const Comparison c = compare_results(a, args.a, b, args.b, args.a_variant, args.b_variant);
        std::printf("baseline A: %s\nvariants B: %s\n\n%s", args.a.c_str(), args.b.c_str(),
                    render_comparison_md(c).c_str());
        return 0;
    } catch (const ReportError& e) {
        std::fprintf(stderr, "microtrain compare: %s\n", e.what());
        return 2;
    }
}

}  // namespace

void register_compare_command(CLI::App& app, int& exit_code) {
    auto args = std::make_shared<CompareArgs>();
    CLI::App* cmd = app.add_subcommand(
        "compare",
        "Compare two earlier runs: A's baseline against B's variants (the same table "
        "as the run report)");
    cmd->add_option("baseline", args->a, "results.json of the baseline run (A)")->required();
    cmd->add_option("other", args->b, "results.json of the run to compare (B)")->required();
    cmd->add_option("--baseline-variant", args->a_variant,
                    "Variant of A to use as the baseline (default: A's compare.baseline)");
    cmd->add_option("--variant", args->b_variant, "Only this variant of B (default: all)");
    cmd->callback([args, &exit_code] { exit_code = run_compare(*args); });
}

}  // namespace mt
