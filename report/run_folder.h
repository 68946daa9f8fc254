// The run folder of `microtrain run`: <out_dir>/<experiment>-<YYYYmmdd-HHMMSS>[-N]/ with
// results.json, steps.csv, trace.json, report.md, report.html.
//
// - Created first, before any variant runs, so an unusable output directory (read-only, not a
//   directory, disk full) is found at once, not after the whole experiment.
// - Created exclusively (mkdir, which fails when the name exists; then the next suffix -2, -3,
//   ...), so two runs that start in the same second never share a folder.
// - Marked incomplete from the start: a PARTIAL file says the run is in progress; it is removed
//   only once every file is written. A write that cannot finish (disk full, I/O error) rewrites
//   PARTIAL to list what is there and what is missing, and why; a run killed outright (SIGKILL,
//   power loss) leaves the last PARTIAL: while variants finish, results.json holds the finished
//   ones and PARTIAL says so (write_finished_variants). Each file is written atomically
//   (io/atomic_file.h): whole or absent, and no temporary file stays behind.
#pragma once

#include <stdexcept>
#include <string>

#include "report/results.h"

namespace mt {

// The folder cannot be created or written: names the path, the step and the OS error.
struct RunFolderError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

inline constexpr const char* kPartialMarker = "PARTIAL";

// Creates the run folder for experiment `name` under `out_dir` (created too when missing) and
// writes its PARTIAL marker. Returns the folder's path. Throws RunFolderError.
std::string create_run_folder(const std::string& name, const std::string& out_dir);

// Writes every file of the run folder `dir` (results.json first), then removes PARTIAL. When a
// file cannot be written, the others are still tried, PARTIAL is rewritten with what is missing
// and why, temporaries are removed and RunFolderError is thrown.
void write_run_files(const Results& results, const std::string& dir);

// While the run goes on: writes results.json of the variants finished so far (`so_far`, with its
// comparison built: report/recording.h complete_results) and rewrites PARTIAL to say that it
// holds `so_far.variants.size()` of `variants_total` variants. So a run that dies later (a
// data-parallel rank killed, after which mpirun kills rank 0 before its report) loses at most
// the variant in progress. Each file atomically; throws RunFolderError.
void write_finished_variants(const Results& so_far, const std::string& dir, size_t variants_total);

// Creates the run folder under `out_dir` and writes it (create_run_folder + write_run_files);
// returns its path. Throws RunFolderError.
std::string write_run_folder(const Results& results, const std::string& out_dir);

// Removes the temporaries of atomic writes (*.tmp.*) left in `dir`; returns how many.
int remove_temporaries(const std::string& dir);

}  // namespace mt
