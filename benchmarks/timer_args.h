#pragma once
// Command-line handling shared by the standalone kernel timers (small_kernel_cpu.cpp,
// blocked_kernel_cpu.cpp): a bad argument prints what was wrong and the program's usage line,
// and exits with status 2.
#include <cstdio>
#include <cstdlib>
#include <string>

namespace timer_args {

// "program: why", then "usage: program options", on stderr; exit status 2.
[[noreturn]] inline void fail(const char* program, const char* options, const std::string& why) {
  std::fprintf(stderr, "%s: %s\nusage: %s %s\n", program, why.c_str(), program, options);
  std::exit(2);
}

// The integer in 1..most after the flag argv[i] (i then points at it).
inline long positive(int& i, int argc, char** argv, long most, const char* program,
                     const char* options) {
  if (i + 1 >= argc) fail(program, options, std::string(argv[i]) + " needs a value");
  char* end = nullptr;
  const long v = std::strtol(argv[++i], &end, 10);
  if (*end != '\0' || v < 1 || v > most) {
    fail(program, options,
         std::string(argv[i - 1]) + " must be an integer in 1.." + std::to_string(most));
  }
  return v;
}

}  // namespace timer_args
