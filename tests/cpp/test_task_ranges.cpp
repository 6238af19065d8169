// TaskRanges and parallel_tasks (cpu/isa/task_ranges.h): every task handed out exactly once, a
// part's own tasks in order from its front, the others' taken from their backs; under real
// threads racing for the same ranges too.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "cpu/isa/task_ranges.h"

namespace {

using attnlab::cpu::parallel_tasks;
using attnlab::cpu::TaskRanges;

TEST(TaskRanges, OnePartTakesItsOwnRangeInOrderThenStealsFromTheFullestBack) {
  TaskRanges ranges(10, 3);  // parts own [0, 3), [3, 6), [6, 10)
  std::vector<int64_t> taken;
  for (int64_t t = ranges.next(0); t >= 0; t = ranges.next(0)) taken.push_back(t);
  // Own 0, 1, 2; then the back of the fullest: part 2 (4 left) gives 9, then parts 1 and 2
  // tie at 3 (the first found, part 1, gives 5), and so on from the backs.
  ASSERT_EQ(taken.size(), 10u);
  EXPECT_EQ(std::vector<int64_t>(taken.begin(), taken.begin() + 4),
            (std::vector<int64_t>{0, 1, 2, 9}));
  std::vector<int64_t> sorted = taken;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(sorted[i], i);
  EXPECT_EQ(ranges.next(1), -1);
  EXPECT_EQ(ranges.next(2), -1);
}

TEST(TaskRanges, NoTasksAndMorePartsThanTasks) {
  TaskRanges none(0, 2);
  EXPECT_EQ(none.next(0), -1);
  EXPECT_EQ(none.next(1), -1);
  TaskRanges few(2, 4);  // parts 0 and 2 own nothing
  EXPECT_EQ(few.next(1), 0);
  EXPECT_EQ(few.next(1), 1);
  EXPECT_EQ(few.next(0), -1);
}

TEST(TaskRanges, RacingThreadsTakeEveryTaskExactlyOnce) {
  constexpr int64_t kTasks = 20000, kParts = 4;
  for (int trial = 0; trial < 5; ++trial) {
    TaskRanges ranges(kTasks, kParts);
    std::vector<std::atomic<int>> seen(kTasks);
    std::vector<std::thread> threads;
    for (int64_t part = 0; part < kParts; ++part) {
      threads.emplace_back([&, part] {
        // Part 0 is slow to start, so that the others steal from it.
        if (part == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        for (int64_t t = ranges.next(part); t >= 0; t = ranges.next(part)) seen[t]++;
      });
    }
    for (auto& t : threads) t.join();
    for (int64_t t = 0; t < kTasks; ++t) ASSERT_EQ(seen[t].load(), 1) << "task " << t;
  }
}

TEST(TaskRanges, ParallelTasksRunsEveryTaskOnce) {
  for (int64_t tasks : {0, 1, 7, 1000}) {
    std::vector<std::atomic<int>> seen(tasks);
    parallel_tasks(tasks, [&](const auto& next) {
      for (int64_t t = next(); t >= 0; t = next()) seen[t]++;
    });
    for (int64_t t = 0; t < tasks; ++t) EXPECT_EQ(seen[t].load(), 1) << tasks << " tasks, " << t;
  }
}

}  // namespace
