// Nothing clobbered, nothing lost (issue #25): every writer of a user-named path refuses a target
// that is not a regular file (a FIFO, a device, a directory, a symbolic link) instead of renaming
// over it; every reader refuses one before it could block; the run directory of `train` is held
// by one process at a time.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <optional>
#include <string>

#include "engine/profile.h"
#include "io/atomic_file.h"
#include "io/directory_lock.h"
#include "io/regular_file.h"
#include "report/results.h"
#include "tests/test_util.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

std::string q(const std::string& s) {
    return "'" + s + "'";
}

std::string test_data(const std::string& name) {
    return std::string(MT_TEST_DATA_DIR) + "/" + name;
}

std::string make_fifo(const TempDir& d, const std::string& name = "fifo") {
    const std::string p = d.file(name);
    if (::mkfifo(p.c_str(), 0644) != 0) throw std::runtime_error("mkfifo failed: " + p);
    return p;
}

std::string slurp(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
}

// Runs `call` and returns whether it finished within 10 s. A call blocked opening the FIFO
// `fifo` is released (a writer opens it and closes it) so the test fails instead of hanging.
bool finishes_without_blocking(const std::function<void()>& call, const std::string& fifo) {
    auto done = std::async(std::launch::async, call);
    if (done.wait_for(std::chrono::seconds(10)) == std::future_status::ready) {
        done.get();
        return true;
    }
    const int fd = ::open(fifo.c_str(), O_WRONLY);
    if (fd >= 0) ::close(fd);
    done.wait();
    return false;
}

// ---- writers --------------------------------------------------------------------------------

TEST(AtomicFile, RefusesATargetThatIsAFifo) {
    TempDir d("mt_files");
    const std::string fifo = make_fifo(d);
    try {
        write_file_atomic(fifo, "data");
        FAIL() << "a FIFO was replaced by a regular file";
    } catch (const FileKindError& e) {
        EXPECT_CONTAINS(e.what(), fifo + ": cannot write: it is a FIFO (named pipe)");
    }
    struct stat st {};
    ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
    EXPECT_TRUE(S_ISFIFO(st.st_mode));
    EXPECT_EQ(fs::directory_iterator(d.path())->path().filename(), "fifo");  // no temporary left
}

TEST(AtomicFile, RefusesATargetThatIsACharacterDevice) {
    TempDir d("mt_files");
    const std::string dev = d.file("null");
    if (::mknod(dev.c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0)
        GTEST_SKIP() << "mknod needs root";
    EXPECT_THROW(write_file_atomic(dev, "data"), FileKindError);
    struct stat st {};
    ASSERT_EQ(::lstat(dev.c_str(), &st), 0);
    EXPECT_TRUE(S_ISCHR(st.st_mode));
}

TEST(AtomicFile, RefusesADirectoryTarget) {
    TempDir d("mt_files");
    fs::create_directory(d.file("dir"));
    try {
        write_file_atomic(d.file("dir"), "data");
        FAIL() << "no error";
    } catch (const FileKindError& e) {
        EXPECT_CONTAINS(e.what(), "it is a directory, not a regular file");
    }
}

// The policy (docs/commands.md): a symbolic link is refused, even to a regular file, so a link
// planted in a run folder cannot make microtrain replace a file outside it.
TEST(AtomicFile, RefusesASymbolicLinkAndLeavesItsTargetAlone) {
    TempDir d("mt_files");
    const std::string target = d.file("target.txt"), link = d.file("link.txt");
    write_file_atomic(target, "original");
    fs::create_symlink(target, link);
    try {
        write_file_atomic(link, "new");
        FAIL() << "wrote through a symbolic link";
    } catch (const FileKindError& e) {
        EXPECT_CONTAINS(e.what(), link + ": cannot write: it is a symbolic link");
    }
    EXPECT_TRUE(fs::is_symlink(link));
    EXPECT_EQ(slurp(target), "original");
}

TEST(AtomicFile, ReplacesARegularFile) {
    TempDir d("mt_files");
    write_file_atomic(d.file("a"), "one");
    write_file_atomic(d.file("a"), "two");
    EXPECT_EQ(slurp(d.file("a")), "two");
}

TEST(AppendFile, RefusesAFifoAndASymbolicLinkWithoutBlocking) {
    TempDir d("mt_files");
    const std::string fifo = make_fifo(d);
    EXPECT_THROW(open_regular_for_append(fifo), FileKindError);
    write_file_atomic(d.file("t"), "x");
    fs::create_symlink(d.file("t"), d.file("l"));
    EXPECT_THROW(open_regular_for_append(d.file("l")), FileKindError);
    const int fd = open_regular_for_append(d.file("new"));
    EXPECT_GE(fd, 0);
    ::close(fd);
}

TEST(StepCli, OutThatIsADeviceIsRefusedAndLeftInPlace) {
    TempDir d("mt_files");
    const std::string fifo = make_fifo(d, "out");
    CliResult r = run_microtrain("step --weights " + q(test_data("tiny_weights.safetensors")) +
                                 " --batch " + q(test_data("tiny_batch.safetensors")) + " --out " +
                                 q(fifo) + " --threads 1");
    EXPECT_NE(r.rc, 0) << r.output;
    EXPECT_CONTAINS(r.output, fifo + ": cannot write: it is a FIFO (named pipe)");
    struct stat st {};
    ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
    EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

TEST(ExportCli, MergedAndAdaptersOutputsThatAreNotRegularFilesAreRefused) {
    TempDir d("mt_files");
    const std::string fifo = make_fifo(d, "merged.safetensors");
    write_file_atomic(d.file("target.safetensors"), "original");
    fs::create_symlink(d.file("target.safetensors"), d.file("adapters.safetensors"));
    const std::string ckpt = q(test_data("tiny_lora_weights.safetensors"));
    CliResult r = run_microtrain("export " + ckpt + " --merged " + q(fifo));
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_CONTAINS(r.output, fifo + ": cannot write: it is a FIFO (named pipe)");
    r = run_microtrain("export " + ckpt + " --adapters " + q(d.file("adapters.safetensors")));
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_CONTAINS(r.output, "adapters.safetensors: cannot write: it is a symbolic link");
    EXPECT_EQ(slurp(d.file("target.safetensors")), "original");
}

// ---- the run directory lock -------------------------------------------------------------------

TEST(DirectoryLock, ASecondHolderIsRefusedNamingTheFirstsPidUntilItIsReleased) {
    TempDir d("mt_files");
    {
        const DirectoryLock first(d.path().string());
        try {
            const DirectoryLock second(d.path().string());
            FAIL() << "two holders of one directory";
        } catch (const DirectoryLockedError& e) {
            EXPECT_CONTAINS(e.what(), d.path().string() +
                                          ": is in use by another microtrain process (PID " +
                                          std::to_string(::getpid()) + ")");
        }
    }
    EXPECT_NO_THROW(DirectoryLock again(d.path().string()));
}

// ---- readers --------------------------------------------------------------------------------

TEST(ReadableFile, RefusesAFifoWithoutBlocking) {
    TempDir d("mt_files");
    const std::string fifo = make_fifo(d);
    std::string error;
    ASSERT_TRUE(finishes_without_blocking([&] { error = ReadableFile(fifo).error(); }, fifo));
    EXPECT_EQ(error, "is a FIFO (named pipe), not a regular file");
    EXPECT_THROW(read_regular_file(fifo, 100), FileKindError);
}

TEST(ReadableFile, ReadsARegularFileAndRefusesOneOverTheLimit) {
    TempDir d("mt_files");
    write_file_atomic(d.file("a"), "hello");
    EXPECT_EQ(read_regular_file(d.file("a"), 5), "hello");
    EXPECT_THROW(read_regular_file(d.file("a"), 4), FileKindError);
    EXPECT_EQ(ReadableFile(d.file("missing")).error(), "cannot open: No such file or directory");
}

TEST(CompareCli, AFifoAsResultsIsRefusedWithoutBlocking) {
    TempDir d("mt_files");
    const std::string fifo = make_fifo(d);
    bool refused = false;
    ASSERT_TRUE(finishes_without_blocking(
        [&] {
            try {
                (void)read_results(fifo);
            } catch (const ReportError& e) {
                refused = std::string(e.what()).find("FIFO") != std::string::npos;
            }
        },
        fifo));
    EXPECT_TRUE(refused);
    CliResult r = run_microtrain("compare " + q(fifo) + " " + q(fifo));
    EXPECT_EQ(r.rc, 2) << r.output;
    EXPECT_CONTAINS(r.output, "is a FIFO (named pipe), not a regular file");
}

// A FIFO as the peak cache blocked `run` in its open (deaf to SIGTERM); it is ignored with a
// warning, like a damaged cache, and the peaks are measured again.
TEST(PeakCache, AFifoAsTheCacheIsIgnoredWithoutBlocking) {
    TempDir d("mt_files");
    ::setenv("MICROTRAIN_CACHE_DIR", d.path().c_str(), 1);
    const std::string fifo = make_fifo(d, "cpu_peaks.json");
    std::optional<double> peak = 1.0;
    ASSERT_TRUE(finishes_without_blocking(
        [&] { peak = peak_flops("CPU: a test device", Precision::fp32); }, fifo));
    EXPECT_FALSE(peak.has_value());
    ::unsetenv("MICROTRAIN_CACHE_DIR");
}

}  // namespace
}  // namespace mt
