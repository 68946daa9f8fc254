// The run folder (see run_folder.h).
#include "report/run_folder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <utility>
#include <vector>

#include "io/atomic_file.h"
#include "report/render.h"
#include "report/results.h"
#include "report/step_files.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

std::string now_stamp(const char* format, bool utc) {
    std::time_t t = std::time(nullptr);
    std::tm tm{};
    if (utc)
        gmtime_r(&t, &tm);
    else
        localtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, format, &tm);
    return buf;
}

[[noreturn]] void fail(const std::string& what, const std::string& path, int err) {
    throw RunFolderError("cannot " + what + " '" + path + "': " + std::strerror(err) +
                         " (choose a writable directory with --out-dir or report.out_dir)");
}

std::string folder_base_name(const std::string& name) {
    std::string n = name.empty() ? std::string("experiment") : name;
    for (char& c : n)
        if (c == '/' || c == '\\' || c == ' ') c = '_';
    return n + "-" + now_stamp("%Y%m%d-%H%M%S", false);
}

// mkdir that never reuses an existing folder: on EEXIST the next suffix.
std::string make_exclusive_dir(const fs::path& out_dir, const std::string& base) {
    for (int i = 1; i < 10000; ++i) {
        const fs::path dir = out_dir / (i == 1 ? base : base + "-" + std::to_string(i));
        if (::mkdir(dir.c_str(), 0755) == 0) return dir.string();
        if (errno != EEXIST) fail("create the run folder", dir.string(), errno);
    }
    throw RunFolderError("cannot create a run folder under '" + out_dir.string() + "': " + base +
                         "-2 .. -9999 all exist; clean up old runs");
}

// `started`: the run's start (UTC); `holds`: what results.json holds so far ("" before the first
// variant finished).
std::string in_progress_text(const std::string& started, const std::string& holds = "") {
    return "microtrain run: this run folder is INCOMPLETE.\n"
           "Started " +
           started + " by process " + std::to_string(::getpid()) +
           ". This file is removed once results.json, steps.csv, trace.json, report.md and\n"
           "report.html are all written; while it is here the run is still going, or it was "
           "killed\n(SIGKILL, power loss) before its report was written.\n" +
           holds;
}

struct FileToWrite {
    const char* name;
    std::function<std::string()> render;
};

std::string partial_text(const std::vector<std::string>& written,
                         const std::vector<std::pair<std::string, std::string>>& missing) {
    std::string t =
        "microtrain run: this run folder is PARTIAL: some files could not be written.\n";
    t += "Written (complete):";
    for (const auto& w : written) t += " " + w;
    t += written.empty() ? " none\n" : "\n";
    t += "Missing:\n";
    for (const auto& [name, why] : missing) t += "  " + name + ": " + why + "\n";
    t += "Free space (or fix the error above); results.json, when written, holds every "
         "measurement\n(`microtrain compare` reads it).\n";
    return t;
}

// What the marker says when even a PARTIAL marker could not be written (a full disk). It is
// shorter than in_progress_text() so it overwrites that file in place, in blocks the file
// already has: no new block is needed, so a full disk cannot keep the folder saying "still going"
// about a run that has ended.
constexpr const char* kPartialInPlaceText =
    "microtrain run: this run folder is PARTIAL: its report files could not all be written\n"
    "(the disk was full, or another write error: the run printed which files are missing).\n"
    "A results.json here is whole (each file is written atomically).\n";

void overwrite_marker_in_place(const std::string& marker) {
    const int fd = ::open(marker.c_str(), O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return;  // nothing more can be done: the error the run prints names the cause
    const std::string text = kPartialInPlaceText;
    if (::pwrite(fd, text.data(), text.size(), 0) == static_cast<ssize_t>(text.size()) &&
        ::ftruncate(fd, static_cast<off_t>(text.size())) == 0)
        ::fsync(fd);
    ::close(fd);
}

}  // namespace

std::string create_run_folder(const std::string& name, const std::string& out_dir) {
    const fs::path root = out_dir.empty() ? fs::path(".") : fs::path(out_dir);
    std::error_code ec;
    fs::create_directories(root, ec);
    if (ec) fail("create the output directory", root.string(), ec.value());
    if (!fs::is_directory(root, ec)) fail("use the output directory", root.string(), ENOTDIR);
    const std::string dir = make_exclusive_dir(root, folder_base_name(name));
    try {
        write_file_atomic((fs::path(dir) / kPartialMarker).string(),
                          in_progress_text(now_stamp("%Y-%m-%dT%H:%M:%SZ", true)));
    } catch (const std::exception& e) {
        ::rmdir(dir.c_str());  // nothing in it: leave no empty folder behind
        throw RunFolderError(std::string("cannot write in the run folder: ") + e.what() +
                             " (choose a writable directory with --out-dir or report.out_dir)");
    }
    return dir;
}

int remove_temporaries(const std::string& dir) {
    int n = 0;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
        const std::string f = entry.path().filename().string();
        if (f.find(".tmp.") != std::string::npos && fs::remove(entry.path(), ec)) ++n;
    }
    return n;
}

void write_finished_variants(const Results& so_far, const std::string& dir, size_t variants_total) {
    std::string names;
    for (const VariantResult& v : so_far.variants)
        names += (names.empty() ? "'" : ", '") + v.name + "' (" + to_string(v.status) + ")";
    const std::string holds = "results.json holds the " + std::to_string(so_far.variants.size()) +
                              " of " + std::to_string(variants_total) +
                              " variant(s) finished so far: " + names +
                              " (`microtrain compare` reads it).\n";
    try {
        write_file_atomic((fs::path(dir) / "results.json").string(),
                          results_to_json(so_far).dump(2) + "\n");
        write_file_atomic((fs::path(dir) / kPartialMarker).string(),
                          in_progress_text(so_far.started_utc, holds));
    } catch (const std::exception& e) {
        remove_temporaries(dir);
        throw RunFolderError("cannot write the finished variants to '" + dir + "': " + e.what());
    }
}

void write_run_files(const Results& results, const std::string& dir) {
    const std::vector<FileToWrite> files = {
        {"results.json", [&] { return results_to_json(results).dump(2) + "\n"; }},
        {"steps.csv", [&] { return steps_csv(results); }},
        {"trace.json", [&] { return trace_json(results).dump() + "\n"; }},
        {"report.md", [&] { return render_report_md(results); }},
        {"report.html", [&] { return render_report_html(results); }},
    };
    std::vector<std::string> written;
    std::vector<std::pair<std::string, std::string>> missing;
    for (const FileToWrite& f : files) {
        try {
            write_file_atomic((fs::path(dir) / f.name).string(), f.render());
            written.push_back(f.name);
        } catch (const std::exception& e) {
            missing.emplace_back(f.name, e.what());
        }
    }
    remove_temporaries(dir);
    const std::string marker = (fs::path(dir) / kPartialMarker).string();
    if (missing.empty()) {
        if (::unlink(marker.c_str()) != 0 && errno != ENOENT)
            throw RunFolderError("cannot remove '" + marker + "': " + std::strerror(errno));
        return;
    }
    try {
        write_file_atomic(marker, partial_text(written, missing));
    } catch (const std::exception&) {
        // No room for a new file: the in-progress marker written at the start would stay,
        // saying the run is still going. Overwritten in place, it says PARTIAL.
        overwrite_marker_in_place(marker);
    }
    remove_temporaries(dir);
    std::string what;
    for (const auto& [name, why] : missing) what += (what.empty() ? "" : "; ") + why;
    throw RunFolderError("the run folder '" + dir + "' is PARTIAL (see its " + kPartialMarker +
                         " file): " + what);
}

std::string write_run_folder(const Results& results, const std::string& out_dir) {
    // Created exclusively and marked PARTIAL until every file is written (report/run_folder.h).
    const std::string dir = create_run_folder(results.experiment.name, out_dir);
    write_run_files(results, dir);
    return dir;
}

}  // namespace mt
