// The gradient synchroniser of data parallel: after backward, every rank must hold the sum of
// all ranks' gradients (each already scaled by 1/world, so the sum is the gradient of the mean
// over the global batch). It is written once against kernels/collectives.h (MPI on the CPU,
// NCCL on CUDA).
//
// Buckets. Backward finishes the parameter gradients in a fixed order of ranges of the flat
// gradient buffer (GPT::gradient_ready_order: ln_f, block L-1, ..., block 0, then wte and wpe,
// whose gradient the encoder backward completes last). Consecutive ranges are grouped into
// buckets of about dist.bucket_mb; each bucket is one contiguous range, cut into one piece per
// rank (piece r = the r-th ceil(count/N) elements).
//
// ZeRO stage 0: a bucket is all-reduced as reduce_scatter_sum + all_gather of its pieces.
// ZeRO stage 1: only reduce_scatter_sum; rank r keeps the sum of its pieces, updates those
// parameters (its AdamW state is only theirs) and gather_params() all-gathers the parameters.
// Both stages sum every element in the same order, so their parameters are bitwise equal.
//
// Overlap. dist.overlap: true issues a bucket as soon as backward has produced all of it
// (gradients_ready, called by the model's hook), so its reduction runs on the synchroniser's
// thread while backward computes the next layers; false issues every bucket at end_backward().
// Either way wait_gradients() blocks until all are reduced: the `comm` phase, the exposed wait.
//
// Simulated link (dist.simulate_link_gbps / simulate_latency_us, clearly labelled in reports):
// the link is one queue; a collective that starts at t (when issued, or when the previous one
// ends) ends no earlier than t + latency + bytes_sent / bandwidth, so a comm-bound step can be
// studied on one machine. Bytes sent per rank follow the ring algorithm: (N-1)/N of the buffer
// for a reduce-scatter or an all-gather, twice that for an all-reduce.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "kernels/collectives.h"

namespace mt {

// The dist.* keys the synchroniser reads (engine/run_config.h DistConfig holds them).
struct GradientSyncOptions {
    double bucket_mb = 25;
    bool overlap = true;
    int zero = 0;
    double simulate_link_gbps = 0, simulate_latency_us = 0;
    double timeout_s = 120;
};

struct FlatRange {
    size_t offset = 0, count = 0;  // [offset, offset + count) of the flat parameter buffers
};

struct GradientBucket {
    size_t offset = 0, count = 0;
    std::vector<size_t> pieces;        // per rank: piece r's element count
    size_t piece_offset(int r) const;  // absolute offset of piece r
};

// Groups `ready_order` (ranges in the order backward completes them) into buckets of at least
// bucket_bytes (the last may be smaller); a bucket never splits a range. Consecutive ranges
// must be adjacent (each ends where the next begins, or begins where the next ends).
std::vector<GradientBucket> plan_buckets(const std::vector<FlatRange>& ready_order,
                                         double bucket_bytes, int world);

class GradientSync {
  public:
    GradientSync(Collectives& collectives, const GradientSyncOptions& options,
                 const std::vector<FlatRange>& ready_order);
    ~GradientSync();
    GradientSync(const GradientSync&) = delete;
    GradientSync& operator=(const GradientSync&) = delete;

    const std::vector<GradientBucket>& buckets() const { return buckets_; }
    // The ranges backward completes gradients in (a bucket never splits one): the most buckets
    // any dist.bucket_mb can give.
    size_t ready_ranges() const { return range_bucket_.size(); }
    int world() const { return world_; }
    int rank() const { return rank_; }
    // This rank's piece of every bucket, by ascending offset: the parameters it updates under
    // ZeRO-1.
    std::vector<FlatRange> owned_ranges() const;
    // Every rank's piece of every bucket, bucket by bucket, rank by rank: the order in which
    // the gradient norm's partial sums are added (the same on every rank and in both stages).
    std::vector<FlatRange> all_pieces() const;

    // One step: arm() before the last micro-step's backward (only its gradients are final),
    // gradients_ready() from the model's hook, end_backward() after it, wait_gradients() in the
    // comm phase; under ZeRO-1 gather_params() after the optimizer.
    void arm(float* grads);
    void gradients_ready(size_t offset, size_t count);
    void end_backward();
    void wait_gradients();
    void gather_params(float* params);

    struct StepStats {
        double busy_ms = 0;  // the link was busy (collectives running, incl. simulated time)
        double bytes = 0;    // bytes this rank sent
        // Buckets issued from gradients_ready(), i.e. while backward still ran (dist.overlap:
        // true issues every bucket there; false none). Whether their reduction then hides
        // under backward's compute is a matter of time, measured by comm_busy_ms - comm.
        int buckets_issued_in_backward = 0;
    };
    // This step's totals, reset for the next step. Call after the last wait of the step.
    StepStats take_step_stats();
    // Sets the simulated link's bandwidth (Gbit/s; 0: off) from the next collective on: between
    // steps (dist.simulate_link_ratio: calibrated after the warm-up, experiment/runner.cpp).
    void set_simulated_link_gbps(double gbps);

  private:
    enum class JobKind { all_reduce, reduce_scatter, all_gather };
    struct Job {
        JobKind kind;
        size_t bucket;
        float* buf;  // the flat buffer (bucket offsets are absolute)
        std::chrono::steady_clock::time_point issued;
    };
    void issue(size_t bucket);
    void issue_job(Job job);
    void wait_all_issued(const char* what);
    void worker();
    void run_job(const Job& job);

    Collectives& coll_;
    GradientSyncOptions config_;
    int world_, rank_;
    std::vector<GradientBucket> buckets_;
    std::map<size_t, size_t> range_bucket_;  // a ready range's offset -> its bucket
    std::vector<size_t> ranges_left_;        // per bucket, ranges not yet ready this step
    std::vector<bool> issued_;
    float* grads_ = nullptr;
    bool armed_ = false;

    std::thread thread_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Job> queue_;
    size_t jobs_issued_ = 0, jobs_done_ = 0;
    bool stop_ = false;
    std::exception_ptr error_;
    std::chrono::steady_clock::time_point link_free_{};
    StepStats stats_;
};

}  // namespace mt
