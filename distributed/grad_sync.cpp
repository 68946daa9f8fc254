// The gradient synchroniser (see grad_sync.h).
#include "distributed/grad_sync.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace mt {
namespace {

// The longest one simulated collective may take (a day): see the link simulation below.
constexpr double kMaxSimulatedCollectiveSeconds = 86400;

using clock_type = std::chrono::steady_clock;

double ms_between(clock_type::time_point a, clock_type::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

size_t GradientBucket::piece_offset(int r) const {
    size_t off = offset;
    for (int i = 0; i < r; ++i) off += pieces[static_cast<size_t>(i)];
    return off;
}

std::vector<GradientBucket> plan_buckets(const std::vector<FlatRange>& ready_order,
                                         double bucket_bytes, int world) {
    if (world < 1) throw std::invalid_argument("plan_buckets: world must be >= 1");
    std::vector<GradientBucket> out;
    size_t lo = 0, hi = 0;
    bool open = false;
    auto close = [&] {
        GradientBucket b;
        b.offset = lo;
        b.count = hi - lo;
        const size_t q = (b.count + static_cast<size_t>(world) - 1) / static_cast<size_t>(world);
        size_t left = b.count;
        for (int r = 0; r < world; ++r) {
            const size_t c = std::min(q, left);
            b.pieces.push_back(c);
            left -= c;
        }
        out.push_back(std::move(b));
        open = false;
    };
    for (const FlatRange& r : ready_order) {
        if (r.count == 0) continue;
        if (!open) {
            lo = r.offset;
            hi = r.offset + r.count;
            open = true;
        } else if (r.offset + r.count == lo) {
            lo = r.offset;  // backward walks the buffer from its end to its start
        } else if (r.offset == hi) {
            hi = r.offset + r.count;
        } else {
            throw std::logic_error("plan_buckets: gradient ranges are not adjacent");
        }
        if (static_cast<double>(hi - lo) * sizeof(float) >= bucket_bytes) close();
    }
    if (open) close();
    return out;
}

GradientSync::GradientSync(Collectives& collectives, const GradientSyncOptions& options,
                           const std::vector<FlatRange>& ready_order)
    : coll_(collectives), config_(options), world_(collectives.size()), rank_(collectives.rank()) {
    buckets_ = plan_buckets(ready_order, config_.bucket_mb * 1024.0 * 1024.0, world_);
    // Which bucket each ready range falls in (buckets are contiguous, in ready order).
    for (const FlatRange& r : ready_order) {
        if (r.count == 0) continue;
        for (size_t b = 0; b < buckets_.size(); ++b)
            if (r.offset >= buckets_[b].offset &&
                r.offset + r.count <= buckets_[b].offset + buckets_[b].count) {
                range_bucket_[r.offset] = b;
                break;
            }
    }
    ranges_left_.assign(buckets_.size(), 0);
    issued_.assign(buckets_.size(), false);
    coll_.reserve_slots(buckets_.size() * 2);
    thread_ = std::thread([this] { worker(); });
}

GradientSync::~GradientSync() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
}

std::vector<FlatRange> GradientSync::owned_ranges() const {
    std::vector<FlatRange> out;
    for (const GradientBucket& b : buckets_) {
        const size_t c = b.pieces[static_cast<size_t>(rank_)];
        if (c) out.push_back({b.piece_offset(rank_), c});
    }
    std::sort(out.begin(), out.end(),
              [](const FlatRange& a, const FlatRange& b) { return a.offset < b.offset; });
    return out;
}

std::vector<FlatRange> GradientSync::all_pieces() const {
    std::vector<FlatRange> out;
    for (const GradientBucket& b : buckets_)
        for (int r = 0; r < world_; ++r) out.push_back({b.piece_offset(r), b.pieces[r]});
    return out;
}

void GradientSync::arm(float* grads) {
    grads_ = grads;
    armed_ = true;
    std::fill(ranges_left_.begin(), ranges_left_.end(), 0);
    for (const auto& [offset, b] : range_bucket_) ++ranges_left_[b];
    std::fill(issued_.begin(), issued_.end(), false);
}

void GradientSync::gradients_ready(size_t offset, size_t count) {
    if (!armed_ || count == 0) return;
    const auto it = range_bucket_.find(offset);
    if (it == range_bucket_.end())
        throw std::logic_error("GradientSync: a gradient range the plan does not know");
    if (--ranges_left_[it->second] == 0 && config_.overlap) {
        issue(it->second);
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.buckets_issued_in_backward;
    }
}

void GradientSync::end_backward() {
    if (!armed_) return;
    for (size_t b = 0; b < buckets_.size(); ++b)
        if (!issued_[b]) issue(b);
    armed_ = false;
}

void GradientSync::issue(size_t bucket) {
    issued_[bucket] = true;
    coll_.fence(bucket);  // the kernels that produced this bucket's gradients come first
    issue_job({config_.zero == 1 ? JobKind::reduce_scatter : JobKind::all_reduce, bucket, grads_,
               clock_type::now()});
}

void GradientSync::issue_job(Job job) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        queue_.push_back(job);
        ++jobs_issued_;
    }
    cv_.notify_all();
}

void GradientSync::wait_gradients() {
    wait_all_issued("the gradient reduction");
}

void GradientSync::gather_params(float* params) {
    for (size_t b = 0; b < buckets_.size(); ++b) {
        coll_.fence(buckets_.size() + b);  // after the optimizer's update of this rank's pieces
        issue_job({JobKind::all_gather, b, params, clock_type::now()});
    }
    wait_all_issued("the parameter all-gather (ZeRO-1)");
}

void GradientSync::wait_all_issued(const char* what) {
    std::unique_lock<std::mutex> lock(mu_);
    const auto deadline = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                                  std::chrono::duration<double>(config_.timeout_s));
    const bool done =
        cv_.wait_until(lock, deadline, [&] { return error_ || jobs_done_ == jobs_issued_; });
    if (error_) std::rethrow_exception(error_);
    if (!done) {
        char t[32];
        std::snprintf(t, sizeof t, "%g", config_.timeout_s);
        throw CommError("rank " + std::to_string(rank_) + " of " + std::to_string(world_) + ": " +
                        what + " did not complete within " + t +
                        " s (dist.timeout_s): another rank has died, hangs, or is at a different "
                        "place of the program (see its output above)");
    }
}

GradientSync::StepStats GradientSync::take_step_stats() {
    std::lock_guard<std::mutex> lock(mu_);
    const StepStats s = stats_;
    stats_ = {};
    return s;
}

// The synchroniser's thread: runs the queued collectives in order, one at a time, as a link does.
void GradientSync::worker() {
    for (;;) {
        Job job;
        {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
            if (stop_ && queue_.empty()) return;
            job = queue_.front();
            queue_.pop_front();
        }
        try {
            run_job(job);
        } catch (...) {
            std::lock_guard<std::mutex> lock(mu_);
            if (!error_) error_ = std::current_exception();
        }
        {
            std::lock_guard<std::mutex> lock(mu_);
            ++jobs_done_;
        }
        cv_.notify_all();
    }
}

void GradientSync::run_job(const Job& job) {
    const GradientBucket& b = buckets_[job.bucket];
    float* base = job.buf + b.offset;
    // The link is free from max(issue time, end of the previous collective).
    const auto start = std::max(job.issued, link_free_);
    const double n = static_cast<double>(b.count) * sizeof(float);
    const double ring = static_cast<double>(world_ - 1) / world_;
    double bytes = 0;
    switch (job.kind) {
        case JobKind::all_reduce:
            coll_.reduce_scatter_sum(base, b.pieces, job.bucket);
            coll_.all_gather(base, b.pieces, job.bucket);
            bytes = 2 * ring * n;
            break;
        case JobKind::reduce_scatter:
            coll_.reduce_scatter_sum(base, b.pieces, job.bucket);
            bytes = ring * n;
            break;
        case JobKind::all_gather:
            coll_.all_gather(base, b.pieces, buckets_.size() + job.bucket);
            bytes = ring * n;
            break;
    }
    coll_.wait();
    auto end = clock_type::now();
    if (config_.simulate_link_gbps > 0 || config_.simulate_latency_us > 0) {
        // SIMULATED link: the collective takes at least latency + bytes / bandwidth.
        double s = config_.simulate_latency_us * 1e-6;
        if (config_.simulate_link_gbps > 0) s += bytes * 8.0 / (config_.simulate_link_gbps * 1e9);
        // In double seconds, capped before it becomes the clock's int64 nanoseconds: a duration
        // past 292 years would wrap (a negative one: no delay at all). The experiment key is
        // bounded far below this (engine/run_config.h); the cap keeps other callers safe.
        s = std::min(s, kMaxSimulatedCollectiveSeconds);
        const auto sim_end = start + std::chrono::duration_cast<clock_type::duration>(
                                         std::chrono::duration<double>(s));
        if (sim_end > end) {
            std::this_thread::sleep_until(sim_end);
            end = std::max(sim_end, clock_type::now());
        }
    }
    link_free_ = end;
    std::lock_guard<std::mutex> lock(mu_);
    stats_.busy_ms += ms_between(start, end);
    stats_.bytes += bytes;
}

void GradientSync::set_simulated_link_gbps(double gbps) {
    // Under the queue's lock: the worker reads config_ only for a job it took under that lock.
    std::lock_guard<std::mutex> lock(mu_);
    config_.simulate_link_gbps = gbps;
}

}  // namespace mt
