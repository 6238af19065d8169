// ThreadShares (cpu/isa/thread_shares.h): an even split until told otherwise, then shares that
// follow the parts' measured speeds; every part keeps at least one unit, and a call that
// measured nothing usable leaves the estimate alone.
#include <cmath>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "cpu/isa/thread_shares.h"

namespace {

using attnlab::cpu::ThreadShares;

// The parts' times when part i costs cost[i] seconds per unit.
std::vector<double> times(const std::vector<int64_t>& bounds, const std::vector<double>& cost) {
  std::vector<double> seconds;
  for (size_t i = 0; i + 1 < bounds.size(); ++i) {
    seconds.push_back(static_cast<double>(bounds[i + 1] - bounds[i]) * cost[i]);
  }
  return seconds;
}

TEST(ThreadShares, EvenUntilTold) {
  const ThreadShares shares;
  EXPECT_EQ(shares.split(64, 2), (std::vector<int64_t>{0, 32, 64}));
  EXPECT_EQ(shares.split(10, 3), (std::vector<int64_t>{0, 3, 7, 10}));
  EXPECT_EQ(shares.split(0, 1), (std::vector<int64_t>{0, 0}));
}

TEST(ThreadShares, FollowsASlowerThreadAndBack) {
  ThreadShares shares;
  // Part 1 runs at half part 0's speed: it should end up with a third of the units.
  for (int call = 0; call < 40; ++call) {
    const auto bounds = shares.split(96, 2);
    shares.update(bounds, times(bounds, {1e-3, 2e-3}).data());
  }
  auto bounds = shares.split(96, 2);
  EXPECT_NEAR(static_cast<double>(bounds[1]), 64.0, 1.0);
  // Once both run at the same speed again, the split returns to even.
  for (int call = 0; call < 40; ++call) {
    bounds = shares.split(96, 2);
    shares.update(bounds, times(bounds, {1e-3, 1e-3}).data());
  }
  EXPECT_NEAR(static_cast<double>(shares.split(96, 2)[1]), 48.0, 1.0);
}

TEST(ThreadShares, OneSlowCallMovesTheSplitOnlyPartWay) {
  ThreadShares shares;
  auto bounds = shares.split(100, 2);
  shares.update(bounds, times(bounds, {1e-3, 4e-3}).data());  // part 1 preempted once
  bounds = shares.split(100, 2);
  EXPECT_GT(bounds[1], 50);
  EXPECT_LT(bounds[1], 65);  // a quarter of the way towards 80
}

TEST(ThreadShares, EveryPartKeepsAUnitAndStarvedPartsAreBounded) {
  ThreadShares shares;
  for (int call = 0; call < 100; ++call) {
    const auto bounds = shares.split(1000, 3);
    shares.update(bounds, times(bounds, {1e-3, 1.0, 1e-3}).data());  // part 1 1000× slower
  }
  auto bounds = shares.split(1000, 3);
  // Relative speeds 1.5, 0.2 (the bound), 1.5: part 1 keeps 0.2 / 3.2 of the units.
  EXPECT_GE(bounds[2] - bounds[1], 60);
  bounds = shares.split(3, 3);
  EXPECT_EQ(bounds, (std::vector<int64_t>{0, 1, 2, 3}));
}

TEST(ThreadShares, CallsWithoutUsableTimesChangeNothing) {
  ThreadShares shares;
  auto bounds = shares.split(100, 2);
  shares.update(bounds, times(bounds, {1e-3, 3e-3}).data());
  const auto before = shares.split(100, 2);
  const std::vector<double> zero{0.0, 1e-3}, nan{1e-3, std::nan("")};
  shares.update(before, zero.data());
  shares.update(before, nan.data());
  shares.update({0, 0, 100}, times({0, 0, 100}, {1e-3, 1e-3}).data());  // part 0 got nothing
  shares.update({0, 100}, times({0, 100}, {1e-3}).data());             // one part
  EXPECT_EQ(shares.split(100, 2), before);
}

TEST(ThreadShares, APartCountChangeStartsAfresh) {
  ThreadShares shares;
  for (int call = 0; call < 20; ++call) {
    const auto bounds = shares.split(90, 2);
    shares.update(bounds, times(bounds, {1e-3, 2e-3}).data());
  }
  // Three parts have no estimate yet: even.
  EXPECT_EQ(shares.split(90, 3), (std::vector<int64_t>{0, 30, 60, 90}));
  auto bounds = shares.split(90, 3);
  shares.update(bounds, times(bounds, {1e-3, 1e-3, 1e-3}).data());
  EXPECT_EQ(shares.split(90, 3), (std::vector<int64_t>{0, 30, 60, 90}));
}

}  // namespace
