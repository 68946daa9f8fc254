// The divergence rule (engine/divergence.h): a finite loss far above max(ln V, the first loss)
// and rising, or a gradient norm a thousandfold the first, flags the step it happens at, once;
// a healthy run, a spike it came back from, and a run without clipping's gradient norm do not.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "engine/divergence.h"

namespace mt {
namespace {

constexpr int kVocab = 256;  // ln V = 5.545

TEST(Divergence, FlagsALossFarAboveLnVThatKeepsRisingAtItsStep) {
    // The issue's `train` at lr 10: 5.3 -> 320.
    DivergenceWatch w(kVocab);
    EXPECT_FALSE(w.observe(0, 5.3, 0));
    EXPECT_FALSE(w.observe(1, 9.0, 0));  // above ln V, below 2 x ln V
    const std::optional<Divergence> d = w.observe(2, 40.0, 0);
    ASSERT_TRUE(d);
    EXPECT_EQ(d->step, 2);
    EXPECT_NE(d->reason.find("loss 40"), std::string::npos) << d->reason;
    EXPECT_NE(d->reason.find("ln V = 5.545"), std::string::npos) << d->reason;
    EXPECT_NE(d->reason.find("optim.lr"), std::string::npos) << d->reason;
    // Flagged once: later steps return nothing, found() keeps the first.
    EXPECT_FALSE(w.observe(3, 320.0, 0));
    ASSERT_TRUE(w.found());
    EXPECT_EQ(w.found()->step, 2);
    EXPECT_EQ(divergence_warning(*w.found()).rfind("diverged at step 2: ", 0), 0u);
}

TEST(Divergence, FlagsAHugeFiniteLoss) {
    DivergenceWatch w(kVocab);
    w.observe(0, 5.5, 0);
    const std::optional<Divergence> d = w.observe(1, 1.7e15, 0);
    ASSERT_TRUE(d);
    EXPECT_EQ(d->step, 1);
}

TEST(Divergence, LeavesAHealthyRunAndASpikeThatFallsAlone) {
    DivergenceWatch w(kVocab);
    double loss = 5.6;
    for (int s = 0; s < 50; ++s, loss *= 0.97) EXPECT_FALSE(w.observe(s, loss, 0.5)) << s;
    // Above 2 x ln V but falling from the step before: not rising, so not flagged.
    DivergenceWatch spike(kVocab);
    spike.observe(0, 12.0, 0);
    EXPECT_FALSE(spike.observe(1, 11.5, 0));
    EXPECT_FALSE(spike.observe(2, 11.0, 0));
    EXPECT_FALSE(spike.found());
}

TEST(Divergence, MeasuresFromTheFirstLossWhenItIsAboveLnV) {
    // A bad start at 20 (above ln V): 2 x 20 = 40 is the limit, so 30 and rising is not flagged.
    DivergenceWatch w(kVocab);
    w.observe(0, 20.0, 0);
    EXPECT_FALSE(w.observe(1, 30.0, 0));
    ASSERT_TRUE(w.observe(2, 41.0, 0));
}

TEST(Divergence, FlagsAGradNormThousandfoldTheFirst) {
    DivergenceWatch w(kVocab);
    w.observe(0, 5.5, 2.0);
    EXPECT_FALSE(w.observe(1, 5.4, 1999.0));
    const std::optional<Divergence> d = w.observe(2, 5.4, 2001.0);
    ASSERT_TRUE(d);
    EXPECT_EQ(d->step, 2);
    EXPECT_NE(d->reason.find("gradient norm"), std::string::npos) << d->reason;
}

TEST(Divergence, IgnoresNonFiniteValuesAndAbsentGradNorms) {
    DivergenceWatch w(kVocab);
    EXPECT_FALSE(w.observe(0, std::numeric_limits<double>::quiet_NaN(), 0));
    w.observe(1, 5.5, 0);  // the first finite loss is the start
    EXPECT_FALSE(w.observe(2, 5.4, 0));
    EXPECT_FALSE(w.observe(3, 5.3, std::numeric_limits<double>::infinity()));
    EXPECT_FALSE(w.found());
}

}  // namespace
}  // namespace mt
