#include "cpu/isa/isa.h"

#include <cstdlib>
#include <cstring>
#include <iostream>

namespace attnlab::cpu {

bool cpu_isa_capped_at_avx2() {
#ifdef ATTNLAB_CPU_AVX2_ONLY
  return true;  // built as an AVX2-only CPU runs (cpu/isa/isa.h)
#else
  static const bool capped = [] {
    const char* value = std::getenv("ATTNLAB_CPU_ISA");
    if (value == nullptr || *value == '\0' || std::strcmp(value, "native") == 0) return false;
    if (std::strcmp(value, "avx2") == 0) return true;
    std::cerr << "attnlab: ATTNLAB_CPU_ISA=" << value
              << " is not understood (expected avx2 or native); ignored\n";
    return false;
  }();
  return capped;
#endif
}

}  // namespace attnlab::cpu
